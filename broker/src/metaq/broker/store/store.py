"""The message store: commitlog, consume queues, index and the services that keep them.

This is the MetaQ 2.0 store behind one object. Appends go to the commitlog; a dispatcher
thread builds consume queues and the index from it; a flusher makes the log durable; a
checkpointer records what recovery may trust; a cleaner enforces retention and watches
the disk. See ``docs/storage-format.md`` for the files.
"""

from __future__ import annotations

import enum
import fcntl
import logging
import os
import resource
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from metaq.broker.store.checkpoint import AbortMarker, Checkpoint, read_checkpoint, write_checkpoint
from metaq.broker.store.commitlog import Appended, CommitLog, RecordBatch
from metaq.broker.store.config import FlushMode, StoreConfig
from metaq.broker.store.consume_queue import QueueTable
from metaq.broker.store.dispatch import Dispatcher, DispatchService
from metaq.broker.store.flush import CommitLogFlusher
from metaq.broker.store.index import MessageIndex, key_for_id, key_for_topic_key
from metaq.broker.store.mapping import MappingPool
from metaq.broker.store.page_cache import PageCacheWindow
from metaq.broker.store.producers import ProducerTable, write_snapshot
from metaq.broker.store.reads import GetResult, GetStatus, read_batch
from metaq.broker.store.recovery import RecoveryReport, recover
from metaq.broker.store.retention import (
    DESCRIPTOR_ERRNOS,
    SPACE_ERRNOS,
    CleanService,
    Deletion,
    DiskUsage,
    Retention,
    WriteGuard,
)
from metaq.broker.store.segment import Disk, RealDisk
from metaq.broker.store.service import Service
from metaq.common.errors import StoreUnavailable
from metaq.common.record import FIELDS, Record, decode, encode

log = logging.getLogger(__name__)

# The store timestamp's place in a record: stamped on append after the commitlog and
# queue offsets (two int64s).
_STORE_TIMESTAMP: Final = FIELDS["store_timestamp_ms"]
_SIZE: Final = FIELDS["size"]


class PutStatus(enum.Enum):
    OK = "ok"
    FLUSH_DISK_TIMEOUT = "flush_disk_timeout"
    """Stored, but not known durable within flush_timeout_ms (SYNC flush only)."""


@dataclass(frozen=True, slots=True)
class PutResult:
    status: PutStatus
    appended: Appended


class _Checkpointer(Service):
    name = "checkpoint"

    def __init__(self, store: MessageStore) -> None:
        super().__init__(interval_s=store.config.checkpoint_interval_ms / 1e3)
        self._store = store
        self._queues_synced = time.monotonic()

    def run_once(self) -> None:
        now = time.monotonic()
        due = now - self._queues_synced >= self._store.config.queue_sync_interval_ms / 1e3
        try:
            self._store.checkpoint(queues=due)
        except OSError as exc:
            if exc.errno not in SPACE_ERRNOS | DESCRIPTOR_ERRNOS:
                raise
            # Filled from outside the broker, or out of file descriptors: the old
            # checkpoint still holds (recovery trusts less of the log), and the next
            # round tries again once room returns.
            return
        if due:
            self._queues_synced = now


