"""What the process may take of the host (file descriptors, CPU priority) and what the
data plane may take of the process (request memory).

File descriptors are shared by the store and the connections. The store holds few and a
number that does not grow with queues (a mapped file keeps none:
:mod:`metaq.broker.store.mapping`), but it needs one now and then (a new segment, the
checkpoint), and peers can open connections at will: a descriptor the store cannot get
stops its work until one frees up. :class:`DescriptorBudget` keeps one account of them:
connections take what the broker's own files and ``fd_reserve`` leave.
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
from collections.abc import Callable
from typing import Final, Protocol

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


class DescriptorBudget:
    """One account of the open-file limit: what the broker holds open now (store files,
    HTTP, links to the nameservers), ``fd_reserve`` for the files the store opens as it
    goes (segments, the checkpoint, state files), and the rest for connections.

    The data plane takes at most :meth:`connection_slots` connections. Counts come from
    :meth:`recount` (every data-plane sweep). Queues cost none, so topics are not
    counted.
    """

    def __init__(self, *, nofile: int, fd_reserve: int) -> None:
        self.nofile = nofile
        """The soft RLIMIT_NOFILE, as of the last count."""
        self.fd_reserve = fd_reserve
        self.held = 0
        """Descriptors open at the last count, those of connections not included."""
        self._counting = asyncio.Lock()

    def connection_slots(self) -> int:
        """Connections that fit beside the broker's own descriptors (may be below 0)."""
        return self.nofile - self.held - self.fd_reserve

    def _apply(self, nofile: int, open_now: int | None, connections: int) -> None:
        self.nofile = nofile
        if open_now is not None:
            self.held = max(open_now - connections, 0)

    def recount_now(self, connections: int) -> None:
        """Count on this thread (start-up)."""
        self._apply(nofile_limit(), open_fds(), connections)

    async def recount(self, connections: Callable[[], int]) -> None:
        """Count on a worker thread (listing thousands of descriptors takes
        milliseconds); ``connections()`` is how many are open when it ends."""
        async with self._counting:
            open_now = await asyncio.to_thread(open_fds)
            self._apply(nofile_limit(), open_now, connections())


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
