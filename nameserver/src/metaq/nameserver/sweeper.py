"""The expiry sweeper: a named background service that forgets silent brokers."""

from __future__ import annotations

import asyncio
import logging

from metaq.common.service import cancel_and_wait
from metaq.nameserver.registry import Registry

log = logging.getLogger(__name__)


class ExpirySweeper:
    """Every ``interval_s``, removes brokers silent past the expiry and logs each one.

    Queries already skip expired brokers; sweeping frees their memory and says when they
    left. One task, owned here: :meth:`stop` cancels and awaits it.
    """

    name = "expiry-sweeper"

    def __init__(self, registry: Registry, interval_s: float) -> None:
        self._registry = registry
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def sweep(self) -> None:
        for key in self._registry.expire():
            log.warning(
                "broker %s left the routes: no heartbeat for %.1f s",
                key,
                self._registry.broker_expiry_s,
            )

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                self.sweep()
            except Exception:  # a sweep that fails must not end sweeping for good
                log.exception("%s: sweep failed", self.name)
