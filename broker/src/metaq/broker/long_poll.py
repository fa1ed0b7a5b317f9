"""Long polling: PULL requests parked until their queue gets new entries or time runs out.

The store's dispatcher reports which (topic, queue id) pairs got new consume-queue
entries after each round; when anything is parked, the pulls parked on those queues are
read again and answered: at once when the loop itself dispatched (a small append), else
after the set crossed to the loop in one ``call_soon_threadsafe``. A pull not answered
by its deadline is answered with whatever a last read finds (normally the empty
status). Nothing polls on a timer.

Parking races with the dispatcher (it may add the entry just after the read that found
nothing, and look for parked pulls just before this one is parked); the owner closes the
race by re-checking the queue's end right after parking (see ``PullHandler``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from metaq.broker.connection import Responder

log = logging.getLogger(__name__)

QueueKey = tuple[bytes, int]


@dataclass(slots=True, eq=False)
class PendingPull:
    """A PULL being served: what it asked for and, while parked, its timer."""

    responder: Responder
    request_id: int
    topic: str
    queue_id: int
    offset: int
    max_messages: int
    max_bytes: int
    tag_codes: Collection[int] | None
    deadline: float
    """Loop time after which it is answered whatever the queue holds."""
    group: str = ""
    reset_generation: int | None = None
    """The reset generation the consumer's position comes from (None: not checked)."""
    key: QueueKey = field(init=False)
    timer: asyncio.TimerHandle | None = None

    def __post_init__(self) -> None:
        self.key = (self.topic.encode(), self.queue_id)


Retry = Callable[[PendingPull, bool], None]
"""Read the pull's queue again and answer it, or (when not final and still nothing is
there) park it again; with final=True it must answer."""


class LongPolls:
    """Parked pulls by queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop, retry: Retry) -> None:
        """Made on the thread that runs ``loop``."""
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._retry = retry
        self._parked: dict[QueueKey, list[PendingPull]] = {}
        self._count = 0
        self._closed = False
        self.woken = 0
        """Pulls re-read because their queue got entries (a metric)."""

    @property
    def parked(self) -> int:
        return self._count

    def park(self, pull: PendingPull) -> None:
        delay = max(pull.deadline - self._loop.time(), 0.0)
        pull.timer = self._loop.call_later(delay, self._expire, pull)
        self._parked.setdefault(pull.key, []).append(pull)
        self._count += 1

    def unpark(self, pull: PendingPull) -> bool:
        """Take a parked pull out again (its timer cancelled); False if it was not parked."""
        pulls = self._parked.get(pull.key)
        if not pulls or pull not in pulls:
            return False
        pulls.remove(pull)
        if not pulls:
            del self._parked[pull.key]
        self._forget(pull)
        return True

    def _forget(self, pull: PendingPull) -> None:
        self._count -= 1
        if pull.timer is not None:
            pull.timer.cancel()
            pull.timer = None

    # --- from the dispatcher thread ---------------------------------------------------

    def on_dispatch(self, touched: set[QueueKey]) -> None:
        """The store's dispatch listener: on the dispatcher thread, or on the loop when
        the appender dispatched its own records."""
        if not self._parked or self._closed:
            return
        if threading.get_ident() == self._loop_thread:
            self._on_new_entries(touched)
            return
        # RuntimeError: the loop is closing; shutdown answers the parked pulls.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._on_new_entries, touched)

    # --- on the loop ------------------------------------------------------------------

    def wake(self, touched: set[QueueKey]) -> None:
        """Read the pulls parked on ``touched`` queues again (more became readable)."""
        self._on_new_entries(touched)

    def _on_new_entries(self, touched: set[QueueKey]) -> None:
        for key in touched:
            pulls = self._parked.pop(key, None)
            if not pulls:
                continue
            for pull in pulls:
                self._forget(pull)
                if pull.responder.closed:
                    continue
                self.woken += 1
                self._answer(pull, final=False)

    def _expire(self, pull: PendingPull) -> None:
        pull.timer = None
        if self.unpark(pull) and not pull.responder.closed:
            self._answer(pull, final=True)

    def _answer(self, pull: PendingPull, *, final: bool) -> None:
        try:
            self._retry(pull, final)
        except Exception:
            log.exception("long poll of %s/%d failed", pull.topic, pull.queue_id)

    def drop_connection(self, connection_id: int) -> None:
        """Forget the pulls of a connection that closed; nobody is left to answer."""
        for key in list(self._parked):
            for pull in list(self._parked[key]):
                if pull.responder.connection_id == connection_id:
                    self.unpark(pull)

    def release_all(self) -> int:
        """Answer every parked pull now (shutdown); return how many there were."""
        self._closed = True
        parked, self._parked = self._parked, {}
        released = 0
        for pulls in parked.values():
            for pull in pulls:
                self._forget(pull)
                if not pull.responder.closed:
                    self._answer(pull, final=True)
                    released += 1
        return released
