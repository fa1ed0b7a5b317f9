"""Batch reads from a consume queue: raw record slices, never decoded bodies."""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from metaq.broker.store.commitlog import CommitLog
from metaq.broker.store.consume_queue import ConsumeQueue
from metaq.common.errors import StoreUnavailable
from metaq.common.record import header_view


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


_LENGTH: Final = header_view("size")
_QUEUE_OFFSET: Final = header_view("queue_offset")


@dataclass(slots=True)
class GetResult:
    """What a read found. The records are ``spans``: each a view of records that lie back
    to back in one commitlog file, in queue order. A pull answers with the spans as they
    are (a queue's records are mostly adjacent in the log: a producer's batch for a queue
    is stored as one run), so a read costs a view per run rather than per record."""

    status: GetStatus
    next_offset: int
    min_offset: int
    max_offset: int
    spans: list[memoryview] = field(default_factory=list)
    count: int = 0
    """Records in ``spans``."""
    log_start: int = -1
    """Commitlog offset of the first record returned (-1 with none)."""
    log_end: int = -1
    """Commitlog offset just past the last record returned."""
    span_starts: list[int] = field(default_factory=list)
    """Commitlog offset of each span's first record."""

    @property
    def records(self) -> list[memoryview]:
        """One view per record, in queue order (split from the spans by their lengths)."""
        views = []
        for span in self.spans:
            at, end = 0, len(span)
            while at < end:
                size = _LENGTH.unpack_from(span, at)[0]
                views.append(span[at : at + size])
                at += size
        return views

    @property
    def queue_offsets(self) -> list[int]:
        """Each record's queue offset, from its header."""
        return [_QUEUE_OFFSET.unpack_from(r)[0] for r in self.records]

    @property
    def total_bytes(self) -> int:
        return sum(map(len, self.spans))

    def keep_below(self, log_offset: int) -> None:
        """Drop the records at or past commitlog offset ``log_offset``."""
        if self.log_end <= log_offset:
            return
        kept_spans: list[memoryview] = []
        kept_starts: list[int] = []
        count = 0
        for span, start in zip(self.spans, self.span_starts, strict=True):
            if start >= log_offset:
                span.release()
                continue
            at = 0
            while at < len(span) and start + at < log_offset:
                at += _LENGTH.unpack_from(span, at)[0]
                count += 1
            kept_spans.append(span[:at] if at < len(span) else span)
            kept_starts.append(start)
            self.log_end = start + at
        self.spans, self.span_starts, self.count = kept_spans, kept_starts, count
        if not count:
            self.log_start = self.log_end = -1

    def release(self) -> None:
        """Let go of the mapped pages now rather than at garbage collection."""
        for span in self.spans:
            span.release()
        self.spans = []
        self.span_starts = []
        self.count = 0


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
    damaged = commitlog.damaged
    written = commitlog.write_offset
    stop = min(hi, offset + scan_limit)
    if (
        tag_codes is None
        and not damaged
        and stop - offset >= _WHOLE_ARRAYS_FROM
        and _read_runs(commitlog, queue, offset, stop, max_bytes, written, result)
    ):
        return result
    spans, span_starts = result.spans, result.span_starts
    # The open run of records back to back: from run_start to run_end in the log, in
    # run_view (a view from run_start to the end of its file); records may join it up
    # to run_limit, that end or the end of what is written, whichever comes first.
    run_view = _NO_RUN
    run_start = run_end = run_limit = 0
    count = used = 0
    n = offset - 1
    for cl_offset, size, tag in queue.entries(offset, stop):
        n += 1
        if tag_codes is not None and tag not in tag_codes:
            result.next_offset = n + 1
            continue
        if damaged and cl_offset in damaged:
            if count:
                break
            raise StoreUnavailable(
                f"the record at queue offset {n} (commitlog offset {cl_offset}) is damaged "
                "on this broker and waits for repair from its master; read from the master"
            )
        if count and used + size > max_bytes:
            break
        end = cl_offset + size
        if cl_offset != run_end or end > run_limit:
            view = _view_from(commitlog, cl_offset, end, written)
            if view is None:
                if not count:
                    result.status = GetStatus.OFFSET_MOVED
                    result.next_offset = queue.first_at_or_after(commitlog.min_offset, n)
                    return result
                break
            if count:
                spans.append(_closed(run_view, run_end - run_start))
                span_starts.append(run_start)
            else:
                result.log_start = cl_offset
            run_view, run_start = view, cl_offset
            run_limit = min(cl_offset + len(view), written)
        run_end = end
        used += size
        count += 1
        result.next_offset = n + 1
        if count >= max_messages:
            break
    if count:
        spans.append(_closed(run_view, run_end - run_start))
        span_starts.append(run_start)
        result.count = count
        result.log_end = run_end
        result.status = GetStatus.FOUND
    return result


_NO_RUN: Final = memoryview(b"")
_WHOLE_ARRAYS_FROM: Final = 48
"""Entries from which a read takes :func:`_read_runs`. Its numpy calls have a fixed cost
whatever the count, which the record-by-record loop beats for short reads; they break
even near 50 entries (docs/benchmarks.md, "Figures behind design choices")."""


def _read_runs(
    commitlog: CommitLog,
    queue: ConsumeQueue,
    offset: int,
    stop: int,
    max_bytes: int,
    written: int,
    result: GetResult,
) -> bool:
    """:func:`read_batch`'s loop for an unfiltered read, over whole arrays: the byte
    bound and the runs of back-to-back records found in numpy, a view taken per run.
    Going record by record was most of the broker's Python work for a large pull.
    False, with ``result`` untouched, where the loop must go record by record:
    a missing entry, a run crossing into another file or past what is written."""
    entries = queue.entry_array(offset, stop)
    if len(entries) != stop - offset:
        return False
    sizes = entries["size"].astype(np.int64)
    # The first record goes whatever its size; then while the bytes stay within bound.
    count = max(1, int(sizes.cumsum().searchsorted(max_bytes, side="right")))
    starts = entries["offset"][:count]
    ends = starts + sizes[:count]
    breaks: list[int] = ((starts[1:] != ends[:-1]).nonzero()[0] + 1).tolist()
    run_starts: list[int] = starts[[0, *breaks]].tolist()
    run_ends: list[int] = ends[[*(b - 1 for b in breaks), count - 1]].tolist()
    del entries, starts, ends  # views of the queue's file: let it go now
    spans: list[memoryview] = []
    for start, end in zip(run_starts, run_ends, strict=True):
        view = _view_from(commitlog, start, end, written)
        if view is None:
            for span in spans:
                span.release()
            return False
        spans.append(_closed(view, end - start))
    result.spans, result.span_starts, result.count = spans, run_starts, count
    result.log_start, result.log_end = run_starts[0], run_ends[-1]
    result.next_offset = offset + count
    result.status = GetStatus.FOUND
    return True


def _view_from(commitlog: CommitLog, start: int, end: int, written: int) -> memoryview | None:
    """A view of the log from ``start`` to the end of its file, if ``[start, end)`` is
    stored whole in one file; None where that part of the log is gone."""
    if end > written:
        return None
    segment = commitlog.segments.find(start)
    if segment is None or end > segment.end:
        return None
    try:
        return segment.view[start - segment.start :]
    except ValueError:  # retired and released between find and slice
        return None


def _closed(run_view: memoryview, size: int) -> memoryview:
    """The run's records: the first ``size`` bytes of its view (which is let go)."""
    if size == len(run_view):
        return run_view
    span = run_view[:size]
    run_view.release()
    return span
