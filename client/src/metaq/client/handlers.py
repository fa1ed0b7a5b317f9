"""Running a push consumer's handlers: bounded concurrency, bounded retries, offsets finished.

Each message (or batch, for ``subscribe_batch``) a pull loop hands over becomes one call
in a FIFO that at most ``concurrency`` worker tasks take from (a pull's messages for a
one-message handler enter the FIFO as one run, which the workers take message by
message: no object per message until its handler fails); a call whose handler
raises is queued again after a back-off (no worker waits meanwhile, so a failing
message never holds up the others) up to ``max_attempts`` calls in all. Then — success
or not — the messages are marked finished in their queue, which lets the committed
offset move past them.

A message whose handler fails is, with a ``send_back`` hook (clustering), sent back for
a retry through the group's retry topic (:mod:`metaq.client.retry`) and then counts as
finished; when it cannot be sent back it is retried here after a back-off until it
can. Without the hook (broadcasting) it gets ``max_attempts`` calls, an ERROR log line
naming its topic, queue, offset and message id, and is then skipped.

A handler call cancelled at close (it outlived ``close_timeout_s``), or not started by
then, does **not** mark its messages finished, so the offset stops below them and they
are delivered again later. Nor does a call of a queue that was dropped (given away at a
rebalance, reset, or the consumer closing) before a worker took it: it is never started
(RocketMQ's consume service checks ``isDropped`` the same way), and a call of a dropped
queue that fails is not sent back for a retry: whoever runs the queue next has it again.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
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
    offset_resets: int = 0
    """Queues started afresh because an operator reset the group's offsets."""
    rebalances: int = 0
    """Rebalances that changed this consumer's queues."""


@dataclass(slots=True, eq=False)
class _Call:
    """One submitted handler call and how it fared so far."""

    queue: ProcessQueue[Any]
    messages: Sequence[Message]
    call: Callable[[], Awaitable[object]]
    attempt: int = 0
    sent: set[int] = field(default_factory=set)
    """Indexes of ``messages`` already sent back for a retry."""
    timer: asyncio.TimerHandle | None = None
    """While backing off: what queues the call again."""


@dataclass(slots=True, eq=False)
class _Run:
    """A pull's messages for a one-message handler, taken one by one by the workers.

    Several workers may take from one run at once, so ``concurrency`` still bounds the
    handlers running, not the pulls being worked on."""

    queue: ProcessQueue[Any]
    messages: Sequence[Message]
    handler: Callable[[Message], Awaitable[object]]
    next: int = 0
    """Index of the next message no worker has taken yet."""


