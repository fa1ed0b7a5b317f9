"""Fixed-size memory-mapped segment files and the ordered queue of them that forms one log.

The commitlog and every consume queue are a :class:`SegmentQueue`: files of one size,
each named by the zero-padded log offset of its first byte, so the file holding any offset
is found by arithmetic. Writes go through the mapping (a memcpy into the page cache);
durability comes from :class:`Disk`, the seam a test replaces to lose unsynced bytes.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Final, Protocol

from metaq.broker.store.mapping import Mapping, MappingPool

log = logging.getLogger(__name__)

NAME_WIDTH: Final = 20
UNMAPPED: Final = memoryview(b"")
"""The ``view`` of a segment whose mapping the pool has taken back."""
_PREFAULT_CHUNK: Final = 4 * 1024 * 1024


class Segment:
    """One mapped file covering log offsets ``[start, start + size)``.

    ``written`` is the high-water mark of bytes its owner has written, which the disk
    seam reads to know what a sync made durable. A reader's memoryview keeps the mapping
    alive (:class:`~metaq.broker.store.mapping.Mapping`): :meth:`close` defers until the
    last reader lets go and no reader ever sees an unmapped page.

    A segment in a :class:`~metaq.broker.store.mapping.MappingPool` may be unmapped
    while idle: ``view`` is :data:`UNMAPPED` then, and :meth:`mapped` maps it again. Code that reads
    such a segment takes its view from :meth:`mapped` and holds it while it works.
    """

    __slots__ = (
        "closed",
        "fd",
        "mapping",
        "path",
        "pool",
        "size",
        "start",
        "synced",
        "used",
        "view",
        "written",
    )

    def __init__(
        self,
        path: Path,
        start: int,
        size: int,
        fd: int | None,
        mapping: Mapping | None,
        pool: MappingPool | None = None,
    ) -> None:
        self.path = path
        self.start = start
        self.size = size
        self.fd = fd
        self.mapping = mapping
        # One long-lived view of the mapping: slicing it is zero-copy.
        self.view = UNMAPPED if mapping is None else mapping.view
        self.written = 0
        self.synced = 0
        self.closed = False
        self.used = True
        self.pool = pool
        if pool is not None and mapping is not None:
            with pool.lock:
                pool.admit(self)

    @property
    def end(self) -> int:
        return self.start + self.size

    def mapped(self) -> memoryview:
        """The file's bytes, mapped again first if the pool unmapped them; ValueError
        once the segment is closed."""
        view = self.view
        if view is not UNMAPPED:
            self.used = True
            return view
        return self._map_again()

    def write(self, at: int, data: bytes) -> None:
        """Write ``data`` at ``at``: through the mapping, mapped again first while the
        pool has room, or else into the file. Mapping a file again (evicting another)
        and faulting its page in costs several times a write through a descriptor
        opened for it (docs/benchmarks.md, "Queues per broker"): with more queues
        written than the pool holds, a queue written but not read is not worth a
        mapping. Both reach the same page cache pages, so a reader's mapping sees the
        bytes either way."""
        view = self.view  # held: the pool leaves the mapping alone meanwhile
        pool = self.pool
        if view is UNMAPPED and pool is not None and len(pool) < pool.capacity:
            view = self._map_again()
        if view is not UNMAPPED:
            self.used = True
            view[at : at + len(data)] = data
            return
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.pwrite(fd, data, at)
        finally:
            os.close(fd)

    def _map_again(self) -> memoryview:
        pool = self.pool
        if pool is None:
            raise ValueError(f"segment {self.path} is closed")
        with pool.lock:
            view = self.view
            if view is not UNMAPPED:
                return view
            if self.closed:
                raise ValueError(f"segment {self.path} is closed")
            fd = os.open(self.path, os.O_RDWR)
            try:
                mapping = Mapping(fd, self.size)
            finally:
                os.close(fd)
            mapping.madvise(mmap.MADV_RANDOM)
            self.mapping = mapping
            self.view = view = mapping.view
            pool.mapped_again += 1
            pool.admit(self)  # the local name keeps this one mapped meanwhile
            return view

    def unmap(self) -> bool:
        """Unmap the file (it stays open for :meth:`mapped`) unless a reader holds a
        view; whether it is unmapped. For the pool, under its lock."""
        mapping = self.mapping
        if mapping is None:
            return True
        # Hidden first, so nobody takes the view while it is checked for readers.
        self.view = UNMAPPED
        if not mapping.close():
            self.view = mapping.view
            return False
        self.mapping = None
        return True

    def flush(self) -> None:
        """Write the file's dirty pages back and wait (msync, or fdatasync if unmapped)."""
        mapping = self.mapping
        if mapping is not None:
            try:
                mapping.flush()
                return
            except ValueError:
                pass  # unmapped meanwhile: its pages are the file's, sync those
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def close(self) -> bool:
        """Unmap if no reader holds a view; return whether it is closed."""
        pool = self.pool
        with pool.lock if pool is not None else contextlib.nullcontext():
            if not self.unmap():
                return False
            self.closed = True
            if pool is not None:
                pool.forget(self)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        return True

    def __repr__(self) -> str:
        return f"Segment({self.path.name}, written={self.written})"


