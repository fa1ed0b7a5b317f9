"""``write.format("metaq")`` and ``writeStream.format("metaq")``: rows sent as messages.

Each task sends its partition through a producer of its own, in batches per queue, and
fails (so Spark retries it) when a send fails. Message ids come from (write id, partition,
batch id, row number), so the retried task's rows are dropped by the brokers' de-dup
window (:mod:`metaq.spark.sink`). A batch write's id is made on the driver once per
write; a stream's is its query id, which survives restarts from the checkpoint, and the
micro-batch id, which Spark replays unchanged after a failure.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import uvloop
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from metaq.client.producer import Producer
from metaq.spark import plan
from metaq.spark.options import SinkOptions
from metaq.spark.sink import RowSender, WriteStats, check_schema, id_prefix

log = logging.getLogger(__name__)


@dataclass
class TaskWritten(WriterCommitMessage):
    partition: int
    rows: int
    acknowledged: int


def write_partition(
    options: SinkOptions, write_id: str, batch_id: int, batches: Iterator[pa.RecordBatch]
) -> TaskWritten:
    """Send every row of this task's Arrow batches; raise when a send fails."""
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    prefix = id_prefix(write_id, partition, batch_id)

    async def go() -> WriteStats:
        producer = Producer(
            list(options.nameservers),
            group=options.producer_group,
            send_timeout_s=options.request_timeout_s,
            tls=options.tls,
            credentials=options.credentials,
        )
        await producer.start()
        try:
            sender = RowSender(options, producer, prefix)
            for batch in batches:
                await sender.add_arrow(batch)
            return await sender.finish()
        finally:
            await producer.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        stats = runner.run(go())
    return TaskWritten(partition, stats.rows, stats.acknowledged)


def check_on_driver(options: SinkOptions, schema: StructType) -> None:
    """What a write can check before any task runs: the columns, and that the ``topic``
    option names a topic that exists. The ``topic`` column's values are not known here
    (Spark hands a writer the schema only); a row naming a missing topic fails its task."""
    check_schema(schema, options)
    if options.topic:
        plan.run(plan.check_topic(options, options.topic))


class MetaqBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        check_on_driver(options, schema)
        self.options = options
        self.write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskWritten:
        return write_partition(self.options, self.write_id, 0, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_written("write " + self.write_id, messages)


class MetaqStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        check_on_driver(options, schema)
        self.options = options
        self.fallback_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskWritten:
        context = TaskContext.get()
        query_id = batch_id = None
        if context is not None:
            query_id = context.getLocalProperty("sql.streaming.queryId")
            batch_id = context.getLocalProperty("streaming.sql.batchId")
        return write_partition(
            self.options, query_id or self.fallback_id, int(batch_id or 0), iterator
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_written(f"batch {batchId}", messages)


def _log_written(what: str, messages: list[WriterCommitMessage | None]) -> None:
    done = [m for m in messages if isinstance(m, TaskWritten)]
    log.info(
        "%s: %d rows sent, %d acknowledged",
        what,
        sum(m.rows for m in done),
        sum(m.acknowledged for m in done),
    )
