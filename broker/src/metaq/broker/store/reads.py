"""Batch reads from a consume queue: raw record slices, never decoded bodies."""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass, field

from metaq.broker.store.commitlog import CommitLog
from metaq.broker.store.consume_queue import ConsumeQueue
from metaq.common.errors import StoreUnavailable


class GetStatus(enum.Enum):
    FOUND = "found"
    NO_MATCHED_MESSAGE = "no_matched_message"
    """Entries were scanned but none matched the tag filter; continue at next_offset."""
    NO_MESSAGE_IN_QUEUE = "no_message_in_queue"
    """The queue is empty or does not exist (yet)."""
    OFFSET_TOO_SMALL = "offset_too_small"
    """Below the queue's minimum (retention removed it); restart at next_offset."""
    OFFSET_OVERFLOW_ONE = "offset_overflow_one"
    """Exactly the queue's end: nothing new yet (a long poll waits here)."""
    OFFSET_OVERFLOW_BADLY = "offset_overflow_badly"
    """Past the queue's end: the consumer's offset is wrong; reset to next_offset."""
    OFFSET_MOVED = "offset_moved"
    """The entry exists but its commitlog bytes were deleted; restart at next_offset."""


@dataclass(slots=True)
class GetResult:
    status: GetStatus
    next_offset: int
    min_offset: int
    max_offset: int
    records: list[memoryview] = field(default_factory=list)
    queue_offsets: list[int] = field(default_factory=list)
    log_start: int = -1
    """Commitlog offset of the first record returned (-1 with none)."""
    log_end: int = -1
    """Commitlog offset just past the last record returned."""

    @property
    def total_bytes(self) -> int:
        return sum(len(r) for r in self.records)

    def release(self) -> None:
        """Let go of the mapped pages now rather than at garbage collection."""
        for record in self.records:
            record.release()
        self.records = []


def read_batch(
    commitlog: CommitLog,
    queue: ConsumeQueue | None,
    offset: int,
    max_messages: int,
    max_bytes: int,
    tag_codes: Collection[int] | None,
) -> GetResult:
    """Read up to ``max_messages`` / ``max_bytes`` records from ``offset`` on.

    The first record is returned even if it alone exceeds ``max_bytes``, so a large
    message can never stall a queue. With ``tag_codes`` only entries whose tag hash is in
    it are returned; hashes collide, so clients re-check the tag itself.
    """
    if queue is None or queue.max_offset == queue.min_offset:
        lo = queue.min_offset if queue else 0
        status = GetStatus.NO_MESSAGE_IN_QUEUE
        if offset > lo:
            status = GetStatus.OFFSET_OVERFLOW_BADLY
        return GetResult(status, lo, lo, lo)
    lo, hi = queue.min_offset, queue.max_offset
    if offset < lo:
        return GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, hi)
    if offset == hi:
        return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, hi, lo, hi)
    if offset > hi:
        return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, hi, lo, hi)
    result = GetResult(GetStatus.NO_MATCHED_MESSAGE, offset, lo, hi)
    # Bound the entries a filtered read scans, so one pull never walks a whole queue.
    scan_limit = max_messages if tag_codes is None else max(max_messages * 16, 4096)
    used = 0
    next_offset = offset
    damaged = commitlog.damaged
    for n, cl_offset, size, tag in queue.entries(offset, min(hi, offset + scan_limit)):
        if tag_codes is not None and tag not in tag_codes:
            next_offset = n + 1
            continue
        if damaged and cl_offset in damaged:
            if result.records:
                break
            raise StoreUnavailable(
                f"the record at queue offset {n} (commitlog offset {cl_offset}) is damaged "
                "on this broker and waits for repair from its master; read from the master"
            )
        if result.records and used + size > max_bytes:
            break
        view = commitlog.slice(cl_offset, size)
        if view is None:
            if not result.records:
                result.status = GetStatus.OFFSET_MOVED
                result.next_offset = _first_present(commitlog, queue, n)
                return result
            break
        if not result.records:
            result.log_start = cl_offset
        result.log_end = cl_offset + size
        result.records.append(view)
        result.queue_offsets.append(n)
        used += size
        next_offset = n + 1
        if len(result.records) >= max_messages:
            break
    result.next_offset = next_offset
    if result.records:
        result.status = GetStatus.FOUND
    return result


def _first_present(commitlog: CommitLog, queue: ConsumeQueue, start: int) -> int:
    """The first queue offset at or after ``start`` whose record is still in the log."""
    lo, hi = start, queue.max_offset
    floor = commitlog.min_offset
    while lo < hi:
        mid = (lo + hi) // 2
        if queue.entry(mid)[0] < floor:
            lo = mid + 1
        else:
            hi = mid
    return lo