class MessageStore:
    """Open with :meth:`start` (which recovers), close with :meth:`close`.

    Thread-safety: appends may come from any thread; reads from any thread.
    """

    def __init__(
        self,
        config: StoreConfig,
        *,
        disk: Disk | None = None,
        disk_usage: DiskUsage | None = None,
    ) -> None:
        self.config = config
        self.disk = disk or RealDisk()
        self.guard = WriteGuard(config, disk_usage) if disk_usage else WriteGuard(config)
        self.commitlog = CommitLog(config, self.disk, self.guard.may_allocate)
        self.guard.pending_bytes = self.commitlog.segments.pending_bytes
        self.mapped_queue_files = MappingPool(config.mapped_queue_files)
        self.queues = QueueTable(
            config.consume_queue_dir,
            config.consume_queue_segment_entries,
            self.disk,
            self.mapped_queue_files,
        )
        self.index = MessageIndex(
            config.index_dir, config.index_slots, config.index_entries, self.disk
        )
        self.producers = ProducerTable(config.producer_batches)
        """Idempotent producers' last sequences per queue, fed by the dispatcher."""
        self.dispatcher = Dispatcher(
            self.commitlog, self.queues, self.index, producers=self.producers
        )
        self.retention = Retention(config)
        # Next queue offset each (topic, queue id) has been consumed up to by every
        # consumer group known for it; the broker sets it. Without it, or for a queue it
        # does not name, nothing counts as consumed and only expiry deletes.
        self.consumed_floors: Callable[[], Mapping[tuple[str, int], int]] = dict
        # Commitlog segments retention deleted, by Deletion value.
        self.deleted_segments: dict[str, int] = {d.value: 0 for d in Deletion}
        self.flusher = CommitLogFlusher(self.commitlog, config, self.guard)
        self.page_cache = PageCacheWindow(self.commitlog.segments, config.commitlog_cache_bytes)
        self.flusher.after_flush.append(self._release_page_cache)
        self.dispatch_service = DispatchService(self.dispatcher)
        self._services: list[Service] = []
        self._abort = AbortMarker(config.data_dir / "abort")
        self._checkpoint_path = config.data_dir / "checkpoint"
        self._producers_path = config.data_dir / "producers.json"
        self._lock_fd: int | None = None
        self.recovery: RecoveryReport | None = None
        # (dispatched offset, queue entries) as of the last sync of queues and index.
        self._queues_durable = (0, 0)
        self._open = False

    def reconfigure(self, config: StoreConfig) -> None:
        """Take ``config``, which differs from the current one only in settings read at
        use (retention, disk thresholds, the async flush interval: see
        :mod:`metaq.broker.live_settings`), in every part that holds it."""
        self.config = config
        self.guard.config = config
        self.commitlog.config = config
        self.retention.config = config
        self.flusher.config = config
        if config.flush_mode is not FlushMode.SYNC:
            self.flusher.interval_s = config.flush_interval_ms / 1e3
            self.flusher.wakeup()

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> RecoveryReport:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        try:
            self.recovery = self._recover()
        except BaseException:
            # Unmap and unlock, so that the operator can repair the files and start again.
            self._release()
            self._unlock()
            raise
        self._services = [
            self.flusher,
            self.dispatch_service,
            _Checkpointer(self),
            CleanService(lambda: self.clean(), self.config.clean_interval_s),
        ]
        for service in self._services:
            service.start()
        self._open = True
        return self.recovery

    def _recover(self) -> RecoveryReport:
        self.commitlog.load()
        crashed = self._abort.found()
        if crashed:
            log.warning("abort marker found: the last run did not shut down cleanly")
        # The producer table as of the last checkpoint; recovery's re-dispatch, which
        # starts at or before the offset it was saved at, feeds it the rest.
        saved_at = self.producers.load(self._producers_path)
        report = recover(
            self.commitlog,
            self.queues,
            self.index,
            self.dispatcher,
            read_checkpoint(self._checkpoint_path),
            crashed,
            keep_damaged=self.config.keep_damaged_records,
        )
        if saved_at is not None and saved_at > self.commitlog.write_offset:
            log.warning(
                "the log was cut at %d, below the producer table saved at %d: trimming it",
                self.commitlog.write_offset, saved_at,
            )  # fmt: skip
        self.producers.truncate(self._queue_ends())
        self._abort.create()
        # Map (and pre-fault) the segment the next append goes to now, not on the hot path.
        try:
            self.commitlog.segments.segment_for_write(self.commitlog.write_offset)
        except OSError as exc:
            if exc.errno not in SPACE_ERRNOS:
                raise
            # A full disk still serves reads; the first append after room returns maps it.
            log.warning("no room for the next commitlog segment yet: %s", exc)
        self.guard.refresh_disk()
        # The recovered log is the log now: sync it, so the checkpoint below may say it is
        # durable. Left at 0, a crash before the next checkpoint would make recovery treat
        # damage anywhere in the log as a torn tail and cut every record after it.
        self.disk.sync_all(self.commitlog.segments.segments)
        self.flusher.durable = self.commitlog.write_offset
        self.page_cache.start_at(
            max(
                self.commitlog.min_offset,
                self.commitlog.write_offset - self.config.commitlog_cache_bytes,
            )
        )
        self.checkpoint()
        return report

    def _lock_data_dir(self) -> None:
        fd = os.open(self.config.data_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreUnavailable(
                f"data directory {self.config.data_dir} is in use by another process; "
                "stop it or give this broker its own data_dir"
            ) from None
        self._lock_fd = fd

    def close(self) -> None:
        """Clean shutdown: flush and checkpoint everything, then remove the abort marker."""
        if not self._open:
            return
        self._open = False
        for service in reversed(self._services):
            service.stop()
        self.dispatcher.catch_up()
        self.flusher.flush()
        self.checkpoint()
        self._release()
        self._abort.remove()
        self._unlock()

    def halt(self) -> None:
        """Stop as a crash would: no flush, no checkpoint, abort marker left (for tests)."""
        self._open = False
        for service in reversed(self._services):
            service.stop()
        self._release()
        self._unlock()

    def _release(self) -> None:
        self.commitlog.segments.close()
        self.queues.close()
        self.index.close()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- writes -----------------------------------------------------------------------

    def append(
        self,
        records: Sequence[bytes | bytearray | memoryview] | RecordBatch,
        *,
        wake_dispatcher: bool = True,
    ) -> Appended:
        """Append a batch of producer-built records; returns once they are in memory.

        Raises InvalidMessage (nothing written) or StoreUnavailable (writes refused).
        Under SYNC flush, wait with :meth:`wait_durable` or AsyncDurability before
        answering the producer. With ``wake_dispatcher=False`` the caller promises to
        call :meth:`dispatch_appended` soon (after it answered, say).
        """
        self.ensure_writable()
        if not self._open:
            raise StoreUnavailable("store is not open (starting or shutting down); retry")
        self.ensure_dispatching()
        if self.dispatcher.backlog_bytes > self.config.dispatch_backlog_bytes:
            self._wait_for_dispatch()
        try:
            appended = self.commitlog.append(records)
        except OSError as exc:
            raise self._write_failed(exc) from exc
        self._written(wake_dispatcher)
        return appended

    def _written(self, wake_dispatcher: bool) -> None:
        """After a write to the commitlog: dispatch it (unless the caller will) and have
        it flushed as the flush mode says."""
        if wake_dispatcher:
            self.dispatch_service.wakeup()
        if self.config.flush_mode is FlushMode.SYNC:
            self.flusher.request()
        else:
            self.flusher.maybe_request()

    def _write_failed(self, exc: OSError) -> StoreUnavailable:
        """Record a failed commitlog write; the error to answer it with. Nothing of the
        write is in the log (see CommitLog._open_ahead)."""
        self.guard.record_io_error(exc)
        if exc.errno in SPACE_ERRNOS:
            reason = self.guard.reason or (
                f"disk full, no room for the next commitlog segment ({exc}): free space or "
                "add disk; reads continue"
            )
            return StoreUnavailable(f"store refuses writes: {reason}")
        return StoreUnavailable(f"writing the commitlog failed: {exc}; retry")

    @property
    def refusal(self) -> str | None:
        """Why the store refuses writes now, or None while it takes them."""
        return self.dead_service or self.dispatch_starved or self.guard.reason

    @property
    def dispatch_starved(self) -> str | None:
        """Why the dispatcher waits for a file descriptor, if it does. Producers' writes
        are refused meanwhile (they would be stored but not readable; another broker can
        serve them now); a slave goes on copying its master's log."""
        exc = self.dispatch_service.starved
        if exc is None:
            return None
        limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return (
            f"the dispatcher cannot open a consume-queue or index file ({exc.strerror}; "
            f"open-file limit {limit}), so new messages would not be readable: it retries "
            "by itself; raise the limit (ulimit -n, systemd LimitNOFILE=, or prlimit --pid "
            "on the running broker) or close what holds descriptors; reads continue"
        )

    def catch_up_dispatch(self) -> None:
        """Dispatch everything appended, on this thread (a lookup by id needs the index
        whole); StoreUnavailable, not OSError, while no file descriptor can be had."""
        self.ensure_dispatching()
        try:
            self.dispatcher.catch_up()
        except OSError as exc:
            if exc.errno not in DESCRIPTOR_ERRNOS:
                raise
            self.dispatch_service.wakeup()  # it meets the same, waits and reports it
            raise StoreUnavailable(
                f"store refuses writes: no file descriptor to dispatch with ({exc}); retry"
            ) from exc

    def ensure_dispatching(self) -> None:
        """Raise StoreUnavailable while the dispatcher waits for a file descriptor."""
        starved = self.dispatch_starved
        if starved is not None:
            raise StoreUnavailable(f"store refuses writes: {starved}")

    @property
    def dead_service(self) -> str | None:
        """A background thread that died, and why. Without the dispatcher a send would
        be stored but never readable, without the flusher never durable, without the
        checkpointer recovery would redo ever more: writes stop until a restart."""
        for service in self._services:
            if service.error is not None:
                return (
                    f"the {service.name} thread died ({service.error!r}): fix the cause "
                    "(the broker's log has the traceback), then restart the broker; reads "
                    "continue"
                )
        return None

    def ensure_writable(self) -> None:
        """Raise StoreUnavailable, saying why and what to do, unless writes are taken."""
        dead = self.dead_service
        if dead is not None:
            raise StoreUnavailable(f"store refuses writes: {dead}")
        self.guard.ensure_writable()

    def dispatch_appended(self) -> None:
        """Dispatch what was appended: on this thread when it is little (at most
        ``dispatch_inline_bytes``) and the dispatcher thread is not at it, else there.

        A lone small append then reaches its consume queue, and a pull parked on it, with
        no wake-up of another thread, which on this path costs more than the dispatch.
        """
        dispatcher = self.dispatcher
        backlog = dispatcher.backlog_bytes
        if not backlog:
            return
        if backlog <= self.config.dispatch_inline_bytes and self.dispatch_service.starved is None:
            try:
                if dispatcher.try_dispatch() and not dispatcher.backlog_bytes:
                    return
            except Exception as exc:
                # Left to the dispatcher thread, which meets the same fault and records
                # it (and, short of a descriptor, waits and says so).
                if getattr(exc, "errno", None) not in DESCRIPTOR_ERRNOS:
                    log.exception("dispatching on the appending thread failed")
        self.dispatch_service.wakeup()

    def _wait_for_dispatch(self) -> None:
        room = self.dispatch_service.wait_for_room(
            self.config.dispatch_backlog_bytes, self.config.dispatch_backlog_wait_ms / 1e3
        )
        self.ensure_dispatching()
        if not room:
            raise StoreUnavailable(
                f"dispatch backlog over {self.config.dispatch_backlog_bytes} bytes for "
                f"{self.config.dispatch_backlog_wait_ms} ms; the broker is overloaded, retry"
            )

    def _release_page_cache(self, durable: int) -> None:
        # Dispatched bytes only: the dispatcher reads the log right behind the appends.
        self.page_cache.release_below(min(durable, self.dispatcher.dispatched))

    def wait_durable(self, offset: int, timeout_s: float | None = None) -> bool:
        if timeout_s is None:
            timeout_s = self.config.flush_timeout_ms / 1e3
        return self.flusher.wait_durable(offset, timeout_s)

    def put(
        self,
        topic: str,
        body: bytes,
        *,
        queue_id: int = 0,
        tags: str = "",
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
    ) -> PutResult:
        """Encode and append one message, waiting for durability under SYNC flush."""
        record = encode(
            topic,
            body,
            queue_id=queue_id,
            tags=tags,
            keys=keys,
            properties=properties,
            born_timestamp_ms=time.time_ns() // 1_000_000,
        )
        appended = self.append([record])
        status = PutStatus.OK
        if self.config.flush_mode is FlushMode.SYNC and not self.wait_durable(appended.end):
            status = PutStatus.FLUSH_DISK_TIMEOUT
        return PutResult(status, appended)

    # --- replication ------------------------------------------------------------------

    def append_replicated(
        self, offset: int, data: bytes | bytearray | memoryview, *, wake_dispatcher: bool = True
    ) -> None:
        """A slave writes bytes its master read (``CommitLog.read_chunk``), verbatim.

        With ``wake_dispatcher=False`` the caller calls :meth:`dispatch_appended` itself,
        after its acknowledgement of the bytes went out.
        """
        self.ensure_writable()
        try:
            self.commitlog.write_raw(offset, data)
        except OSError as exc:
            raise self._write_failed(exc) from exc
        self._written(wake_dispatcher)

    def truncate(self, offset: int) -> None:
        """Cut the log, queues and dispatch state at ``offset`` (a slave's diverged tail).

        Index entries past the cut stay: every lookup checks the record it finds.
        """
        with self.dispatcher.lock, self.flusher.lock:
            self.commitlog.truncate(offset)
            self.flusher.cut(offset)
            self.page_cache.cut(offset)
            for queue in self.queues.queues.values():
                queue.truncate_to_commitlog(offset)
            self.dispatcher.dispatched = min(self.dispatcher.dispatched, offset)
            self.producers.truncate(self._queue_ends())
            self.commitlog.queue_offsets = self.queues.next_offsets()
        # The cut queues are what recovery must trust from now on.
        self.checkpoint()

    def reset(self, offset: int) -> None:
        """Start an empty log at ``offset`` (a new slave of a master past retention)."""
        with self.dispatcher.lock, self.flusher.lock:
            self.commitlog.reset(offset)
            self.dispatcher.dispatched = offset
            self.flusher.durable = offset
            self.page_cache.start_at(offset)

    def _queue_ends(self) -> dict[tuple[bytes, int], int]:
        return {queue.key: queue.max_offset for queue in self.queues.queues.values()}

    def become_writer(self) -> None:
        """Before a slave's first own append: its queue offsets continue the dispatched
        queues, so every record it copied must be dispatched first."""
        self.dispatcher.catch_up()
        with self.dispatcher.lock:
            self.commitlog.queue_offsets = self.queues.next_offsets()

    # --- reads ------------------------------------------------------------------------

    def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        max_messages: int = 32,
        max_bytes: int = 4 * 1024 * 1024,
        tag_codes: Collection[int] | None = None,
    ) -> GetResult:
        key = (topic.encode(), queue_id)
        queue = self.queues.get(*key)
        result = read_batch(self.commitlog, queue, offset, max_messages, max_bytes, tag_codes)
        if (
            result.status is GetStatus.OFFSET_OVERFLOW_BADLY
            and offset <= self.commitlog.queue_offsets.get(key, 0)
        ):
            # Appended (and maybe acknowledged) but not dispatched yet: the offset is right,
            # its entry is just not visible. Nothing new yet, not a wrong offset.
            result.status = GetStatus.OFFSET_OVERFLOW_ONE
            result.next_offset = offset
        return result

    def min_offset(self, topic: str, queue_id: int) -> int:
        queue = self.queues.get(topic.encode(), queue_id)
        return queue.min_offset if queue else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next dispatched message will get; lag = this - consumed."""
        queue = self.queues.get(topic.encode(), queue_id)
        return queue.max_offset if queue else 0

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose message was stored at or after ``timestamp_ms``."""
        queue = self.queues.get(topic.encode(), queue_id)
        if queue is None:
            return 0
        lo, hi = queue.min_offset, queue.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            offset, size, _ = queue.entry(mid)
            view = self.commitlog.slice(offset, size)
            if view is None:  # deleted by retention: older than anything present
                lo = mid + 1
                continue
            if decode(view, verify=False).store_timestamp_ms < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def lookup_id(self, msg_id: bytes, topic: str | None = None) -> Record | None:
        """The record with ``msg_id`` (of ``topic`` only, when given: a replay may copy
        messages, ids and all, into another topic)."""
        found = self._lookup(
            key_for_id(msg_id),
            1,
            0,
            2**62,
            lambda r: r.msg_id == msg_id and (topic is None or r.topic == topic),
        )
        return found[0] if found else None

    def lookup_key(
        self, topic: str, key: str, *, limit: int = 32, begin_ms: int = 0, end_ms: int = 2**62
    ) -> list[Record]:
        """Messages of ``topic`` carrying ``key``, newest first."""
        return self._lookup(
            key_for_topic_key(topic.encode(), key.encode()),
            limit,
            begin_ms,
            end_ms,
            lambda r: r.topic == topic and key in r.keys,
        )

    def _lookup(
        self,
        index_key: bytes,
        limit: int,
        begin_ms: int,
        end_ms: int,
        match: Callable[[Record], bool],
    ) -> list[Record]:
        """Up to ``limit`` records that ``match``, newest first, from the index's candidates.

        Colliding hashes make candidates that do not match, so ask for more until enough
        match or the index has no more: newer collisions must not hide a real match.
        """
        want = max(limit * 2, 8)
        while True:
            offsets = self.index.lookup(index_key, want, begin_ms, end_ms)
            found = []
            for offset in offsets:
                record = self.record_at(offset)
                if record is not None and match(record):
                    found.append(record)
                    if len(found) >= limit:
                        return found
            if len(offsets) < want:
                return found
            want *= 4

    def store_timestamp_at(self, topic: str, queue_id: int, queue_offset: int) -> int | None:
        """When the message at ``queue_offset`` was stored (ms since the epoch), read from
        its header alone; None if there is no such entry or its record is gone."""
        queue = self.queues.get(topic.encode(), queue_id)
        if queue is None or not queue.min_offset <= queue_offset < queue.max_offset:
            return None
        offset, _, _ = queue.entry(queue_offset)
        field = _STORE_TIMESTAMP
        view = self.commitlog.slice(offset, field.end)
        if view is None or len(view) < field.end:
            return None
        return int(field.read(view))

    def record_at(self, offset: int) -> Record | None:
        """The record at commitlog ``offset``, CRC-checked; None if none is (intact) there."""
        if offset >= self.commitlog.write_offset:
            return None
        view = self.commitlog.slice(offset, _SIZE.end)
        if view is None:
            return None
        size = int(_SIZE.read(view))
        view = self.commitlog.slice(offset, size) if size else None
        if view is None:
            return None
        try:
            return decode(view)
        except Exception:  # a stale index entry pointing into a cut tail
            return None

    # --- background work -------------------------------------------------------------

    def checkpoint(self, *, queues: bool = True) -> Checkpoint:
        """Record what recovery may trust; with ``queues``, first make queues and index durable.

        The commitlog's durable offset is recorded every time. Syncing the queue and
        index files is rarer (``queue_sync_interval_ms``): every sync write-protects
        their pages again, and with 10,000 queues the faults that followed each sync cost
        a fifth of the dispatcher's throughput. Recovery then re-dispatches a little more.
        """
        if queues:
            # The dispatcher creates queues under this lock, so the table is stable here.
            with self.dispatcher.lock:
                dispatched = self.dispatcher.dispatched
                entries = sum(q.max_offset for q in self.queues.queues.values())
                dirty = self.queues.dirty_segments() + self.index.segments()
                # Saved before the checkpoint that trusts ``dispatched``: recovery then
                # re-dispatches from at or below the offset the table was saved at.
                producers = self.producers.dump(dispatched)
        durable = self.flusher.durable
        try:
            if queues:
                self.disk.sync_all(dirty)
                write_snapshot(self._producers_path, producers)
                self._queues_durable = (dispatched, entries)
            dispatched, entries = self._queues_durable
            checkpoint = Checkpoint(
                commitlog_durable=durable,
                dispatched=dispatched,
                queue_entries=entries,
                written_ms=time.time_ns() // 1_000_000,
            )
            write_checkpoint(self._checkpoint_path, checkpoint)
        except OSError as exc:
            self.guard.record_io_error(exc)
            raise
        return checkpoint

    def clean(self, now_s: float | None = None) -> int:
        """Check the disk and delete what retention allows; return segments deleted."""
        ratio = self.guard.refresh_disk()
        now = time.time() if now_s is None else now_s
        with self.dispatcher.lock:
            self.producers.expire(int(now * 1000) - self.config.producer_idle_ms)
        segments = self.commitlog.segments.segments
        safe_end = min(self.dispatcher.dispatched, self.flusher.durable)
        floors: Mapping[tuple[str, int], int] | None = None

        def consumed(end: int) -> bool:
            nonlocal floors
            if floors is None:
                floors = self.consumed_floors()
            return self._consumed_below(end, floors)

        doomed = self.retention.doomed(
            [(s.path, s.end) for s in segments],
            safe_end,
            ratio,
            time.time() if now_s is None else now_s,
            consumed,
        )
        if doomed:
            deleted = self.commitlog.segments.delete_before(segments[len(doomed) - 1].end)
            floor = self.commitlog.min_offset
            for queue in list(self.queues.queues.values()):
                queue.delete_before_commitlog(floor)
            self.index.delete_before(floor)
            for why in doomed:
                self.deleted_segments[why.value] += 1
            log.info(
                "retention deleted %s",
                ", ".join(
                    f"{s.path.name} ({why.value})" for s, why in zip(deleted, doomed, strict=False)
                ),
            )
        self.commitlog.segments.close_retired()
        return len(doomed)

    def _consumed_below(self, end: int, floors: Mapping[tuple[str, int], int]) -> bool:
        """Whether every queue entry pointing below commitlog offset ``end`` is below its
        queue's consumed floor: the log below ``end`` then holds nothing left to read."""
        with self.dispatcher.lock:
            queues = list(self.queues.queues.values())
        for queue in queues:
            lo = queue.min_offset
            if lo == queue.max_offset or queue.entry(lo)[0] >= end:
                continue  # nothing of this queue below end
            if floors.get((queue.topic, queue.queue_id), 0) < queue.first_at_or_after(end, lo):
                return False
        return True

    def background_busy(self) -> bool:
        """The dispatcher thread has records to dispatch (more than an appending thread
        dispatches itself), or a SYNC flush is under way."""
        if self.dispatcher.backlog_bytes > self.config.dispatch_inline_bytes:
            return True
        return (
            self.config.flush_mode is FlushMode.SYNC
            and self.flusher.durable < self.commitlog.write_offset
        )

    @property
    def dispatch_backlog_bytes(self) -> int:
        return self.dispatcher.backlog_bytes