class HandlerPool:
    """Runs handler calls on at most ``concurrency`` worker tasks.

    Workers take calls from one FIFO and live while it has any: a backlog of a million
    messages costs ``concurrency`` tasks, not one task (and its scheduling, and its
    done-callback) per message. A worker that finds the FIFO empty ends, but for one,
    which waits for the next call: a consumer tailing a queue, whose pulls bring a few
    messages each, would otherwise start a task for every pull. And a call wakes that
    worker or starts one, not one per message queued: more start a loop turn later if
    the calls taken are still running then (their handlers wait for something), up to
    ``concurrency``. A handler that never waits is run by one worker, which found a
    pull of three messages starting three tasks, two of them to find nothing.
    """

    def __init__(
        self,
        concurrency: int,
        max_attempts: int,
        retry_backoff_s: float,
        stats: ConsumeStats,
        send_back: SendBackHook | None = None,
    ) -> None:
        self._send_back = send_back
        self._concurrency = concurrency
        self._max_attempts = max_attempts
        self._retry_backoff_s = retry_backoff_s
        self._stats = stats
        self._ready: deque[_Call | _Run] = deque()
        self._queued = 0
        """Handler calls in ``_ready`` no worker took yet (a run counts each message)."""
        self._workers: set[asyncio.Task[None]] = set()
        self._standby: asyncio.Future[bool] | None = None
        """What the worker waiting for calls awaits: True for a call, False to end."""
        self._spread_scheduled = False
        self._busy = 0
        """Calls a worker took and has not finished."""
        self._backing_off: set[_Call] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def running(self) -> int:
        """Handler calls not finished yet (running, waiting for a worker or backing off)."""
        return self._queued + self._busy + len(self._backing_off)

    def submit(
        self,
        queue: ProcessQueue[Any],
        messages: Sequence[Message],
        call: Callable[[], Awaitable[object]],
    ) -> None:
        """Run ``call`` for ``messages`` of ``queue``, which are already in its in-flight set."""
        self._enqueue(_Call(queue, messages, call))

    def submit_each(
        self,
        queue: ProcessQueue[Any],
        messages: Sequence[Message],
        handler: Callable[[Message], Awaitable[object]],
    ) -> None:
        """Call ``handler(message)`` for each of ``messages`` of ``queue`` (already in its
        in-flight set), each call on its own like :meth:`submit`'s."""
        if messages:
            self._ready.append(_Run(queue, messages, handler))
            self._queued += len(messages)
            self._more_work()

    def _enqueue(self, item: _Call) -> None:
        self._ready.append(item)
        self._queued += 1
        self._more_work()

    def _more_work(self) -> None:
        self._idle.clear()
        standby = self._standby
        if standby is not None:
            self._standby = None
            standby.set_result(True)
        else:
            self._start_worker()
        if not self._spread_scheduled:
            self._spread_scheduled = True
            asyncio.get_running_loop().call_soon(self._spread)

    def _spread(self) -> None:
        """A loop turn after calls came: a worker for each call still waiting, up to
        ``concurrency``; the workers woken or started then are busy on running handlers."""
        self._spread_scheduled = False
        while self._start_worker():
            pass

    def _start_worker(self) -> bool:
        """Start a worker if a queued call has none to take it, within ``concurrency``."""
        workers = self._workers
        if len(workers) >= self._concurrency or self._queued <= self._waiting_workers:
            return False
        workers.add(asyncio.get_running_loop().create_task(self._work()))
        return True

    @property
    def _waiting_workers(self) -> int:
        """Workers that will take a call without a new one being started."""
        return len(self._workers) - self._busy

    def _check_idle(self) -> None:
        if not self.running:
            self._idle.set()

    async def _work(self) -> None:
        ready = self._ready
        try:
            while True:
                while ready:
                    item = ready[0]
                    if type(item) is _Run:
                        await self._work_run(item)
                        continue
                    assert isinstance(item, _Call)
                    ready.popleft()
                    self._queued -= 1
                    if item.queue.dropped:
                        self._check_idle()
                        continue
                    self._busy += 1
                    try:
                        await self._attempt(item)
                    finally:
                        # Cancelled (close after its timeout): its messages stay unfinished.
                        self._busy -= 1
                        self._check_idle()
                if self._standby is not None:
                    return  # another worker waits for the next call
                standby = self._standby = asyncio.get_running_loop().create_future()
                try:
                    if not await standby:
                        return
                finally:
                    if self._standby is standby:  # cancelled while waiting
                        self._standby = None
        finally:
            # Out of the set before the task ends, not in a done callback: a call
            # submitted in between must not count on this worker to take it.
            self._workers.discard(asyncio.current_task())

    async def _work_run(self, run: _Run) -> None:
        """Take ``run``'s messages one at a time until none is left untaken.

        A drain hands out hundreds of thousands of messages a second, so each is called
        here with no object of its own. While this worker's handler is suspended, the
        others take the run's next messages; the run leaves the FIFO with its last one.
        """
        ready, stats = self._ready, self._stats
        messages, handler, queue = run.messages, run.handler, run.queue
        last = len(messages) - 1
        while (index := run.next) <= last:
            if queue.dropped:  # the rest of the run is never started
                run.next = last + 1
                ready.remove(run)
                self._queued -= last - index + 1
                self._check_idle()
                return
            run.next = index + 1
            if index == last:
                ready.popleft()
            message = messages[index]
            self._queued -= 1
            self._busy += 1
            try:
                if await handler(message) is LATER:
                    raise ReconsumeLater("the handler asked to see the message later")
            except Exception as exc:
                stats.failed_attempts += 1
                call = _Call(queue, (message,), _bind(handler, message), 1)
                if await self._failed(call, exc):
                    queue.finish(message.queue_offset)
            else:
                stats.handled += 1
                queue.finish(message.queue_offset)
            finally:
                # Cancelled (close after its timeout): its message stays unfinished.
                self._busy -= 1
                if not self._queued:
                    self._check_idle()

    async def _attempt(self, item: _Call) -> None:
        item.attempt += 1
        try:
            if await item.call() is LATER:
                raise ReconsumeLater("the handler asked to see the message later")
        except Exception as exc:
            self._stats.failed_attempts += 1
            if not await self._failed(item, exc):
                return  # tried again after a back-off
        else:
            self._stats.handled += len(item.messages)
        for message in item.messages:
            item.queue.finish(message.queue_offset)

    async def _failed(self, item: _Call, failure: Exception) -> bool:
        """True when the call's messages are done with (sent back or skipped); otherwise
        the call is queued again after a back-off (no worker waits meanwhile). A call
        of a dropped queue is neither: it ends unfinished."""
        if item.queue.dropped:
            return False
        messages = item.messages
        if self._send_back is not None:
            # Sent back, a message counts as consumed: its retry comes later.
            for index, message in enumerate(messages):
                if index not in item.sent and await self._send_back(item.queue, message, failure):
                    item.sent.add(index)
            if len(item.sent) == len(messages):
                self._stats.sent_back += len(messages)
                return True
        elif item.attempt >= self._max_attempts:
            self._stats.skipped += len(messages)
            log.error(
                "handler failed %d times for %s; skipping it: %r",
                self._max_attempts,
                _describe(item.queue, messages),
                failure,
            )
            return True
        log.warning(
            "handler failed for %s (attempt %d), retrying here: %r",
            _describe(item.queue, messages),
            item.attempt,
            failure,
        )
        delay = min(self._retry_backoff_s * 2 ** (item.attempt - 1), 5.0)
        self._backing_off.add(item)
        item.timer = asyncio.get_running_loop().call_later(delay, self._retry, item)
        return False

    def _end_standby(self) -> None:
        standby, self._standby = self._standby, None
        if standby is not None:
            standby.set_result(False)

    def _retry(self, item: _Call) -> None:
        self._backing_off.discard(item)
        if item.queue.dropped:
            self._check_idle()
            return
        self._enqueue(item)

    async def drain(self, timeout_s: float) -> int:
        """Wait for every handler call; cancel those still running after ``timeout_s``.

        Returns how many were unfinished (their messages stay uncommitted).
        """
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
            self._end_standby()
            return 0
        except TimeoutError:
            pass
        self._end_standby()
        for item in self._backing_off:
            if item.timer is not None:
                item.timer.cancel()
        # Calls not started yet are dropped with the ones cancelled: no worker takes them.
        unfinished = self.running
        self._backing_off.clear()
        self._ready.clear()
        self._queued = 0
        workers = list(self._workers)
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if unfinished:
            log.warning(
                "%d message handler calls outlived the close timeout and were cancelled",
                unfinished,
            )
        self._idle.set()
        return unfinished


def _bind(
    handler: Callable[[Message], Awaitable[object]], message: Message
) -> Callable[[], Awaitable[object]]:
    return lambda: handler(message)


def _describe(queue: ProcessQueue[Any], messages: Sequence[Message]) -> str:
    first = messages[0]
    where = f"topic {queue.topic} queue {queue.route} offset {first.queue_offset}"
    if len(messages) == 1:
        return f"message {first.msg_id} ({where})"
    return f"a batch of {len(messages)} messages from {where}"
