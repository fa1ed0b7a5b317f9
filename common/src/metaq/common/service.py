"""The event-loop service base: one named asyncio task with start, stop and wakeup."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


def spawn(tasks: set[asyncio.Task[T]], coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Run ``coro`` as a task held in ``tasks`` until it ends: the event loop keeps only a
    weak reference to a task, so one that nobody holds may vanish before it ends."""
    task = asyncio.get_running_loop().create_task(coro)
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return task


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to do) and wait until it has ended, taking its
    cancellation as the end asked for; any other error it ended with is raised."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class PeriodicService(ABC):
    """Runs :meth:`run_once` every ``interval_s``, or sooner on :meth:`wakeup`, until stopped.

    A round that raises is logged and counted in ``failures``; the next round comes as
    usual, since the periodic work done this way (route refresh, heartbeats, offset
    snapshots, member expiry) is worth retrying and a dead task would hide the problem.
    :meth:`stop` ends the task, then runs :meth:`on_stop` for final work.
    """

    name = "service"

    def __init__(self, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"{self.name}: interval_s must be positive, not {interval_s}")
        self.interval_s = interval_s
        self.failures = 0
        self.last_error: BaseException | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        if self._task is not None:
            raise RuntimeError(f"service {self.name} already started")
        self._stopping = False
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=self.name)

    def wakeup(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        task, self._task = self._task, None
        if task is not None:
            await task
        await self.on_stop()

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                async with asyncio.timeout(self.interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            if self._stopping:
                break
            try:
                await self.run_once()
            except Exception as exc:
                self.failures += 1
                self.last_error = exc
                log.warning("service %s: round failed (will retry): %s", self.name, exc)

    @abstractmethod
    async def run_once(self) -> None: ...

    async def on_stop(self) -> None:  # noqa: B027 - optional hook
        """Final work after the task ended; the default does nothing."""
