"""Executor side of a read: one queue range pulled through the client, as Arrow batches.

Runs inside Spark's Python workers (separate processes, on other machines in a cluster), so
everything it needs travels in the partition: nothing is shared with the driver. A master
that goes away mid-read is followed to whatever the route names next (its slave while the
group has no master, the new master after a failover); the offsets are the same there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Final

import pyarrow as pa

from metaq.client.message import Message
from metaq.client.pull_consumer import PullConsumer, PullStatus, QueueNotRouted
from metaq.client.routes import QueueRoute
from metaq.client.tags import TagFilter
from metaq.common.errors import MetaqError
from metaq.spark.options import SourceOptions
from metaq.spark.plan import QueueRange
from metaq.spark.schema import ARROW_SCHEMA

log = logging.getLogger(__name__)

READER_GROUP: Final = "spark-reader"
"""Named in pulls; a read commits nothing under it."""
FAILOVER_WAIT_S: Final = 60.0
"""How long a read follows a queue whose broker is unreachable before failing the task
(Spark retries it): long enough for the controller to promote a slave."""
_RETRY_PAUSE_S: Final = 0.2


class DataLoss(MetaqError):
    """Messages the read was planned to return are gone (retention deleted them)."""

    retriable = False


def read_range(options: SourceOptions, rng: QueueRange, tags: str) -> Iterator[pa.RecordBatch]:
    """Every message of ``rng`` (matching ``tags``), in offset order, as Arrow batches."""
    if rng.size <= 0:
        return
    loop = asyncio.new_event_loop()
    consumer = PullConsumer(
        options.nameservers,
        READER_GROUP,
        request_timeout_s=options.request_timeout_s,
        tls=options.tls,
    )
    try:
        reader = _RangeReader(options, rng, TagFilter.parse(tags), consumer)
        while True:
            messages = loop.run_until_complete(reader.next_batch())
            if messages is None:
                return
            if messages:
                yield to_arrow(rng.broker, messages)
    finally:
        loop.run_until_complete(consumer.close())
        loop.close()


class _RangeReader:
    def __init__(
        self, options: SourceOptions, rng: QueueRange, tags: TagFilter, consumer: PullConsumer
    ) -> None:
        self.options = options
        self.rng = rng
        self.tags = tags
        self.consumer = consumer
        self.offset = rng.start
        self.queue: QueueRoute | None = None

    async def next_batch(self) -> list[Message] | None:
        """The next messages of the range; None once it is done."""
        rng = self.rng
        deadline = time.monotonic() + FAILOVER_WAIT_S
        while self.offset < rng.end:
            try:
                if self.queue is None:
                    self.queue = await self._locate()
                result = await self.consumer.pull(
                    rng.topic,
                    self.queue,
                    self.offset,
                    max_messages=min(self.options.pull_batch_messages, rng.end - self.offset),
                    timeout_s=1.0,
                    tags=self.tags,
                )
            except MetaqError as exc:
                if not exc.retriable or time.monotonic() > deadline:
                    raise
                log.info("pull of %s:%s failed (%s); following the route", rng.topic, rng.key, exc)
                self.queue = None
                self.consumer.routes.invalidate(rng.topic)
                await asyncio.sleep(_RETRY_PAUSE_S)
                continue
            status = result.status
            if status is PullStatus.FOUND or status is PullStatus.NO_MATCHED_MESSAGE:
                messages = [m for m in result.messages if m.queue_offset < rng.end]
                self.offset = min(max(result.next_offset, self.offset), rng.end)
                if messages:
                    return messages
                continue
            if status in (PullStatus.OFFSET_TOO_SMALL, PullStatus.OFFSET_MOVED):
                self._lost(result.next_offset)
                continue
            # Planned offsets the broker does not show yet: a slave still catching up, or
            # a new master that has not dispatched its tail. Wait for them.
            if time.monotonic() > deadline:
                raise DataLoss(
                    f"{rng.topic} queue {rng.key}: offsets {self.offset}..{rng.end} were planned "
                    f"but the broker holds only up to {result.max_offset} after "
                    f"{FAILOVER_WAIT_S:.0f} s"
                )
            self.queue = None
        return None

    def _lost(self, next_offset: int) -> None:
        rng = self.rng
        gone_to = min(max(next_offset, self.offset + 1), rng.end)
        if rng.new_queue and self.offset == rng.start:
            self.offset = gone_to
            return
        text = (
            f"{rng.topic} queue {rng.key}: offsets {self.offset}..{gone_to} were deleted by "
            "retention before they were read"
        )
        if self.options.fail_on_data_loss:
            raise DataLoss(text + "; set failOnDataLoss=false to skip them with a warning")
        log.warning("%s; skipped (failOnDataLoss=false)", text)
        self.offset = gone_to

    async def _locate(self) -> QueueRoute:
        rng = self.rng
        for queue in await self.consumer.queues(rng.topic, refresh=True):
            if queue.broker_name == rng.broker and queue.queue_id == rng.queue_id:
                return queue
        # The group has no readable broker right now (both gone, or not yet re-registered).
        raise QueueNotRouted(rng.topic, QueueRoute(rng.broker, "", rng.queue_id, ""))


def to_arrow(broker: str, messages: list[Message]) -> pa.RecordBatch:
    """Messages as one Arrow batch in :data:`~metaq.spark.schema.ARROW_SCHEMA`."""
    n = len(messages)
    columns = [
        pa.array([m.topic for m in messages], pa.string()),
        pa.array([broker] * n, pa.string()),
        pa.array([m.queue_id for m in messages], pa.int32()),
        pa.array([m.queue_offset for m in messages], pa.int64()),
        pa.array([m.msg_id for m in messages], pa.string()),
        pa.array([list(m.keys) for m in messages], ARROW_SCHEMA.field("keys").type),
        pa.array([m.tags for m in messages], pa.string()),
        pa.array(
            [list(m.properties.items()) for m in messages], ARROW_SCHEMA.field("properties").type
        ),
        pa.array([m.body for m in messages], pa.binary()),
        pa.array(
            [m.born_timestamp_ms * 1000 for m in messages],
            ARROW_SCHEMA.field("born_timestamp").type,
        ),
        pa.array(
            [m.store_timestamp_ms * 1000 for m in messages],
            ARROW_SCHEMA.field("store_timestamp").type,
        ),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