def no_higher_priority() -> None:
    """Run the calling thread at nice 0 at best, whatever its process took.

    Pre-faulting a commitlog file of fresh memory costs a VM whose host takes back free
    guest pages a lot of CPU, in bursts. A new thread takes its creator's priority, and
    at the broker's nice -5 those bursts went ahead of the producers and consumers
    sharing its cores: with one group draining a backlog on two cores, the producer's
    longest sends and its p99 rose several times over (docs/benchmarks.md). The file is
    wanted only when the one before it is full, seconds later at such rates."""
    thread = threading.get_native_id()
    if os.getpriority(os.PRIO_PROCESS, thread) < 0:
        os.setpriority(os.PRIO_PROCESS, thread, 0)


def open_segment(
    path: Path,
    start: int,
    size: int,
    *,
    preallocate: bool,
    keep_fd: bool,
    prefault: bool | None = None,
    pool: MappingPool | None = None,
) -> Segment:
    """Open or create a segment file of exactly ``size`` bytes and map it.

    ``preallocate`` reserves the blocks when the file is new (the commitlog's, whose
    pages are all written soon, and read in order) and, with ``prefault`` (by default
    the same), faults the pages in; otherwise the file stays sparse and is mapped for
    random access, which is what ten thousand mostly idle consume queues need. An
    existing file is mapped as it is. A new file that cannot be made is removed again, so
    a full disk leaves no short file behind for the next start to trip on. With ``pool``
    the file may be unmapped while idle (:class:`Segment`).
    """
    if prefault is None:
        prefault = preallocate
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        current = os.fstat(fd).st_size
        if current not in (0, size):
            raise OSError(
                f"segment {path} is {current} bytes, expected {size}: the segment size in the "
                "config differs from the one this data was written with"
            )
        if current == 0:
            if preallocate:
                # Reserved blocks: a store through the mapping never meets a full disk,
                # which would be a SIGBUS rather than an error.
                os.posix_fallocate(fd, 0, size)
                if prefault:
                    # Writing zeros now makes the page cache hold every page, so appends
                    # later are a plain memcpy instead of a page fault each, an order of
                    # magnitude cheaper. Reading the file in instead leaves the pages clean,
                    # and the first write to each then costs the appending thread more
                    # (docs/producer.md).
                    zeros = bytes(min(_PREFAULT_CHUNK, size))
                    for at in range(0, size, len(zeros)):
                        os.pwrite(fd, zeros[: size - at], at)
            else:
                os.ftruncate(fd, size)
        mapping = Mapping(fd, size)
        if not preallocate:
            # A first write to a sparse page would otherwise read ahead (and zero-fill)
            # megabytes around it: with 10,000 queues that thrashed the page cache.
            mapping.madvise(mmap.MADV_RANDOM)
    except BaseException:
        os.close(fd)
        if created:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        raise
    if keep_fd:
        return Segment(path, start, size, fd, mapping, pool)
    os.close(fd)
    return Segment(path, start, size, None, mapping, pool)


