"""``readStream.format("metaq")``: micro-batches of every queue's new messages.

The streaming offset is ``{topic: {"broker:queue": next offset}}`` for every queue read
so far. Spark checkpoints it before a batch runs and hands the same (start, end) back on a
restart, and a range of a queue always holds the same messages, so a query restarted
from its checkpoint reads exactly what its sink did not commit: no gap, no duplicate
with a file sink. Queues and topics (``topicPattern``) that appear are added at their
earliest offset. A broker that does not answer keeps its queues where they were until a
later trigger; executors follow a failover to the new master or read from the slave.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from metaq.client.pull_consumer import PullConsumer
from metaq.client.routes import RouteCache
from metaq.spark import plan
from metaq.spark.options import SourceOptions
from metaq.spark.plan import PLANNER_GROUP, QueueRange, QueueState, RangePartition
from metaq.spark.pull import read_range
from metaq.spark.schema import FULL, Projection

log = logging.getLogger(__name__)

StreamOffset = dict[str, dict[str, int]]


class MetaqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """See the module docstring. Spark keeps one instance in a Python process on the driver
    for the query's life (its offsets calls), and pickles another to the executors, which
    only reads: the state kept between offsets calls (the ``availableNow`` target, the
    latest offsets seen) lives only in the first."""

    def __init__(self, options: SourceOptions, projection: Projection = FULL) -> None:
        self.options = options
        self.projection = projection
        self.target: StreamOffset | None = None
        """Set by an ``availableNow`` run: the offsets it stops at."""
        self.latest: StreamOffset | None = None
        """Every queue's end when the last batch was planned, for the query's progress."""
        self.last_batch_s: float | None = None
        """When the last batch was planned (monotonic), for ``maxTriggerDelay``."""

    def initialOffset(self) -> StreamOffset:
        return plan.run(self._initial())

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_messages_per_trigger:
            return ReadMaxRows(self.options.max_messages_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix what an ``availableNow`` run reads: every queue's end now. Spark then plans
        batches with :meth:`getDefaultReadLimit` (``maxMessagesPerTrigger``) until the
        target is reached, as its Kafka source does; messages, queues and topics that
        arrive later wait for the next run."""
        self.target = self._ends({})

    def latestOffset(self, start: StreamOffset, limit: ReadLimit) -> StreamOffset:
        latest = self._ends(start)
        self.latest = latest
        if self.target is not None:
            latest = up_to_target(start, latest, self.target)
        elif self._delayed(start, latest):
            return start
        if isinstance(limit, ReadMaxRows):
            latest = cap(start, latest, limit.max_rows)
        return latest

    def _delayed(self, start: StreamOffset, latest: StreamOffset) -> bool:
        """Whether to plan no batch yet (``minMessagesPerTrigger``): fewer messages wait
        than asked for and ``maxTriggerDelay`` has not passed since the last batch, Kafka's
        rule. The query's first batch is never delayed; ``availableNow`` runs never are."""
        low = self.options.min_messages_per_trigger
        if not low:
            return False
        now = time.monotonic()
        due = self.last_batch_s is None or (
            now - self.last_batch_s >= self.options.max_trigger_delay_ms / 1000
        )
        count = waiting(start, latest)
        if not due and count < low:
            return True
        if count:
            self.last_batch_s = now
        return False

    def reportLatestOffset(self) -> StreamOffset | None:
        """What Spark shows as the source's ``latestOffset`` in the query's progress: every
        queue's end when the last batch was planned (its ``endOffset`` is where the batch
        stopped, under ``maxMessagesPerTrigger``)."""
        return self.latest

    def _ends(self, start: StreamOffset) -> StreamOffset:
        """Every queue's end now, for the queues in ``start`` and any that answer."""
        latest: StreamOffset = {t: dict(q) for t, q in start.items()}
        for s in plan.run(self._states()):
            latest.setdefault(s.topic, {})
            known = start.get(s.topic, {}).get(s.key)
            # Never backwards: a slave answering during a failover may lag the master.
            latest[s.topic][s.key] = s.max_offset if known is None else max(known, s.max_offset)
        return latest

    def partitions(self, start: StreamOffset, end: StreamOffset) -> Sequence[InputPartition]:
        ranges = []
        for topic, queues in sorted(end.items()):
            for key, stop in sorted(queues.items()):
                broker, _, queue_id = key.rpartition(":")
                begin = start.get(topic, {}).get(key)
                rng = QueueRange(topic, broker, int(queue_id), begin or 0, stop, begin is None)
                if rng.size:
                    ranges.append(rng)
        o = self.options
        pieces = plan.split(ranges, o.min_partitions, o.max_messages_per_partition)
        return [RangePartition(r, o.tags) for r in pieces]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, RangePartition):  # Spark sends a bare one when there are none
            yield from read_range(self.options, partition, self.projection)

    def commit(self, end: StreamOffset) -> None:
        """Store ``end`` as the consumer group's offsets (option ``consumerGroup``), so
        ``metaq progress`` shows the pipeline's lag. Informational: Spark's checkpoint,
        not these offsets, says where a restarted query resumes."""
        if self.options.consumer_group:
            try:
                plan.run(self._commit(end))
            except Exception as exc:  # the next batch's commit covers this one
                log.warning(
                    "committing offsets for %s failed: %s", self.options.consumer_group, exc
                )

    @contextlib.asynccontextmanager
    async def _consumer(self, group: str) -> AsyncIterator[tuple[RouteCache, PullConsumer]]:
        """A route cache and a pull consumer of ``group`` over it, both closed after."""
        o = self.options
        async with RouteCache(
            o.nameservers, rpc_timeout_s=o.request_timeout_s, tls=o.tls, credentials=o.credentials
        ) as routes:
            consumer = PullConsumer(
                o.nameservers, group, routes=routes, tls=o.tls, credentials=o.credentials
            )
            try:
                yield routes, consumer
            finally:
                await consumer.close()

    async def _initial(self) -> StreamOffset:
        o = self.options
        async with self._consumer(PLANNER_GROUP) as (routes, consumer):
            topics = await plan.resolve_topics(o, routes)
            states = await plan.queue_states(o, routes, consumer, topics)
            offsets = await plan.resolve_offsets(
                o.starting, o.starting_timestamp_ms, states, consumer, option="startingOffsets",
                by_timestamp=o.starting_by_timestamp,
            )  # fmt: skip
        result: StreamOffset = {t: {} for t in topics}
        for s in states:
            start, _ = plan.checked_range(
                s, offsets[(s.topic, s.key)], s.max_offset,
                fail_on_data_loss=o.fail_on_data_loss,
                start_option=plan.option_of(o, s, starting=True),
            )  # fmt: skip
            result[s.topic][s.key] = start
        return result

    async def _states(self) -> list[QueueState]:
        o = self.options
        async with self._consumer(PLANNER_GROUP) as (routes, consumer):
            topics = await plan.resolve_topics(o, routes)
            return await plan.queue_states(o, routes, consumer, topics, tolerate_failures=True)

    async def _commit(self, end: StreamOffset) -> None:
        async with self._consumer(self.options.consumer_group) as (routes, consumer):
            by_address: dict[str, list[tuple[str, int, int]]] = {}
            for topic, queues in end.items():
                for queue in (await routes.route(topic)).read_queues:
                    offset = queues.get(str(queue))
                    if offset is not None:
                        by_address.setdefault(queue.address, []).append(
                            (topic, queue.queue_id, offset)
                        )
            await asyncio.gather(
                *(consumer.commit_many(a, offsets) for a, offsets in by_address.items())
            )


