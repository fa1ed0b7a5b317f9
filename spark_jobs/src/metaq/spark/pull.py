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
import uvloop

from metaq.client.pull_consumer import PullConsumer, PullStatus, QueueNotRouted
from metaq.client.tags import TagFilter
from metaq.common.errors import MetaqError
from metaq.common.model import QueueRoute
from metaq.spark.arrow_records import to_arrow
from metaq.spark.options import SourceOptions
from metaq.spark.plan import DataLoss, QueueRange, RangePartition
from metaq.spark.schema import Projection

log = logging.getLogger(__name__)

READER_GROUP: Final = "spark-reader"
"""Named in pulls; a read commits nothing under it."""
FAILOVER_WAIT_S: Final = 60.0
"""How long a read follows a queue whose broker is unreachable before failing the task
(Spark retries it): long enough for the controller to promote a slave."""
_RETRY_PAUSE_S: Final = 0.2
BATCH_BYTES: Final = 8 * 1024 * 1024
"""Pulled bytes gathered into one Arrow batch: few, large batches cost Spark less per row
than one per pull (a pull is at most the broker's ``max_pull_messages``)."""


def read_range(
    options: SourceOptions, partition: RangePartition, projection: Projection
) -> Iterator[pa.RecordBatch]:
    """Every message of the partition's range (matching its tags and store-time bounds), in
    offset order, as Arrow batches of the projection's columns."""
    rng = partition.range
    if rng.size <= 0:
        return
    loop = uvloop.new_event_loop()
    consumer = PullConsumer(
        options.nameservers,
        READER_GROUP,
        request_timeout_s=options.request_timeout_s,
        tls=options.tls,
        credentials=options.credentials,
    )
    tag_filter = TagFilter.parse(partition.tags)
    try:
        reader = _RangeReader(options, rng, tag_filter, consumer)
        while True:
            payloads = loop.run_until_complete(reader.next_payloads(BATCH_BYTES))
            if not payloads:
                return
            batch = to_arrow(
                rng.broker, rng.topic, payloads, tags=tag_filter.tags, end_offset=rng.end,
                from_ms=partition.from_ms, until_ms=partition.until_ms,
                columns=projection.columns,
            )  # fmt: skip
            if batch.num_rows:
                yield projection.fit(batch)
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

    async def next_payloads(self, max_bytes: int) -> list[memoryview]:
        """Pulled records of the range, about ``max_bytes`` of them; none once it is done."""
        payloads: list[memoryview] = []
        size = 0
        while size < max_bytes:
            payload = await self.next_payload()
            if payload is None:
                break
            payloads.append(payload)
            size += len(payload)
        return payloads

    async def next_payload(self) -> memoryview | None:
        """The records of the range's next pull; None once it is done."""
        rng = self.rng
        deadline = time.monotonic() + FAILOVER_WAIT_S
        while self.offset < rng.end:
            try:
                if self.queue is None:
                    self.queue = await self._locate()
                result = await self.consumer.pull_records(
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
                # Rows past the range's end and tag-hash collisions are cut by to_arrow.
                self.offset = min(max(result.next_offset, self.offset), rng.end)
                if result.record_count:
                    return result.payload
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
