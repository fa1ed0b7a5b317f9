"""What the process may take of the host (file descriptors, CPU priority) and what the
data plane may take of the process (request memory).

Connections are the one resource peers can multiply at will. Each costs a file
descriptor, and a descriptor the store cannot get (a new consume-queue file, the
checkpoint) kills the thread that needed it; each may also hold a partly received frame
of up to ``max_frame_bytes``. :func:`connection_room` keeps connections clear of the
descriptors the broker needs itself, :class:`RequestBudget` caps the bytes of
incomplete frames across all connections, and :func:`too_slow` tells a frame that
trickles in (holding its reservation) from one that is arriving.
"""

from __future__ import annotations

import logging
import os
import resource
from collections import deque
from typing import Protocol

log = logging.getLogger(__name__)


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
        return 1 << 20
    return soft


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


def connection_room(
    max_connections: int, nofile: int, fd_reserve: int, open_now: int | None, connections: int
) -> int:
    """How many connections may be open at once: ``max_connections``, or fewer when the
    descriptors not held by connections plus ``fd_reserve`` would leave less room."""
    if open_now is None:
        return max_connections
    others = max(open_now - connections, 0)
    return max(0, min(max_connections, nofile - others - fd_reserve))


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


def too_slow(
    arrived_bytes: int, window_s: float, min_bytes_per_s: int, window_length_s: float
) -> bool:
    """Whether a frame that got ``arrived_bytes`` more in the last ``window_s`` seconds
    fell below ``min_bytes_per_s``; judged only once a whole window of
    ``window_length_s`` has passed, so a frame's first bytes get time to come."""
    if not min_bytes_per_s or window_s < window_length_s:
        return False
    return arrived_bytes < min_bytes_per_s * window_s
