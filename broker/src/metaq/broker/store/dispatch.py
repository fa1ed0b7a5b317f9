"""The dispatcher: reads the commitlog in order and builds consume queues and the index.

One dispatcher per store, in commitlog order, after the append is acknowledged (seed Q&A
2-3). It reads records back from the log rather than taking them from the appender, so
the same code rebuilds queues after a crash and on a slave that received raw log bytes.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from typing import Final

from metaq.broker.store.commitlog import CommitLog
from metaq.broker.store.consume_queue import ConsumeQueue, QueueTable
from metaq.broker.store.index import MessageIndex, hash_id, hash_key, key_for_topic_key
from metaq.broker.store.service import Service
from metaq.common.record import BLANK_MAGIC, HEADER_SIZE, header_view

_FIELDS: Final = header_view(
    "size", "magic", "queue_offset", "store_timestamp_ms", "queue_id", "msg_id",
    "topic_len", "tags_len", "keys_len",
)  # fmt: skip
_ROUND_BYTES: Final = 4 * 1024 * 1024

DispatchListener = Callable[[set[tuple[bytes, int]]], None]
"""Told which (topic, queue id) pairs got new entries in a round; long polling uses it."""


class Dispatcher:
    def __init__(self, commitlog: CommitLog, queues: QueueTable, index: MessageIndex) -> None:
        self.commitlog = commitlog
        self.queues = queues
        self.index = index
        self.dispatched = 0
        self.listeners: list[DispatchListener] = []
        # Held while a round runs, so a checkpoint reads a consistent dispatched offset.
        self.lock = threading.Lock()

    @property
    def backlog_bytes(self) -> int:
        return self.commitlog.write_offset - self.dispatched

    def dispatch(self, limit_bytes: int = _ROUND_BYTES) -> int:
        """Dispatch records up to the commitlog's end (at most ``limit_bytes``); count them."""
        with self.lock:
            touched, count = self._dispatch_locked(limit_bytes)
        self._tell(touched)
        return count

    def try_dispatch(self, limit_bytes: int = _ROUND_BYTES) -> bool:
        """Dispatch as :meth:`dispatch` does unless another thread is dispatching now;
        False (nothing done) if one is."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            touched, _ = self._dispatch_locked(limit_bytes)
        finally:
            self.lock.release()
        self._tell(touched)
        return True

    def _dispatch_locked(self, limit_bytes: int) -> tuple[set[ConsumeQueue], int]:
        touched: set[ConsumeQueue] = set()
        count = 0
        end = min(self.commitlog.write_offset, self.dispatched + limit_bytes)
        offset = self.dispatched
        segments = self.commitlog.segments
        queues = self.queues
        rows = queues.rows
        # Index entries are gathered for one put at the end of the round.
        hashes: list[int] = []
        offsets: list[int] = []
        times: list[int] = []
        while offset < end:
            segment = segments.find(offset)
            if segment is None:
                raise RuntimeError(f"commitlog offset {offset} has no segment to dispatch")
            view = segment.view
            mm = segment.mm  # slicing the mmap itself yields bytes in one step
            pos = offset - segment.start
            stop = min(end - segment.start, segment.size)
            while pos < stop:
                # Too little room for any record: the rest is a blank (or nothing).
                if segment.size - pos < HEADER_SIZE:
                    pos = segment.size
                    break
                (size, magic, q_offset, store_ms, queue_id, msg_id, topic_len, tags_len,
                 keys_len) = _FIELDS.unpack_from(view, pos)  # fmt: skip
                if magic == BLANK_MAGIC or size == 0:
                    pos = segment.size
                    break
                at = pos + HEADER_SIZE
                topic = mm[at : at + topic_len]
                row = rows.get(topic)
                queue = row[queue_id] if row is not None and queue_id < len(row) else None
                if queue is None:
                    queue = queues.get_or_create(topic, queue_id)
                at += topic_len
                tag_code = zlib.crc32(view[at : at + tags_len]) if tags_len else 0
                cl_offset = segment.start + pos
                queue.put(q_offset, cl_offset, size, tag_code)
                hashes.append(hash_id(msg_id))
                offsets.append(cl_offset)
                times.append(store_ms)
                if keys_len:
                    at += tags_len
                    for k in mm[at : at + keys_len].split(b" "):
                        hashes.append(hash_key(key_for_topic_key(topic, k)))
                        offsets.append(cl_offset)
                        times.append(store_ms)
                touched.add(queue)
                pos += size
                count += 1
            offset = segment.start + pos
        self.index.put_many(hashes, offsets, times)
        self.dispatched = offset
        return touched, count

    def _tell(self, touched: set[ConsumeQueue]) -> None:
        if touched and self.listeners:
            keys = {queue.key for queue in touched}
            for listener in self.listeners:
                listener(keys)

    def catch_up(self) -> int:
        """Dispatch everything appended so far (start-up and shutdown)."""
        total = 0
        while self.dispatched < self.commitlog.write_offset:
            total += self.dispatch()
        return total


class DispatchService(Service):
    """Runs the dispatcher whenever appends wake it, and lets appenders wait for room."""

    name = "dispatch"

    def __init__(self, dispatcher: Dispatcher) -> None:
        # Appends wake it; the interval is only a backstop, and each timed wake-up takes
        # the GIL from the event loop for a round that usually finds nothing.
        super().__init__(interval_s=1.0)
        self.dispatcher = dispatcher
        self._progress = threading.Condition()

    def run_once(self) -> None:
        while self.dispatcher.dispatched < self.dispatcher.commitlog.write_offset:
            self.dispatcher.dispatch()
            with self._progress:
                self._progress.notify_all()

    def wait_for_room(self, backlog_bytes: int, timeout_s: float) -> bool:
        """Block until the undispatched backlog is under ``backlog_bytes`` (back-pressure)."""
        self.wakeup()
        with self._progress:
            return self._progress.wait_for(
                lambda: self.dispatcher.backlog_bytes < backlog_bytes or self.error is not None,
                timeout_s,
            )

    def on_failure(self, exc: BaseException) -> None:
        with self._progress:
            self._progress.notify_all()
