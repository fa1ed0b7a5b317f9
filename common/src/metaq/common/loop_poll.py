"""Keep an asyncio event loop polling its sockets instead of sleeping, for a while.

A loop with nothing to do blocks in ``epoll_wait`` and its CPU goes idle; what arrives
next then waits for that CPU to be woken, which on a virtual machine is a good share of
a loopback round trip (docs/benchmarks.md, ``broker/idle_poll.py``). A callback that is
ready makes the loop poll its sockets with a zero timeout instead, so :class:`LoopPoll`
keeps one ready, turn after turn, until a deadline or until its owner says to stop.
The broker polls for a next request after an answer (``metaq.broker.idle_poll``), the
producer for the answer to a send (``metaq.client.answer_poll``); each decides when
polling pays.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable


class LoopPoll:
    """Polls the running loop from :meth:`poll_until` to the deadline, while
    ``keep_going()``; a turn yields the CPU (``sched_yield``, which releases the GIL
    too) when ``yield_cpu(now)``, so a runnable thread or process on it goes first.
    ``on_stopped`` is told how long each stretch of polling lasted."""

    def __init__(
        self,
        keep_going: Callable[[], bool],
        yield_cpu: Callable[[float], bool],
        on_stopped: Callable[[float], None],
    ) -> None:
        self._keep_going = keep_going
        self._yield_cpu = yield_cpu
        self._on_stopped = on_stopped
        self._until = 0.0
        self._began = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def polling(self) -> bool:
        return self._loop is not None

    def poll_until(self, deadline: float, now: float) -> None:
        """Poll until ``deadline``, starting at ``now`` if not polling yet (both
        ``time.perf_counter()`` readings; a stretch counts from the caller's)."""
        self._until = deadline
        if self._loop is None:
            self._began = now
            self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._poll)

    def _poll(self) -> None:
        now = time.perf_counter()
        if now < self._until and self._keep_going():
            assert self._loop is not None
            if self._yield_cpu(now):
                os.sched_yield()
            self._loop.call_soon(self._poll)
            return
        self._loop = None
        self._on_stopped(now - self._began)
