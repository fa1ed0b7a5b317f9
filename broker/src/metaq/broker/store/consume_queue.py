"""Consume queues: per (topic, queue) an array of fixed-width pointers into the commitlog.

Entry ``n`` of a queue sits at byte ``n * 20`` of its log, so a queue offset is found by
arithmetic and the lag of a consumer is exactly ``max_offset - its offset``. Only the
dispatcher writes entries, in commitlog order; the files are sparse and rebuilt from the
commitlog whenever they are lost or behind.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from metaq.broker.store.mapping import MappingPool
from metaq.broker.store.queue_offsets import QueueOffsets
from metaq.broker.store.segment import Disk, Segment, SegmentQueue

ENTRY: Final = struct.Struct("<qIq")
"""Commitlog offset, record size, tag code."""
ENTRY_SIZE: Final = ENTRY.size
ENTRY_DTYPE: Final = np.dtype([("offset", "<i8"), ("size", "<u4"), ("tag", "<i8")])
"""An entry as a numpy record, for reading many at once (packed: 20 bytes)."""
_READ_WHOLE: Final = 64 * 1024
"""Up to this many bytes of entries are read in one call to find where they end."""


class _Loaded(NamedTuple):
    first: int
    """The queue offset of the first entry (one past any empty ones at the file's head)."""
    first_offset: int
    last_offset: int
    last_end: int
    """The commitlog offsets of the first and last entries' records, and the last's end."""


class ConsumeQueue:
    __slots__ = (
        "_loaded",
        "_tail",
        "_tail_end",
        "_tail_first",
        "key",
        "max_offset",
        "min_offset",
        "queue_id",
        "segments",
        "topic",
    )

    def __init__(
        self,
        directory: Path,
        topic: str,
        queue_id: int,
        entries_per_segment: int,
        disk: Disk,
        pool: MappingPool | None = None,
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.key = (topic.encode(), queue_id)
        self.segments = SegmentQueue(
            directory,
            entries_per_segment * ENTRY_SIZE,
            preallocate=False,
            keep_fd=False,
            disk=disk,
            pool=pool,
        )
        self.min_offset = 0
        self.max_offset = 0
        self._loaded: _Loaded | None = None
        """What :meth:`load` read of a one-file queue, so that recovery need not map it;
        forgotten at the first change."""
        # The file the next entry goes to, kept at hand with its entry range. Its
        # ``written`` mark lags and is brought up to date by :meth:`settle`. Its view is
        # asked for at each put, never kept: an idle queue's file is unmapped by the
        # pool, and a kept view would hold it mapped.
        self._tail: Segment | None = None
        self._tail_first = 0
        self._tail_end = 0

    def load(self) -> bool:
        """Map the files and find the entry range; return False if files are missing."""
        gaps = self.segments.load()
        segments = self.segments.segments
        if not segments:
            return True
        self.min_offset = segments[0].start // ENTRY_SIZE
        last = segments[-1]
        used, whole = self._used_entries(last)
        for segment in segments[:-1]:
            segment.written = segment.synced = segment.size
        last.written = last.synced = used * ENTRY_SIZE
        self.max_offset = last.start // ENTRY_SIZE + used
        if whole is not None and len(segments) == 1 and used:
            entries = np.frombuffer(whole, ENTRY_DTYPE, used)
            first = int(np.flatnonzero(entries["size"])[0])
            self._loaded = _Loaded(
                self.min_offset + first,
                int(entries["offset"][first]),
                int(entries["offset"][-1]),
                int(entries["offset"][-1]) + int(entries["size"][-1]),
            )
        return not gaps

    @staticmethod
    def _used_entries(segment: Segment) -> tuple[int, bytes | None]:
        """Entries are written front to back, so the first empty one ends the data; and
        the file's bytes up to its first hole when they were read in one go.

        Read from the file, not a mapping: a start with 100,000 queues maps none. The
        file is sparse, and entries end before its first hole (SEEK_HOLE): for a queue
        with few messages that is one page, read in one call.
        """
        fd = os.open(segment.path, os.O_RDONLY)
        try:
            try:
                data_end = min(os.lseek(fd, 0, os.SEEK_HOLE), segment.size)
            except OSError:  # a filesystem that cannot say
                data_end = segment.size
            lo, hi = 0, min(-(-data_end // ENTRY_SIZE), segment.size // ENTRY_SIZE)
            whole = os.pread(fd, hi * ENTRY_SIZE, 0) if hi * ENTRY_SIZE <= _READ_WHOLE else None
            while lo < hi:
                mid = (lo + hi) // 2
                at = mid * ENTRY_SIZE
                entry = (
                    os.pread(fd, ENTRY_SIZE, at) if whole is None else whole[at : at + ENTRY_SIZE]
                )
                if len(entry) < ENTRY_SIZE or ENTRY.unpack(entry)[1] == 0:
                    hi = mid
                else:
                    lo = mid + 1
            return lo, whole
        finally:
            os.close(fd)

    def put(self, queue_offset: int, commitlog_offset: int, size: int, tag_code: int) -> None:
        # The tail holds entry max_offset - 1, so the next entry is in it unless it is full.
        tail = self._tail
        if tail is not None and queue_offset == self.max_offset and queue_offset < self._tail_end:
            pos = (queue_offset - self._tail_first) * ENTRY_SIZE
            tail.write(pos, ENTRY.pack(commitlog_offset, size, tag_code))
            self.max_offset = queue_offset + 1
            return
        self._put_slow(queue_offset, commitlog_offset, size, tag_code)

    def put_many(self, first_queue_offset: int, entries: npt.NDArray[np.void]) -> None:
        """Put ``entries`` (:data:`ENTRY_DTYPE`) at consecutive queue offsets from
        ``first_queue_offset``: as :meth:`put` one by one, but a run that continues the
        tail file goes in as one copy."""
        done, count = 0, len(entries)
        while done < count:
            queue_offset = first_queue_offset + done
            tail = self._tail
            if (
                tail is not None
                and queue_offset == self.max_offset
                and queue_offset < self._tail_end
            ):
                run = min(count - done, self._tail_end - queue_offset)
                pos = (queue_offset - self._tail_first) * ENTRY_SIZE
                tail.write(pos, entries[done : done + run].tobytes())
                self.max_offset = queue_offset + run
                done += run
            else:
                offset, size, tag = entries[done].item()
                self._put_slow(queue_offset, offset, size, tag)
                done += 1

    def settle(self) -> None:
        """Bring the tail file's ``written`` mark up to the entries put into it."""
        tail = self._tail
        if tail is not None:
            used = min(self.max_offset * ENTRY_SIZE, tail.end) - tail.start
            if used > tail.written:
                tail.written = used

    def _set_tail(self, segment: Segment | None) -> None:
        self.settle()
        self._tail = segment
        if segment is None:
            self._tail_first = self._tail_end = 0
        else:
            self._tail_first = segment.start // ENTRY_SIZE
            self._tail_end = segment.end // ENTRY_SIZE

    def _put_slow(self, queue_offset: int, commitlog_offset: int, size: int, tag_code: int) -> None:
        """A new file, a re-dispatched entry, or the first entry of an empty queue."""
        self._loaded = None
        if queue_offset < self.min_offset < self.max_offset:
            return  # re-dispatch of an entry retention already removed
        at = queue_offset * ENTRY_SIZE
        segment = self.segments.segment_for_write(at)
        pos = at - segment.start
        segment.write(pos, ENTRY.pack(commitlog_offset, size, tag_code))
        if pos + ENTRY_SIZE > segment.written:
            segment.written = pos + ENTRY_SIZE
        if self.max_offset == self.min_offset:
            # An empty queue's range starts wherever its first entry lands (a queue
            # rebuilt after retention starts past zero).
            self.min_offset = queue_offset
        if queue_offset >= self.max_offset:
            self.max_offset = queue_offset + 1
            self._set_tail(segment)

    def entry(self, queue_offset: int) -> tuple[int, int, int]:
        """(commitlog offset, size, tag code) of one entry; size 0 if there is none."""
        at = queue_offset * ENTRY_SIZE
        segment = self.segments.find(at)
        if segment is None:
            return (0, 0, 0)
        offset, size, tag = ENTRY.unpack_from(segment.mapped(), at - segment.start)
        return offset, size, tag

    def first_at_or_after(self, commitlog_offset: int, start: int | None = None) -> int:
        """The first queue offset from ``start`` on (default: the queue's first) whose entry
        points at or after ``commitlog_offset``; ``max_offset`` when none does. Entries
        are in commitlog order, so a binary search finds it."""
        loaded = self._loaded
        if loaded is not None and (start is None or start == self.min_offset == loaded.first):
            if loaded.last_offset < commitlog_offset:
                return self.max_offset
            if loaded.first_offset >= commitlog_offset and self.min_offset == loaded.first:
                return self.min_offset
        lo, hi = (self.min_offset if start is None else start), self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entry(mid)[0] < commitlog_offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def entries(self, start: int, end: int) -> Iterator[tuple[int, int, int]]:
        """(commitlog offset, size, tag code) for ``start <= n < end``, in order, unpacked
        in C a file's run at a time (a pull reads hundreds per request)."""
        return chain.from_iterable(ENTRY.iter_unpack(block) for block in self._blocks(start, end))

    def entry_array(self, start: int, end: int) -> npt.NDArray[np.void]:
        """The entries ``start <= n < end`` as one array of :data:`ENTRY_DTYPE`: a view
        of the file, or a copy where they lie in two; short where a file is missing."""
        blocks = [np.frombuffer(block, ENTRY_DTYPE) for block in self._blocks(start, end)]
        if len(blocks) == 1:
            return blocks[0]
        return np.concatenate(blocks) if blocks else np.empty(0, ENTRY_DTYPE)

    def _blocks(self, start: int, end: int) -> Iterator[memoryview]:
        at = start * ENTRY_SIZE
        stop = end * ENTRY_SIZE
        while at < stop:
            segment = self.segments.find(at)
            if segment is None:
                return
            limit = min(stop, segment.end)
            yield segment.mapped()[at - segment.start : limit - segment.start]
            at = limit

    def truncate_to_commitlog(self, commitlog_end: int) -> None:
        """Drop entries whose records lie at or past ``commitlog_end``.

        Entries are in commitlog order, so the cut is found by binary search: walking
        back entry by entry read every page of a cold queue file after a crash.
        """
        if self._loaded is not None and self._loaded.last_end <= commitlog_end:
            return  # what the start read says: nothing to cut, and no file mapped to see
        self._loaded = None
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            offset, size, _ = self.entry(mid)
            if size and offset + size <= commitlog_end:
                lo = mid + 1
            else:
                hi = mid
        if lo < self.max_offset:
            self._set_tail(None)
            self.segments.truncate(lo * ENTRY_SIZE)
            self.max_offset = lo

    def delete_before_commitlog(self, commitlog_min: int) -> None:
        """Follow the commitlog's retention: drop files wholly below its new minimum."""
        loaded = self._loaded
        if loaded is not None and loaded.first_offset >= commitlog_min:
            self.min_offset = loaded.first
            return
        self._loaded = None
        segments = self.segments.segments
        while len(segments) > 1:
            last_entry = (segments[0].end - ENTRY_SIZE) // ENTRY_SIZE
            offset, size, _ = self.entry(last_entry)
            if offset + size > commitlog_min:
                break
            self.segments.delete_before(segments[0].end)
            segments = self.segments.segments
        # Within the first file, skip entries whose records are gone.
        n = max(self.min_offset, segments[0].start // ENTRY_SIZE if segments else 0)
        while n < self.max_offset:
            offset, size, _ = self.entry(n)
            if size and offset >= commitlog_min:
                break
            n += 1
        self.min_offset = n

    def close(self) -> None:
        self._set_tail(None)
        self.segments.close()


class QueueTable:
    """Every consume queue of the store, by (topic, queue id), created on first use."""

    def __init__(
        self, root: Path, entries_per_segment: int, disk: Disk, pool: MappingPool | None = None
    ) -> None:
        self.root = root
        self.entries_per_segment = entries_per_segment
        self.disk = disk
        self.pool = pool
        """Bounds how many queue files stay mapped; None keeps every one mapped."""
        self.queues: dict[tuple[bytes, int], ConsumeQueue] = {}
        # The same queues by topic, then by queue id: the dispatcher's lookup, which
        # with ten thousand queues touches a list slot where a dict would touch an
        # entry, a key tuple and its int.
        self.rows: dict[bytes, list[ConsumeQueue | None]] = {}

    def load(self) -> bool:
        """Map every queue on disk; return False if any has a file missing in the middle."""
        self.root.mkdir(parents=True, exist_ok=True)
        complete = True
        with os.scandir(self.root) as scan:
            topic_dirs = sorted(e.name for e in scan if e.is_dir())
        for topic in topic_dirs:
            with os.scandir(self.root / topic) as scan:
                queue_ids = sorted(int(e.name) for e in scan if e.name.isdigit())
            for queue_id in queue_ids:
                complete &= self._make(topic.encode(), queue_id).load()
        return complete

    def _make(self, topic: bytes, queue_id: int) -> ConsumeQueue:
        queue = ConsumeQueue(
            self.root / topic.decode() / str(queue_id),
            topic.decode(),
            queue_id,
            self.entries_per_segment,
            self.disk,
            self.pool,
        )
        self.queues[(topic, queue_id)] = queue
        row = self.rows.setdefault(topic, [])
        if len(row) <= queue_id:
            row.extend([None] * (queue_id + 1 - len(row)))
        row[queue_id] = queue
        return queue

    def get(self, topic: bytes, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def get_or_create(self, topic: bytes, queue_id: int) -> ConsumeQueue:
        queue = self.queues.get((topic, queue_id))
        return queue if queue is not None else self._make(topic, queue_id)

    def next_offsets(self) -> QueueOffsets:
        """Where the appender continues each queue: at its end as dispatched."""
        return QueueOffsets((key, queue.max_offset) for key, queue in self.queues.items())

    def entries_below(self, commitlog_offset: int) -> int:
        """Sum over queues of how many entries point below ``commitlog_offset``.

        The checkpoint stores this sum so that a queue whose files vanished is noticed.
        """
        return sum(queue.first_at_or_after(commitlog_offset) for queue in self.queues.values())

    def dirty_segments(self) -> list[Segment]:
        """Files with entries not yet synced; call with the dispatcher held off."""
        for queue in self.queues.values():
            queue.settle()
        return [
            segment
            for queue in self.queues.values()
            for segment in queue.segments.segments
            if segment.written > segment.synced
        ]

    def close(self) -> None:
        for queue in self.queues.values():
            queue.close()
        self.queues = {}
        self.rows = {}
