"""Making the commitlog durable: group commit for SYNC, a paced flusher for ASYNC.

SYNC: every append asks for its end offset to be durable; the flusher thread fsyncs
whatever has been written by the time it runs, so all appends that arrived during one
fsync share the next one (group commit). ASYNC: the flusher runs on an interval, or
sooner when the unflushed bytes pass a bound, and nobody waits for it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from collections.abc import Callable

from metaq.broker.store.commitlog import CommitLog
from metaq.broker.store.config import FlushMode, StoreConfig
from metaq.broker.store.retention import WriteGuard
from metaq.broker.store.service import Service

FlushListener = Callable[[int], None]


def _ignore(_seconds: float) -> None:
    pass


class CommitLogFlusher(Service):
    name = "flush"

    def __init__(self, commitlog: CommitLog, config: StoreConfig, guard: WriteGuard) -> None:
        interval = 0.05 if config.flush_mode is FlushMode.SYNC else config.flush_interval_ms / 1e3
        super().__init__(interval_s=interval)
        self.commitlog = commitlog
        self.config = config
        self.durable = commitlog.write_offset
        self.listeners: list[FlushListener] = []
        self.observe_fsync: Callable[[float], None] = _ignore
        """Told how long each flush's fsyncs took (seconds), on the flusher's thread."""
        # Work for the flusher's thread after each interval's flush, once the listeners
        # heard of it, under ``lock``; called with the durable offset.
        self.after_flush: list[FlushListener] = []
        self._guard = guard
        self._cond = threading.Condition()
        # Held for a whole flush, so a truncation never lands between choosing the target
        # and declaring it durable.
        self.lock = threading.Lock()

    def start(self) -> None:
        self.durable = self.commitlog.write_offset
        super().start()

    def request(self) -> None:
        """An append wants durability (SYNC) or has dirtied a lot (ASYNC): flush soon."""
        self.wakeup()

    def maybe_request(self) -> None:
        if self.commitlog.write_offset - self.durable >= self.config.flush_dirty_bytes:
            self.wakeup()

    def run_once(self) -> None:
        with self.lock:
            durable = self._flush()
            for chore in self.after_flush:
                chore(durable)

    def flush(self) -> int:
        """fsync everything written so far; return the new durable offset."""
        with self.lock:
            return self._flush()

    def cut(self, offset: int) -> None:
        """The log was truncated at ``offset``; call with ``lock`` held."""
        self.durable = min(self.durable, offset)

    def _flush(self) -> int:
        target = self.commitlog.write_offset
        if target <= self.durable:
            return self.durable
        segments = self.commitlog.segments
        offset = self.durable
        started = time.perf_counter()
        try:
            while offset < target:
                segment = segments.find(offset)
                if segment is None:  # deleted by retention meanwhile: nothing to sync
                    offset = target
                    break
                segments.disk.sync(segment)
                offset = segment.end
        except OSError as exc:
            self._guard.record_io_error(exc)
            return self.durable
        self.observe_fsync(time.perf_counter() - started)
        self._guard.record_io_success()
        with self._cond:
            self.durable = target
            self._cond.notify_all()
        for listener in self.listeners:
            listener(target)
        return target

    def wait_durable(self, offset: int, timeout_s: float) -> bool:
        """Block until ``offset`` is durable; False on timeout or if the flusher died."""
        self.wakeup()
        with self._cond:
            return self._cond.wait_for(
                lambda: self.durable >= offset or self.error is not None, timeout_s
            ) and (self.durable >= offset)

    def on_failure(self, exc: BaseException) -> None:
        with self._cond:
            self._cond.notify_all()
        for listener in self.listeners:
            listener(-1)


class AsyncDurability:
    """Await commitlog durability from an event loop, one thread hop per fsync.

    The flusher thread tells the loop once per flush; the loop then resolves every
    waiter whose offset is covered, in offset order. Timeouts are swept by one timer
    for all waiters: a timer per wait (or asyncio.wait_for, which wraps each wait in a
    task) cost more of the loop's time than the appends with 64 appenders waiting.
    """

    SWEEP_S = 0.05

    def __init__(self, loop: asyncio.AbstractEventLoop, flusher: CommitLogFlusher) -> None:
        self._loop = loop
        self._flusher = flusher
        self._waiters: list[tuple[int, int, float, asyncio.Future[bool]]] = []
        self._seq = itertools.count()
        self._sweeper: asyncio.TimerHandle | None = None
        flusher.listeners.append(self._on_flush)

    def _on_flush(self, durable: int) -> None:
        self._loop.call_soon_threadsafe(self._release, durable)

    def _release(self, durable: int) -> None:
        waiters = self._waiters
        while waiters and (durable < 0 or waiters[0][0] <= durable):
            future = heapq.heappop(waiters)[3]
            if not future.done():
                future.set_result(durable >= 0)

    def _sweep(self) -> None:
        self._sweeper = None
        now = self._loop.time()
        for _, _, deadline, future in self._waiters:
            if deadline <= now and not future.done():
                future.set_result(False)
        self._waiters = [w for w in self._waiters if not w[3].done()]
        heapq.heapify(self._waiters)
        if self._waiters:
            self._sweeper = self._loop.call_later(self.SWEEP_S, self._sweep)

    async def wait(self, offset: int, timeout_s: float) -> bool:
        """True once ``offset`` is durable; False after ``timeout_s`` or a dead flusher."""
        if self._flusher.durable >= offset:
            return True
        future: asyncio.Future[bool] = self._loop.create_future()
        deadline = self._loop.time() + timeout_s
        heapq.heappush(self._waiters, (offset, next(self._seq), deadline, future))
        self._flusher.request()
        if self._sweeper is None:
            self._sweeper = self._loop.call_later(self.SWEEP_S, self._sweep)
        return await future

    def close(self) -> None:
        if self._on_flush in self._flusher.listeners:
            self._flusher.listeners.remove(self._on_flush)
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._release(-1)
