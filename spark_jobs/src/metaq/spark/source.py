"""``format("metaq")``: the data source Spark instantiates, and its batch reader.

The objects here are pickled from the driver to the executors; they hold only options and
plans (plain dataclasses), never a connection or an event loop. Executors open their own
through :mod:`metaq.spark.pull`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

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
            for r in plan.split(ranges, self.options.min_partitions)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, RangePartition):  # Spark sends a bare one when there are none
            yield from read_range(self.options, partition, self.projection)


async def plan_batch(options: SourceOptions, pushed: Pushed) -> list[QueueRange]:
    """The queue ranges of a batch read: starting to ending offsets (or timestamps),
    narrowed by the pushed filters."""
    async with RouteCache(
        options.nameservers, rpc_timeout_s=options.request_timeout_s, tls=options.tls
    ) as routes:
        consumer = PullConsumer(
            options.nameservers, PLANNER_GROUP, routes=routes,
            request_timeout_s=options.request_timeout_s, tls=options.tls,
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
            starts = await _bounded(
                options.starting, options.starting_timestamp_ms, pushed.from_ms, states,
                consumer, "startingOffsets", max,
            )  # fmt: skip
            ends = await _bounded(
                options.ending, options.ending_timestamp_ms, pushed.until_ms, states,
                consumer, "endingOffsets", min,
            )  # fmt: skip
        finally:
            await consumer.close()
    return [
        QueueRange(
            s.topic,
            s.queue.broker_name,
            s.queue.queue_id,
            max(starts[(s.topic, s.key)], s.min_offset),
            min(ends[(s.topic, s.key)], s.max_offset),
        )
        for s in states
    ]


async def _bounded(
    spec: Any,
    timestamp_ms: int | None,
    pushed_ms: int | None,
    states: list[plan.QueueState],
    consumer: PullConsumer,
    option: str,
    pick: Any,
) -> dict[tuple[str, str], int]:
    """Offsets from the option, tightened (``pick`` = max for starts, min for ends) by a
    pushed time bound."""
    offsets = await plan.resolve_offsets(spec, timestamp_ms, states, consumer, option=option)
    if pushed_ms is not None:
        by_time = await plan.resolve_offsets(spec, pushed_ms, states, consumer, option=option)
        offsets = {k: pick(v, by_time[k]) for k, v in offsets.items()}
    return offsets
