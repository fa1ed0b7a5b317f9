"""Keep the producer's event loop polling while its sends wait for a quick answer.

A loop with nothing to do blocks in ``epoll_wait`` and its CPU goes idle; an answer
then waits for that CPU to be woken, which on a virtual machine is a large share of a
loopback round trip (one message at a time to a broker on the same host went much
faster polling than sleeping: docs/benchmarks.md has the figures, docs/producer.md,
"Answer polling", the account). So when a send
goes out with nothing else unanswered, the loop polls its sockets
(:mod:`metaq.common.loop_poll`) for up to ``window_us``, as the broker does after an answer
(``metaq.broker.idle_poll``).

The window is long enough for a send to a sync-replicated master to be answered while
polling (the master's copy, the slave's, and the slave's acknowledgement, all on one
host; docs/benchmarks.md has the figures). Polling pays only while
answers come back within the window, and it costs the CPU it spins. So the loop polls
only when the last wait for an answer (from the first send going out to the last answer
coming back) was within the window: a broker across a slow network, or a busy one,
never starts it. And it polls only for a caller that waits on its answers, whose next
send follows the last answer within 200 µs (one message at a time): a producer sending
at a rate, whose next send comes at its next tick whatever the answer, would spin for
answers nobody is waiting on, on the CPU the broker and the other processes of a shared
host need. While sends
overlap the loop has work anyway, and a wait that long ends the rhythm. Each turn
yields the CPU (``sched_yield`` releases the GIL too), so another runnable thread or
process on the same core goes first. A window of 0 never polls.
"""

from __future__ import annotations

import time
from typing import Final

from metaq.common.loop_poll import LoopPoll

_NEXT_SEND_S: Final = 200e-6
"""A caller that waits on its answers sends again this soon after one (its own work
between an answer and the next send takes tens of microseconds). A send later than that
comes at the caller's own pace, and polling for its answer would only spin."""


class AnswerPoll:
    """Polls the loop from :meth:`waiting` to :meth:`answered` (at most ``window_us``)
    while waits end within the window and sends follow answers within it."""

    def __init__(self, window_us: int) -> None:
        self.window_s = window_us / 1e6
        self.polled_s = 0.0
        """Time spent polling, in all."""
        self._in_rhythm = True  # the first send finds out
        self._waiting_since = 0.0
        self._answered_at: float | None = None
        self._waiting = False
        self._looper = LoopPoll(
            keep_going=lambda: self._waiting,
            yield_cpu=lambda now: True,
            on_stopped=self._stopped,
        )

    @property
    def polling(self) -> bool:
        return self._looper.polling

    def waiting(self) -> None:
        """A send went out with no other unanswered."""
        if not self.window_s:
            return
        now = time.perf_counter()
        self._waiting = True
        self._waiting_since = now
        answered_at = self._answered_at
        waited_on = answered_at is None or now - answered_at <= _NEXT_SEND_S
        if self._in_rhythm and waited_on:
            self._looper.poll_until(now + self.window_s, now)

    def answered(self) -> None:
        """The last unanswered send was answered."""
        if not self._waiting:
            return
        self._waiting = False
        now = self._answered_at = time.perf_counter()
        self._in_rhythm = now - self._waiting_since <= self.window_s

    def _stopped(self, polled_s: float) -> None:
        self.polled_s += polled_s
