"""What the process may take of the host (file descriptors, CPU priority) and what the
data plane may take of the process (request memory).

File descriptors are shared by the store and the connections, and both grow: each
consume queue holds one once it has a message, and peers can open connections at will.
A descriptor the store cannot get (a new consume-queue file, the checkpoint) stops its
work until one frees up. :class:`DescriptorBudget` keeps one account of them: connections
take what the store's files, the queues still to be opened and ``fd_reserve`` leave, and a
topic whose queues would leave fewer than ``min_connection_slots`` is refused.
Connections may also hold a partly received frame of up to ``max_frame_bytes`` each:
:class:`RequestBudget` caps the bytes of incomplete frames across all connections, and
:func:`too_slow` tells a frame that trickles in (holding its reservation) from one that
is arriving.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
from collections import deque
from collections.abc import Callable, Iterable
from typing import Final, Protocol

from metaq.common.errors import ErrorCode, MetaqError
from metaq.common.model import TopicConfig

log = logging.getLogger(__name__)

_UNLIMITED: Final = 1 << 20
"""What an unlimited RLIMIT_NOFILE counts as (the kernel's default nr_open)."""


def raise_nofile_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (the default soft limit, often
    1024, is far below what a broker with many clients and queues needs); return the
    soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
    elif hard == resource.RLIM_INFINITY and soft == resource.RLIM_INFINITY:
        return _UNLIMITED
    return soft


def nofile_limit() -> int:
    """The soft RLIMIT_NOFILE in force now (``prlimit`` may change it while we run)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return _UNLIMITED if soft == resource.RLIM_INFINITY else soft


def set_nice(nice: int) -> int:
    """Run this process at CPU priority ``nice``; return the nice value in force.

    Linux keeps a nice value per thread and a new thread takes its creator's, so every
    thread running now is set (numpy's BLAS pool starts one at import) and those started
    after follow, but for the commitlog's file maker, which keeps to nice 0
    (:func:`metaq.broker.store.segment.no_higher_priority`). A broker may share its
    cores with its clients (two consumer processes draining a backlog beside it on a
    2-core host): at equal priority its loop spent a good part of a drain runnable but
    not running (docs/benchmarks.md), every wait holding up the answers all clients
    were waiting on.
    """
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if nice == current:
        return current
    try:
        for thread in os.listdir("/proc/self/task"):
            os.setpriority(os.PRIO_PROCESS, int(thread), nice)
    except PermissionError:
        log.warning(
            "running at nice %d, not the configured %d: a higher priority needs root, "
            "CAP_SYS_NICE or RLIMIT_NICE (systemd: LimitNICE=%d); set nice = %d to keep "
            "the priority the broker is started with",
            current, nice, nice, current,
        )  # fmt: skip
        return current
    return nice


def open_fds() -> int | None:
    """File descriptors this process has open, or None where that cannot be counted."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


QUEUE_DESCRIPTORS: Final = 1
"""Descriptors a consume queue holds once it has a message: its file stays mapped, and
although the store closes its own descriptor at once, CPython 3.11's ``mmap.mmap`` keeps a
duplicate for as long as the mapping lives (3.13's ``trackfd=False`` would keep none).
A queue holds one more per file it fills (``store.consume_queue_segment_entries``
entries each) until retention deletes them: ``fd_reserve`` is for that growth."""


class OutOfDescriptors(MetaqError):
    """A topic change would leave the broker fewer connection slots than
    ``min_connection_slots``; nothing was changed. Another broker may have room."""

    retriable = True
    code = ErrorCode.STORE_UNAVAILABLE


class DescriptorBudget:
    """One account of the open-file limit: what the broker holds open now (store files,
    HTTP, links to the nameservers), one descriptor for each queue of a topic that has no
    file open yet (it will, with its first message), ``fd_reserve`` for the files the
    store opens as it grows (segments, the checkpoint), and the rest for connections.

    The data plane takes at most :meth:`connection_slots` connections, and
    :meth:`admit` refuses a topic change that would leave fewer than
    ``min_connection_slots``: the two read the same figures, so an admitted topic's
    queues can open their files without taking the descriptors clients connect with.
    ``queues_without_files(config)`` counts the queues of ``config`` with no file open
    yet; ``topics()`` is every topic served. Counts come from :meth:`recount` (every
    data-plane sweep, and before an admin topic change).
    """

    def __init__(self, *, nofile: int, fd_reserve: int, min_connection_slots: int) -> None:
        self.nofile = nofile
        """The soft RLIMIT_NOFILE, as of the last count."""
        self.fd_reserve = fd_reserve
        self.min_connection_slots = min_connection_slots
        self.held = 0
        """Descriptors open at the last count, those of connections not included."""
        self.unopened = 0
        """Queues of the topic table without a file open, at the last count."""
        self.promised = 0
        """Queues admitted since the last count began (it did not see them)."""
        self.queues_without_files: Callable[[TopicConfig], int] = lambda _config: 0
        self.topics: Callable[[], Iterable[TopicConfig]] = tuple
        self._counting = asyncio.Lock()

    def connection_slots(self) -> int:
        """Connections that fit beside the broker's own descriptors (may be below 0)."""
        queues = (self.unopened + self.promised) * QUEUE_DESCRIPTORS
        return self.nofile - self.held - queues - self.fd_reserve

    def _measure(self) -> tuple[int, int | None, int]:
        """The limit, the open descriptors and the queues without files, now. Listing
        tens of thousands of descriptors takes milliseconds: call it off the loop."""
        unopened = sum(self.queues_without_files(config) for config in self.topics())
        return nofile_limit(), open_fds(), unopened

    def _apply(self, measured: tuple[int, int | None, int], connections: int, seen: int) -> None:
        self.nofile, open_now, self.unopened = measured
        if open_now is not None:
            self.held = max(open_now - connections, 0)
        self.promised -= seen

    def recount_now(self, connections: int) -> None:
        """Count on this thread (start-up)."""
        self._apply(self._measure(), connections, self.promised)

    async def recount(self, connections: Callable[[], int]) -> None:
        """Count on a worker thread; ``connections()`` is how many are open when it ends."""
        async with self._counting:  # one at a time: each settles the promises it saw
            seen = self.promised
            measured = await asyncio.to_thread(self._measure)
            self._apply(measured, connections(), seen)

    def admit(self, config: TopicConfig, previous: TopicConfig | None) -> None:
        """Take ``config`` (in place of ``previous``) into the account, or raise
        :class:`OutOfDescriptors` saying which limit to raise."""
        added = self.queues_without_files(config)
        if previous is not None:
            added -= self.queues_without_files(previous)
        if added <= 0:
            return
        left = self.connection_slots() - added * QUEUE_DESCRIPTORS
        floor = self.min_connection_slots
        if left >= floor:
            self.promised += added
            return
        short = floor - left
        fewer = -(-short // QUEUE_DESCRIPTORS)
        raise OutOfDescriptors(
            f"topic {config.name!r} is refused: its {added} queues without a file yet need "
            f"a file descriptor each (a queue's file stays mapped, and the mapping holds "
            f"one), which would leave {max(left, 0)} for client connections, fewer than "
            f"min_connection_slots={floor}. Of the broker's open-file limit of "
            f"{self.nofile}, {self.held} are open, {self.unopened + self.promised} are set "
            f"aside for other queues not written yet and fd_reserve={self.fd_reserve} for "
            f"the store's next files. Raise the limit to at least {self.nofile + short} "
            "(ulimit -n where the broker starts, LimitNOFILE= in its systemd unit, "
            "metaq_nofile in the Ansible deploy; a running broker also takes a soft limit "
            f"raised with prlimit --pid), or give the topic {fewer} fewer queues here"
        )


class Waiter(Protocol):
    def granted(self) -> None:
        """The bytes it asked for are reserved now: read on."""


class RequestBudget:
    """Bytes of incomplete request frames, reserved whole when a frame's prefix arrives.

    A frame that fits is reserved at once, even while larger ones wait. Those that do
    not fit wait (their connection is not read) and are served in arrival order as room
    frees, each one that fits. A holder can always finish its frame and the cap is at
    least one frame, so waiting ends once holders' peers send what they announced (or
    the arrival-rate check or the idle timeout closes them).

    The last ``small_reserve_bytes`` may be reserved only by frames of at most
    ``small_max_bytes``: peers that announce huge frames and stall fill at most the
    rest, so everyone's small requests, which arrive in pieces too, still go at once.
    """

    def __init__(
        self, max_bytes: int, small_reserve_bytes: int = 0, small_max_bytes: int = 0
    ) -> None:
        self.max_bytes = max_bytes
        self.small_max_bytes = small_max_bytes
        self.large_max_bytes = max_bytes - small_reserve_bytes
        """What frames larger than ``small_max_bytes`` may hold together."""
        self.used = 0
        self._waiting: deque[tuple[Waiter, int]] = deque()

    def _fits(self, nbytes: int) -> bool:
        cap = self.max_bytes if nbytes <= self.small_max_bytes else self.large_max_bytes
        return self.used + nbytes <= cap

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def reserve(self, waiter: Waiter, nbytes: int) -> bool:
        """Reserve at once and return True, or queue ``waiter`` and return False."""
        if self._fits(nbytes):
            self.used += nbytes
            return True
        self._waiting.append((waiter, nbytes))
        return False

    def release(self, nbytes: int) -> None:
        self.used -= nbytes
        if not self._waiting:
            return
        still: deque[tuple[Waiter, int]] = deque()
        granted: list[Waiter] = []
        for waiter, wanted in self._waiting:
            if self._fits(wanted):
                self.used += wanted
                granted.append(waiter)
            else:
                still.append((waiter, wanted))
        self._waiting = still
        for waiter in granted:
            waiter.granted()

    def forget(self, waiter: Waiter) -> None:
        """``waiter`` went away before its turn."""
        self._waiting = deque(entry for entry in self._waiting if entry[0] is not waiter)


STALL_WINDOWS: Final = 4
"""With nobody waiting for request memory, an incomplete frame that got no byte for this
many ``request_arrival_window_s`` is a dead peer's (20 s by default), not a sender taken
off the CPU for a moment."""


def too_slow(
    arrived_bytes: int,
    window_s: float,
    min_bytes_per_s: int,
    window_length_s: float,
    *,
    wanted: bool,
    stalled_s: float,
) -> bool:
    """Whether a frame that got ``arrived_bytes`` more in the last ``window_s`` seconds,
    and nothing in the last ``stalled_s``, holds its reservation of the request budget
    too long.

    A slow frame costs the broker only the memory it holds, and that matters only when
    others are ``wanted`` (waiting for room in the budget): then one that fell below
    ``min_bytes_per_s`` over a whole window of ``window_length_s`` gives its room up.
    Otherwise only a frame that got nothing for :data:`STALL_WINDOWS` windows does: a
    client that was descheduled for seconds on a loaded host, or sends slowly but
    steadily, is not a slow-loris while the memory it holds is not needed."""
    if not min_bytes_per_s:
        return False
    if not wanted:
        return stalled_s > STALL_WINDOWS * window_length_s
    if window_s < window_length_s:
        return False
    return arrived_bytes < min_bytes_per_s * window_s
