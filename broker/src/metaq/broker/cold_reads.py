"""Pulls for records the page cache no longer holds: read in on a thread, then answered.

The broker hands back the log's pages that lie more than ``store.commitlog_cache_bytes``
behind its head (:mod:`metaq.broker.store.page_cache`), so a consumer group catching up
on a backlog reads from disk. Answered on the event loop, such a pull would take its
page faults inside the socket write: each major fault stops the loop for a disk read
(with the GIL held, since the copy out of the mapping is what faults), and every send
and every real-time pull on the broker waits behind it. MetaQ 2.0's own accumulation
test shows the result: sends slowed to a crawl while consumers read from disk
(docs/benchmarks.md, ``make bench-accumulation``).

So a pull whose first record lies below what was handed back goes to a reader thread
first. The thread reads the span of the log the pull covers into the page cache with
``sendfile`` to ``/dev/null`` (the GIL is released while the disk reads, no byte is
copied out to the broker, and the pages land in the same page cache the mapping
shows), asks the kernel to read ahead :data:`READ_AHEAD_BYTES` beyond it
(``posix_fadvise(WILLNEED)``: the group's next pulls, of this queue and of the queues
interleaved with it in the log, find their pages there), and then the loop answers as
usual from the now resident pages (large answers by ``sendfile`` too,
:mod:`metaq.broker.zero_copy`). The records are still never decoded.

Taken off the loop, a drain still takes CPU: on a small host a group catching up as fast
as it can leaves the producers and the real-time groups waiting for the cores. An
operator can give cold pulls a budget (``cold_read_bytes_per_s``, :class:`ReadBudget`),
as Kafka's fetch quotas and Pulsar's dispatch rates do: each cold pull then waits its
turn before it is read in, and the groups reading from memory are never held.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Final, NamedTuple

from metaq.broker.store.segment import SegmentQueue

log = logging.getLogger(__name__)

MIB: Final = 1024 * 1024
READ_AHEAD_BYTES: Final = 16 * MIB
"""Asked of the kernel beyond each cold pull's span: sized to about a second of a drain's
reads, and a few segments' worth of other queues' records."""
MAX_SPAN_BYTES: Final = 64 * MIB
"""At most this much of the log is read in for one pull (a pull of a sparse queue can
span far more of the log than it returns); the rest faults in as before."""
THREADS: Final = 2
"""Two groups far behind in different parts of the log do not queue behind each other."""
BURST_S: Final = 0.1
"""A budget lets this long's worth of bytes go at once after a quiet spell."""
MAX_WAIT_S: Final = 2.0
"""No cold pull waits longer for its turn, however many queue for it: a consumer gives
up on a pull after its long poll plus 5 s. Past this the budget is exceeded, not the
consumer's patience."""


class Piece(NamedTuple):
    """A byte range of one segment file."""

    path: Path
    position: int
    length: int


def pieces(segments: SegmentQueue, start: int, end: int) -> list[Piece]:
    """The segment file ranges covering log offsets ``[start, end)`` (at most
    :data:`MAX_SPAN_BYTES`); ranges outside every file are left out."""
    end = min(end, start + MAX_SPAN_BYTES)
    found: list[Piece] = []
    at = start
    while at < end:
        segment = segments.find(at)
        if segment is None:
            break
        position = at - segment.start
        length = min(segment.size - position, end - at)
        found.append(Piece(segment.path, position, length))
        at += length
    return found


def read_in(parts: list[Piece], sink: int) -> None:
    """Bring ``parts`` into the page cache and start the read-ahead after the last one.
    Runs on a reader thread; a file retention deleted meanwhile is skipped.

    The pages are read by ``sendfile`` into ``sink`` (``/dev/null``): the kernel reads
    them in without copying them out to the broker, which then throws them away."""
    for index, part in enumerate(parts):
        try:
            fd = os.open(part.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            done = 0
            while done < part.length:
                got = os.sendfile(sink, fd, part.position + done, part.length - done)
                if got <= 0:
                    break  # the file ends early (cut by recovery): nothing more to read
                done += got
            if index == len(parts) - 1:
                os.posix_fadvise(
                    fd, part.position + part.length, READ_AHEAD_BYTES, os.POSIX_FADV_WILLNEED
                )
        finally:
            os.close(fd)


@functools.cache
def _sink() -> int:
    """``/dev/null``, opened once for the process: what read-ins are sent to."""
    return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)


class ReadBudget:
    """Spaces reads to ``bytes_per_s``: each is given the time the bytes before it leave
    free (a virtual clock, so no task or timer runs while nothing waits)."""

    def __init__(self, bytes_per_s: int) -> None:
        self._rate = bytes_per_s
        self._free_at = 0.0

    def wait(self, nbytes: int, now: float) -> float:
        """Seconds a read of ``nbytes`` starting at ``now`` waits; its bytes are counted."""
        start = min(max(self._free_at, now - BURST_S), now + MAX_WAIT_S)
        self._free_at = start + nbytes / self._rate
        return max(0.0, start - now)


class ColdReads:
    """Tells a cold pull from a warm one, and reads cold ones in before their answer.

    ``released`` is the log offset below which the broker handed pages back to the
    kernel (0 when it keeps everything), read on the loop at each pull.
    """

    def __init__(
        self,
        segments: SegmentQueue,
        released: Callable[[], int],
        budget: ReadBudget | None = None,
        on_waited: Callable[[float], None] | None = None,
    ) -> None:
        self._segments = segments
        self._released = released
        self._budget = budget
        self._on_waited = on_waited
        self._loop = asyncio.get_running_loop()
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    def set_budget(self, bytes_per_s: int) -> None:
        """A new budget (0: none) from the next cold pull on (a live setting change)."""
        self._budget = ReadBudget(bytes_per_s) if bytes_per_s else None

    def is_cold(self, start: int) -> bool:
        return start < self._released()

    def read_then(self, start: int, end: int, nbytes: int, answer: Callable[[], None]) -> None:
        """Read log offsets ``[start, end)`` in on a reader thread, then call ``answer``
        on the loop (also when the read failed: the answer then faults its pages in).
        ``nbytes`` is what the answer carries, counted against the budget."""
        wait = 0.0 if self._budget is None else self._budget.wait(nbytes, time.monotonic())
        if wait > 0.0:
            if self._on_waited is not None:
                self._on_waited(wait)
            self._loop.call_later(wait, self._read_then, start, end, answer)
        else:
            self._read_then(start, end, answer)

    def _read_then(self, start: int, end: int, answer: Callable[[], None]) -> None:
        if self._closed:
            return  # stopped while it waited: its connection is closing too
        parts = pieces(self._segments, start, end)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(THREADS, thread_name_prefix="cold-read")
        future = self._executor.submit(self._read, parts)

        def done(finished: Future[None]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed at shutdown
                self._loop.call_soon_threadsafe(self._answer, finished, answer)

        future.add_done_callback(done)

    def _read(self, parts: list[Piece]) -> None:
        read_in(parts, _sink())

    def _answer(self, finished: Future[None], answer: Callable[[], None]) -> None:
        if not finished.cancelled() and (exc := finished.exception()) is not None:
            log.warning("reading cold commitlog pages in failed, answering anyway: %s", exc)
        answer()

    def close(self) -> None:
        """Stop the reader threads; reads not started are dropped with their answers
        (the connections are closing too)."""
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
