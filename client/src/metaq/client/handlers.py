"""Running a push consumer's handlers: bounded concurrency, bounded retries, offsets finished.

Each message (or batch, for ``subscribe_batch``) a pull loop hands over becomes one task
that waits for one of ``concurrency`` slots, calls the handler, and on an exception
calls it again after a back-off (the slot is given back while it waits, so a failing
message never holds up the others) up to ``max_attempts`` calls in all. Then — success
or not — the messages are marked finished in their queue, which lets the committed
offset move past them.

A message whose handler fails is, with a ``send_back`` hook (clustering), sent back for
a retry through the group's retry topic (:mod:`metaq.client.retry`) and then counts as
finished; when it cannot be sent back it is retried here after a back-off until it
can. Without the hook (broadcasting) it gets ``max_attempts`` calls, an ERROR log line
naming its topic, queue, offset and message id, and is then skipped.

A handler task cancelled at close (it outlived ``close_timeout_s``) does **not** mark its
messages finished, so the offset stops below them and they are delivered again later.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from metaq.client.message import Message
from metaq.client.process_queue import ProcessQueue

log = logging.getLogger(__name__)


class ConsumeResult(enum.Enum):
    LATER = "later"
    """Returned by a handler: not now — retry it like a failure, on the retry schedule."""


LATER: Final = ConsumeResult.LATER


class ReconsumeLater(Exception):
    """What a handler returning LATER counts as."""


SendBackHook = Callable[[ProcessQueue[Any], Message, Exception], Awaitable[bool]]
"""Sends a failed message back for a later retry; True once the copy is stored."""


@dataclass
class ConsumeStats:
    """Counters of one push consumer, for tests, tools and metrics."""

    pulled: int = 0
    """Messages pulled and handed to handlers (after the client's tag check)."""
    handled: int = 0
    """Messages whose handler returned normally."""
    failed_attempts: int = 0
    """Handler calls that raised (each retried call counts)."""
    skipped: int = 0
    """Broadcasting: messages given up on after ``max_attempts`` failed calls."""
    parked: int = 0
    """Ordered: messages moved to the dead-letter topic after failing in place."""
    sent_back: int = 0
    """Clustering: messages whose handler failed, sent back for a retry (or to the DLQ)."""
    offset_corrections: int = 0
    """Pulls answered with a wrong-offset status the consumer corrected itself from."""
    rebalances: int = 0
    """Rebalances that changed this consumer's queues."""


class HandlerPool:
    """Runs handler calls as tasks, at most ``concurrency`` at a time."""

    def __init__(
        self,
        concurrency: int,
        max_attempts: int,
        retry_backoff_s: float,
        stats: ConsumeStats,
        send_back: SendBackHook | None = None,
    ) -> None:
        self._send_back = send_back
        self._slots = asyncio.Semaphore(concurrency)
        self._max_attempts = max_attempts
        self._retry_backoff_s = retry_backoff_s
        self._stats = stats
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def running(self) -> int:
        """Handler tasks not finished yet (running, waiting for a slot or backing off)."""
        return len(self._tasks)

    def submit(
        self,
        queue: ProcessQueue[Any],
        messages: Sequence[Message],
        call: Callable[[], Awaitable[object]],
    ) -> None:
        """Run ``call`` for ``messages`` of ``queue``, which are already in its in-flight set."""
        task = asyncio.get_running_loop().create_task(self._run(queue, messages, call))
        self._tasks.add(task)
        self._idle.clear()
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self._idle.set()

    async def _run(
        self,
        queue: ProcessQueue[Any],
        messages: Sequence[Message],
        call: Callable[[], Awaitable[object]],
    ) -> None:
        # Cancellation (close after its timeout) skips the finishing below on purpose.
        sent: set[int] = set()
        attempt = 0
        while True:
            attempt += 1
            async with self._slots:
                try:
                    if await call() is LATER:
                        raise ReconsumeLater("the handler asked to see the message later")
                except Exception as exc:
                    self._stats.failed_attempts += 1
                    failure: Exception = exc
                else:
                    self._stats.handled += len(messages)
                    break
            if self._send_back is not None:
                # Sent back, a message counts as consumed: its retry comes later.
                for index, message in enumerate(messages):
                    if index not in sent and await self._send_back(queue, message, failure):
                        sent.add(index)
                if len(sent) == len(messages):
                    self._stats.sent_back += len(messages)
                    break
            elif attempt >= self._max_attempts:
                self._stats.skipped += len(messages)
                log.error(
                    "handler failed %d times for %s; skipping it: %r",
                    self._max_attempts,
                    _describe(queue, messages),
                    failure,
                )
                break
            log.warning(
                "handler failed for %s (attempt %d), retrying here: %r",
                _describe(queue, messages),
                attempt,
                failure,
            )
            await asyncio.sleep(min(self._retry_backoff_s * 2 ** (attempt - 1), 5.0))
        for message in messages:
            queue.finish(message.queue_offset)

    async def drain(self, timeout_s: float) -> int:
        """Wait for every handler task; cancel those still running after ``timeout_s``.

        Returns how many were cancelled (their messages stay uncommitted).
        """
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
            return 0
        except TimeoutError:
            pass
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if tasks:
            log.warning(
                "%d message handlers outlived the close timeout and were cancelled", len(tasks)
            )
        return len(tasks)


def _describe(queue: ProcessQueue[Any], messages: Sequence[Message]) -> str:
    first = messages[0]
    where = f"topic {queue.topic} queue {queue.route} offset {first.queue_offset}"
    if len(messages) == 1:
        return f"message {first.msg_id} ({where})"
    return f"a batch of {len(messages)} messages from {where}"
