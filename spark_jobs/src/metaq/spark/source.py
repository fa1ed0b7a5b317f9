"""``format("metaq")``: the data source Spark instantiates, and its batch reader.

The objects here are pickled from the driver to the executors; they hold only options and
plans (plain dataclasses), never a connection or an event loop. Executors open their own
through :mod:`metaq.spark.pull`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    Filter,
    InputPartition,
)
from pyspark.sql.types import StructType

from metaq.client.pull_consumer import PullConsumer
from metaq.client.routes import RouteCache
from metaq.spark import plan
from metaq.spark.options import SourceOptions, parse_sink_options, parse_source_options
from metaq.spark.plan import PLANNER_GROUP, QueueRange, RangePartition
from metaq.spark.pull import read_range
from metaq.spark.pushdown import Pushed, push
from metaq.spark.schema import FULL, SCHEMA_DDL, Projection


class MetaqDataSource(DataSource):
    """Topics of a metaq cluster as a table (see docs/spark.md for the options)."""

    @classmethod
    def name(cls) -> str:
        return "metaq"

    def schema(self) -> str:
        # A DDL string: Python workers have no SparkContext to parse it into a StructType.
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return MetaqBatchReader(
            parse_source_options(self.options, streaming=False), Projection.of(schema)
        )

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from metaq.spark.stream import MetaqStreamReader

        return MetaqStreamReader(
            parse_source_options(self.options, streaming=True), Projection.of(schema)
        )

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from metaq.spark.writer import MetaqBatchWriter

        return MetaqBatchWriter(parse_sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from metaq.spark.writer import MetaqStreamWriter

        return MetaqStreamWriter(parse_sink_options(self.options), schema)


class MetaqBatchReader(DataSourceReader):
    """One partition per (topic, broker group, queue, offset range); filters pushed down."""

    def __init__(self, options: SourceOptions, projection: Projection = FULL) -> None:
        self.options = options
        self.projection = projection
        self.pushed = Pushed()

    def pushFilters(self, filters: list[Filter]) -> Sequence[Filter]:
        self.pushed, rest = push(filters, self.pushed)
        return rest

    def partitions(self) -> Sequence[InputPartition]:
        tags = self.pushed.tag_expression(self.options.tags)
        if tags is None:
            return []
        ranges = plan.run(plan_batch(self.options, self.pushed))
        p = self.pushed
        return [
            RangePartition(r, tags, p.from_ms, p.until_ms)
            for r in plan.split(
                ranges, self.options.min_partitions, self.options.max_messages_per_partition
            )
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, RangePartition):  # Spark sends a bare one when there are none
            yield from read_range(self.options, partition, self.projection)


async def plan_batch(options: SourceOptions, pushed: Pushed) -> list[QueueRange]:
    """The queue ranges of a batch read: starting to ending offsets (or timestamps),
    checked against each queue's bounds, then narrowed by the pushed filters."""
    async with RouteCache(
        options.nameservers, rpc_timeout_s=options.request_timeout_s, tls=options.tls,
        credentials=options.credentials,
    ) as routes:  # fmt: skip
        consumer = PullConsumer(
            options.nameservers, PLANNER_GROUP, routes=routes,
            request_timeout_s=options.request_timeout_s, tls=options.tls,
            credentials=options.credentials,
        )  # fmt: skip
        try:
            topics = await plan.resolve_topics(options, routes)
            if pushed.topics is not None:
                topics = [t for t in topics if t in pushed.topics]
            states = [
                s
                for s in await plan.queue_states(options, routes, consumer, topics)
                if pushed.allows_queue(s.topic, s.queue.broker_name, s.queue.queue_id)
            ]
            starts = await plan.resolve_offsets(
                options.starting, options.starting_timestamp_ms, states, consumer,
                option="startingOffsets", by_timestamp=options.starting_by_timestamp,
            )  # fmt: skip
            ends = await plan.resolve_offsets(
                options.ending, options.ending_timestamp_ms, states, consumer,
                option="endingOffsets", by_timestamp=options.ending_by_timestamp,
            )  # fmt: skip
            from_time = until_time = None
            if pushed.from_ms is not None:
                from_time = await plan.resolve_offsets(
                    "earliest", pushed.from_ms, states, consumer, option="startingOffsets"
                )
            if pushed.until_ms is not None:
                until_time = await plan.resolve_offsets(
                    "latest", pushed.until_ms, states, consumer, option="endingOffsets"
                )
        finally:
            await consumer.close()
    ranges = []
    for s in states:
        key = (s.topic, s.key)
        start, end = plan.checked_range(
            s, starts[key], ends[key], fail_on_data_loss=options.fail_on_data_loss,
            start_option=plan.option_of(options, s, starting=True),
            end_option=plan.option_of(options, s, starting=False),
        )  # fmt: skip
        # The pushed time bounds only narrow what the options asked for.
        if from_time is not None:
            start = min(max(start, from_time[key]), end)
        if until_time is not None:
            end = max(min(end, until_time[key]), start)
        ranges.append(QueueRange(s.topic, s.queue.broker_name, s.queue.queue_id, start, end))
    return ranges