def _zero_from(segment: Segment, at: int) -> None:
    """Zero ``segment`` from ``at`` to its end without writing most of those bytes.

    Writing zeros through the mapping faults every page in first: after a crash with a
    cold page cache that read a whole gigabyte segment back from disk, for seconds. The
    partial page is written; whole pages are punched out (MADV_REMOVE frees them and
    their blocks, and they read back as zeros), then reserved again for appends.
    """
    page_end = min(segment.size, -(-at // mmap.PAGESIZE) * mmap.PAGESIZE)
    view = segment.mapped()  # held: the pool leaves the mapping alone meanwhile
    view[at:page_end] = bytes(page_end - at)
    rest = segment.size - page_end
    if rest <= 0:
        return
    assert segment.mapping is not None
    try:
        segment.mapping.madvise(mmap.MADV_REMOVE, page_end, rest)
    except OSError:  # a filesystem that cannot punch holes: write the zeros after all
        view[page_end:] = bytes(rest)
        return
    if segment.fd is not None:
        os.posix_fallocate(segment.fd, page_end, rest)


def segment_name(start: int) -> str:
    return f"{start:0{NAME_WIDTH}d}"


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Disk(Protocol):
    """Makes written segment bytes durable; tests substitute one that can forget."""

    def sync(self, segment: Segment) -> None:
        """Make everything written to ``segment`` so far durable."""

    def sync_all(self, segments: Sequence[Segment]) -> None:
        """Make everything written to all of ``segments`` durable, in one go if possible."""


def _load_syncfs() -> ctypes._NamedFuncPointer | None:
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    func = getattr(ctypes.CDLL(libc_name, use_errno=True), "syncfs", None)
    return func


class RealDisk:
    """fdatasync for one file; syncfs (one call for the whole filesystem) for many."""

    def __init__(self) -> None:
        self._syncfs = _load_syncfs()

    def sync(self, segment: Segment) -> None:
        upto = segment.written
        if segment.fd is not None:
            os.fdatasync(segment.fd)
        else:
            segment.flush()
        segment.synced = max(segment.synced, upto)

    def sync_all(self, segments: Sequence[Segment]) -> None:
        if not segments:
            return
        marks = [s.written for s in segments]
        if self._syncfs is None:
            os.sync()
        else:
            fd = os.open(segments[0].path.parent, os.O_RDONLY)
            try:
                # ctypes drops the GIL around the call, so the event loop keeps running.
                if self._syncfs(fd) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"syncfs failed: {os.strerror(err)}")
            finally:
                os.close(fd)
        for segment, mark in zip(segments, marks, strict=True):
            segment.synced = max(segment.synced, mark)


class SegmentQueue:
    """The ordered files of one log, all ``segment_bytes`` long and contiguous.

    Files are created on demand; with ``preallocate`` the next one is made ready in a
    background thread before the current one fills, so an append never waits for a file
    to be created and faulted in. ``may_allocate(nbytes)`` is asked before a file's
    blocks are reserved: when it says no, no file is made (and an append needing one
    fails with ENOSPC) rather than the filesystem being filled to the last block.
    """

    def __init__(
        self,
        directory: Path,
        segment_bytes: int,
        *,
        preallocate: bool,
        keep_fd: bool,
        disk: Disk,
        prefault: bool | None = None,
        may_allocate: Callable[[int], bool] | None = None,
        pool: MappingPool | None = None,
    ) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.preallocate = preallocate
        self.prefault = preallocate if prefault is None else prefault
        self.keep_fd = keep_fd
        self.disk = disk
        self.may_allocate = may_allocate
        self.pool = pool
        self.segments: list[Segment] = []
        self._retired: list[Segment] = []
        self._lock = threading.Lock()
        self._allocator: ThreadPoolExecutor | None = None
        self._next: Future[Segment] | None = None

    def load(self) -> list[int]:
        """Map the files already on disk; return the start offsets of any gaps found.

        A gap (a missing file between two present ones) cannot be filled from this log
        alone; the caller decides whether it can rebuild or must refuse to start.
        """
        try:
            with os.scandir(self.directory) as scan:
                entries = sorted((e for e in scan if e.name.isdigit()), key=lambda e: e.name)
        except FileNotFoundError:
            self.directory.mkdir(parents=True, exist_ok=True)
            entries = []
        gaps: list[int] = []
        for entry in entries:
            path = self.directory / entry.name
            start = int(entry.name)
            if start % self.segment_bytes:
                raise OSError(
                    f"segment file {path} does not start on a multiple of the segment size "
                    f"{self.segment_bytes}: the config's segment size differs from the data's"
                )
            if self.segments and start != self.segments[-1].end:
                gaps.append(self.segments[-1].end)
            if self.pool is not None and entry.stat().st_size == self.segment_bytes:
                # Mapped when first touched: a start with 100,000 queues maps none.
                self.segments.append(
                    Segment(path, start, self.segment_bytes, None, None, self.pool)
                )
                continue
            # Existing files are never refilled; the flag still picks the access pattern.
            self.segments.append(self._open_file(path, start, self.prefault))
        return gaps

    @property
    def min_offset(self) -> int:
        return self.segments[0].start if self.segments else 0

    def find(self, offset: int) -> Segment | None:
        """The segment holding ``offset``, or None if no file covers it."""
        segments = self.segments
        if not segments:
            return None
        index = (offset - segments[0].start) // self.segment_bytes
        if 0 <= index < len(segments):
            segment = segments[index]
            # Gaps (possible only while a rebuild repairs them) break the arithmetic.
            if segment.start <= offset < segment.end:
                return segment
            for segment in segments:
                if segment.start <= offset < segment.end:
                    return segment
        return None

    def segment_for_write(self, offset: int, *, prefault: bool | None = None) -> Segment:
        """The segment to write ``offset`` into, creating files as needed.

        ``prefault`` overrides the queue's choice for files made now: a writer that
        fills them with ``os.pwrite`` (a slave copying its master) pays no page faults,
        and zeros written first would only be written over.
        """
        last = self.segments[-1] if self.segments else None
        if last is not None and last.start <= offset < last.end:
            return last
        found = self.find(offset)
        if found is not None:
            return found
        if prefault is None:
            prefault = self.prefault
        start = offset - offset % self.segment_bytes
        segment = self._take_prepared(start) or self._open(start, prefault)
        with self._lock:
            # Build a new list: readers search this one without the lock, and an in-place
            # sort empties the list while it runs.
            self.segments = sorted([*self.segments, segment], key=lambda s: s.start)
        if self.preallocate:
            self._prepare(start + self.segment_bytes, prefault)
        return segment

    def _open_file(self, path: Path, start: int, prefault: bool) -> Segment:
        """The segment file at ``path``, opened with this log's settings."""
        return open_segment(
            path,
            start,
            self.segment_bytes,
            preallocate=self.preallocate,
            keep_fd=self.keep_fd,
            prefault=prefault,
            pool=self.pool,
        )

    def _open(self, start: int, prefault: bool) -> Segment:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / segment_name(start)
        if (
            self.preallocate
            and self.may_allocate is not None
            and not path.exists()
            and not self.may_allocate(self.segment_bytes)
        ):
            raise OSError(
                errno.ENOSPC,
                f"no room for commitlog segment {path.name} ({self.segment_bytes} bytes) "
                "above the disk reserve",
            )
        segment = self._open_file(path, start, prefault)
        if self.preallocate:
            # The commitlog's file names must survive a power loss with its data. Sparse
            # logs (consume queues, index) are rebuilt from the commitlog, and the next
            # checkpoint's filesystem-wide sync covers their names anyway.
            fsync_dir(self.directory)
        return segment

    def _prepare(self, start: int, prefault: bool) -> None:
        if self._allocator is None:
            self._allocator = ThreadPoolExecutor(
                1, thread_name_prefix="segment-alloc", initializer=no_higher_priority
            )
        self._next = self._allocator.submit(self._open, start, prefault)

    def _take_prepared(self, start: int) -> Segment | None:
        prepared, self._next = self._next, None
        if prepared is None:
            return None
        try:
            segment = prepared.result()
        except OSError as exc:
            # No room then; the caller opens it now, which asks again.
            if exc.errno != errno.ENOSPC:
                log.warning("preparing segment %d failed, opening it when needed: %s", start, exc)
            return None
        if segment.start == start:
            return segment
        self._discard(segment)
        return None

    def pending_bytes(self) -> int:
        """Bytes the next file will take that the filesystem does not show as taken yet."""
        if not self.preallocate:
            return 0
        prepared = self._next
        if prepared is not None and prepared.done() and prepared.exception() is None:
            return 0
        return self.segment_bytes

    def _discard(self, segment: Segment) -> None:
        segment.close()
        with contextlib.suppress(FileNotFoundError):
            segment.path.unlink()

    def truncate(self, offset: int) -> None:
        """Forget everything from ``offset`` on: zero the rest of its file, delete later ones.

        Zeros rather than a shorter file, because a reader's view past the cut would
        fault (SIGBUS) on a truncated mapping but reads harmless zeros here.
        """
        keep: list[Segment] = []
        for segment in self.segments:
            if segment.end <= offset:
                keep.append(segment)
            elif segment.start <= offset:
                cut = offset - segment.start
                _zero_from(segment, cut)
                segment.written = segment.synced = cut
                keep.append(segment)
            else:
                self._retire(segment)
        with self._lock:
            self.segments = keep

    def delete_before(self, offset: int) -> list[Segment]:
        """Delete whole files that end at or before ``offset``; the last file always stays."""
        doomed = [s for s in self.segments[:-1] if s.end <= offset]
        if doomed:
            with self._lock:
                self.segments = self.segments[len(doomed) :]
            for segment in doomed:
                self._retire(segment)
        return doomed

    def _retire(self, segment: Segment) -> None:
        # Unlinking frees the name now; the blocks go when the last mapping closes.
        with contextlib.suppress(FileNotFoundError):
            segment.path.unlink()
        self._retired.append(segment)
        self.close_retired()

    def close_retired(self) -> int:
        """Unmap retired files no reader holds any more; return how many still wait."""
        self._retired = [s for s in self._retired if not s.close()]
        return len(self._retired)

    def close(self) -> None:
        if self._next is not None:
            with contextlib.suppress(Exception):
                self._discard(self._next.result())
            self._next = None
        if self._allocator is not None:
            self._allocator.shutdown(wait=True)
            self._allocator = None
        for segment in self.segments:
            if not segment.close():
                self._retired.append(segment)
        self.segments = []
        self.close_retired()
