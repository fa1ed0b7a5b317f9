"""A periodic tick for open-loop load: a kernel timer (``timerfd``) the event loop watches.

uvloop's timers count whole milliseconds from a clock it reads once per loop turn, and
a timer's wait starts again from that truncated clock each time the loop wakes. A 1 ms
sleep therefore fires at the next whole millisecond after the loop last woke for I/O,
not after the sleep began: the later in its millisecond the system under test answered,
the later the next tick, and that system's own latency is counted a second time in the
wait for the send. A timerfd expires on a fixed grid whatever else the loop handled,
and the loop sees it as one more readable descriptor, so a tick costs no busy spin.

The grid starts at a given ``time.perf_counter()`` reading (Linux's ``CLOCK_MONOTONIC``,
the timer's clock), so the k-th tick comes no earlier than k periods after it: a message
due on a tick is sent on that tick, never one later for a timer set a moment early.
Where there is no timerfd (not Linux) the ticker falls back to ``asyncio.sleep``.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import math
import os
import sys
import time
from typing import Final

_CLOCK_MONOTONIC: Final = 1
_TFD_TIMER_ABSTIME: Final = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _timespec(seconds: float) -> _Timespec:
    # Rounded up: a tick must not come before its grid point, even by a nanosecond.
    whole, nanos = divmod(math.ceil(seconds * 1e9), 1_000_000_000)
    return _Timespec(whole, nanos)


def _periodic_timerfd(period_s: float, start: float) -> int | None:
    """A non-blocking timerfd expiring at ``start`` + k × ``period_s`` (k ≥ 1, on the
    monotonic clock); None where there is none."""
    monotonic = "CLOCK_MONOTONIC" in time.get_clock_info("perf_counter").implementation
    if not sys.platform.startswith("linux") or not monotonic:
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fd: int = libc.timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        return None
    spec = _Itimerspec(_timespec(period_s), _timespec(start + period_s))
    if libc.timerfd_settime(fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
        errno = ctypes.get_errno()
        os.close(fd)
        raise OSError(errno, f"timerfd_settime: {os.strerror(errno)}")
    return fd


class Ticker:
    """Wakes :meth:`wait` every ``period_s`` on a fixed grid from ``start`` (a
    ``time.perf_counter()`` reading).

    Expirations that pass while nobody waits are folded into one: the caller works out
    what came due from the clock, not from counting ticks.
    """

    def __init__(self, period_s: float, start: float) -> None:
        self.period_s = period_s
        self.start = start
        self._fd: int | None = None
        self._ticked = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> Ticker:
        self._fd = _periodic_timerfd(self.period_s, self.start)
        if self._fd is not None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self._fd, self._expired)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._fd is not None:
            assert self._loop is not None
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None

    def _expired(self) -> None:
        assert self._fd is not None
        try:
            os.read(self._fd, 8)  # the expiration count, which the caller does not need
        except BlockingIOError:
            return
        self._ticked.set()

    async def wait(self) -> None:
        """Until the next tick (at once if one passed since the last wait)."""
        if self._fd is None:
            await asyncio.sleep(self.period_s)
            return
        await self._ticked.wait()
        self._ticked.clear()
