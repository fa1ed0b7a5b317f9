"""Keep the event loop polling for a moment after it answered, instead of sleeping.

A loop with nothing to do blocks in ``epoll_wait`` and its CPU goes idle; the next
request then waits for that CPU to be woken, which on a virtual machine costs a good
share of a loopback round trip on each side of it (a loopback echo with a sleeping
server is much slower than with a polling one: ``make bench-idle-poll`` measures it,
docs/benchmarks.md has the figures). A client
sending one message at a time sends its next request soon after the answer, so the
broker keeps polling its sockets (:mod:`metaq.common.loop_poll`) for ``window_us``
after each answer it writes, as
Seastar's reactor does for ``--idle-poll-time-us`` (200 µs by default there too).

Polling pays only while clients keep that rhythm, and it costs up to a core, which a
small host's other processes need. So the loop polls only when the last request it
answered came within the window of the answer before it: a client sending one at a
time, or a consumer working through a backlog, keeps the rhythm; a producer sending
every millisecond does not, and its broker sleeps between sends as before. Each turn
after an answer's follow-up work yields the CPU (``sched_yield`` releases the GIL too),
so a runnable thread on the same core goes first. Polling stops early while the
store's threads have work the loop would compete with for the GIL (records to dispatch,
a SYNC flush under way), and never starts with a window of 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from metaq.common.loop_poll import LoopPoll

_FOLLOW_UP_S = 50e-6
"""An answer's follow-up work (dispatching the records a SEND appended, answering the
pulls they wake) runs in the loop's next turns; yielding then would let another process
take the CPU in the middle of it."""


def _never() -> bool:
    return False


class IdlePoll:
    """Polls the loop for ``window_us`` after an answer while requests keep coming back
    within it, unless ``busy``."""

    def __init__(self, window_us: int, on_polled: Callable[[float], None] | None = None) -> None:
        self.window_s = window_us / 1e6
        self.busy: Callable[[], bool] = _never
        """True while other threads have work the polling would slow down."""
        self._on_polled = on_polled
        self._in_rhythm = False
        self._answered_at = -1.0
        self._looper = LoopPoll(
            keep_going=lambda: not self.busy(),
            yield_cpu=lambda now: now - self._answered_at > _FOLLOW_UP_S,
            on_stopped=self._stopped,
        )

    @property
    def polling(self) -> bool:
        return self._looper.polling

    def answered(self, to_request: bool) -> None:
        """Answers were just written: ``to_request`` when to requests of the read just
        handled, else answers that completed later (a fsync, a woken long poll)."""
        if not self.window_s:
            return
        now = time.perf_counter()
        if to_request:
            self._in_rhythm = now - self._answered_at <= self.window_s
        self._answered_at = now
        if self._in_rhythm:
            self._looper.poll_until(now + self.window_s, now)

    def _stopped(self, polled_s: float) -> None:
        if self._on_polled is not None:
            self._on_polled(polled_s)
