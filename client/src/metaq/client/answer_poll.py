"""Keep the producer's event loop polling while its sends wait for a quick answer.

A loop with nothing to do blocks in ``epoll_wait`` and its CPU goes idle; an answer
then waits for that CPU to be woken, which on a virtual machine costs tens of
microseconds of a round trip that is itself about a hundred (a producer sending one
message at a time to a broker on the same host: 8,500 sends a second sleeping, 13,300
polling). So when a send goes out with nothing else unanswered, the loop polls its
sockets for up to ``window_us``, as the broker does after an answer
(:mod:`metaq.broker.idle_poll`).

Polling pays only while answers come back within the window, and it costs the CPU it
spins. So the loop polls only when the last wait for an answer (from the first send
going out to the last answer coming back) was within the window: a broker across a
real network, or a busy one, never starts it. While sends overlap the loop has work
anyway, and a wait that long ends the rhythm. Each turn yields the CPU
(``sched_yield`` releases the GIL too), so another runnable thread or process on the
same core goes first. A window of 0 never polls.
"""

from __future__ import annotations

import asyncio
import os
import time


class AnswerPoll:
    """Polls the loop from :meth:`waiting` to :meth:`answered` (at most ``window_us``)
    while waits end within the window."""

    def __init__(self, window_us: int) -> None:
        self.window_s = window_us / 1e6
        self.polled_s = 0.0
        """Time spent polling, in all."""
        self._in_rhythm = True  # the first send finds out
        self._waiting_since = 0.0
        self._waiting = False
        self._until = 0.0
        self._began = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def polling(self) -> bool:
        return self._loop is not None

    def waiting(self) -> None:
        """A send went out with no other unanswered."""
        if not self.window_s:
            return
        now = time.perf_counter()
        self._waiting = True
        self._waiting_since = now
        if not self._in_rhythm:
            return
        self._until = now + self.window_s
        if self._loop is None:
            self._began = now
            self._loop = asyncio.get_running_loop()
            # A ready callback makes the loop poll its sockets with a zero timeout.
            self._loop.call_soon(self._poll)

    def answered(self) -> None:
        """The last unanswered send was answered."""
        if not self._waiting:
            return
        self._waiting = False
        self._in_rhythm = time.perf_counter() - self._waiting_since <= self.window_s

    def _poll(self) -> None:
        now = time.perf_counter()
        if self._waiting and now < self._until:
            assert self._loop is not None
            os.sched_yield()
            self._loop.call_soon(self._poll)
            return
        self._loop = None
        self.polled_s += now - self._began