def up_to_target(start: StreamOffset, latest: StreamOffset, target: StreamOffset) -> StreamOffset:
    """``latest`` cut back to ``target`` (an ``availableNow`` run's end), never below
    ``start``; queues the target does not know are left where ``start`` has them."""
    kept: StreamOffset = {t: {} for t in latest if t in start or t in target}
    for topic, queues in latest.items():
        for key, end in queues.items():
            begin = start.get(topic, {}).get(key)
            stop = target.get(topic, {}).get(key)
            if stop is not None:
                kept[topic][key] = max(min(end, stop), begin or 0)
            elif begin is not None:
                kept[topic][key] = begin
    return kept


def waiting(start: StreamOffset, latest: StreamOffset) -> int:
    """How many messages lie between ``start`` and ``latest``."""
    return sum(
        end - start.get(t, {}).get(k, 0) for t, qs in latest.items() for k, end in qs.items()
    )


def cap(start: StreamOffset, latest: StreamOffset, max_rows: int) -> StreamOffset:
    """``latest`` cut so that at most ``max_rows`` messages lie between it and ``start``,
    shared among queues in proportion to what each has waiting (the Kafka source's rule)."""
    waiting = {
        (t, k): end - start.get(t, {}).get(k, 0)
        for t, queues in latest.items()
        for k, end in queues.items()
    }
    total = sum(waiting.values())
    if total <= max_rows:
        return latest
    share = {q: n * max_rows // total for q, n in waiting.items()}
    spare = max_rows - sum(share.values())
    for q in sorted(waiting, key=lambda q: waiting[q] - share[q], reverse=True):
        if spare <= 0:
            break
        if share[q] < waiting[q]:
            share[q] += 1
            spare -= 1
    capped: StreamOffset = {t: dict(qs) for t, qs in latest.items()}
    for (t, k), n in share.items():
        capped[t][k] = start.get(t, {}).get(k, 0) + n
    return capped
