"""Store settings: one frozen dataclass, units in the names, checked at start-up."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from pathlib import Path

from metaq.common.record import HEADER_SIZE

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB


def share_of_memory(fraction: float) -> int:
    """``fraction`` of this host's physical memory, in bytes."""
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * fraction)


class FlushMode(enum.Enum):
    SYNC = "sync"
    """An append is answered once its bytes are fsynced (group commit)."""
    ASYNC = "async"
    """An append is answered once its bytes are in the page cache; a flusher follows."""


@dataclass(frozen=True, slots=True)
class StoreConfig:
    data_dir: Path
    flush_mode: FlushMode = FlushMode.ASYNC
    commitlog_segment_bytes: int = 1 * GIB
    consume_queue_segment_entries: int = 300_000
    # Consume-queue files kept mapped at most; idle queues' files are unmapped and mapped
    # again when touched (store/mapping.py). Each mapping is one of the process's
    # vm.max_map_count areas (65,530 by default), so this leaves half of them to the rest.
    mapped_queue_files: int = 32_768
    # Small enough that re-indexing the newest file after a crash stays well under a second.
    index_slots: int = 100_000
    index_entries: int = 400_000
    max_message_bytes: int = 4 * MIB
    max_properties_bytes: int = 32 * KIB
    flush_timeout_ms: int = 5_000
    flush_interval_ms: int = 500
    flush_dirty_bytes: int = 64 * MIB
    checkpoint_interval_ms: int = 1_000
    queue_sync_interval_ms: int = 10_000
    # Write zeros through each new commitlog segment so appends never page-fault; its
    # blocks are allocated either way (a full disk is then an error, not SIGBUS).
    prefault_segments: bool = True
    # The newest commitlog bytes kept in the page cache; older flushed pages are handed
    # back (store/page_cache.py). 40 % of memory, the share RocketMQ assumes the log has
    # (accessMessageInMemoryMaxRatio); 0 leaves the page cache to the kernel alone.
    commitlog_cache_bytes: int = field(default_factory=lambda: share_of_memory(0.4))
    dispatch_backlog_bytes: int = 256 * MIB
    # Appends of at most this many bytes are dispatched by the appending thread itself
    # (MessageStore.dispatch_appended): no wake-up of the dispatcher thread, which a busy
    # loop keeps waiting for the GIL (docs/broker.md).
    dispatch_inline_bytes: int = 256 * KIB
    dispatch_backlog_wait_ms: int = 1_000
    retention_hours: float = 72.0
    delete_hour: int = 4
    clean_interval_s: float = 10.0
    disk_clean_ratio: float = 0.75
    disk_force_clean_ratio: float = 0.85
    disk_full_ratio: float = 0.90
    # Free space writes never eat into, on top of the next commitlog segment when it is
    # not allocated yet: consume queue and index files grow sparse (a store into a page the
    # filesystem cannot back is SIGBUS, not an error), and the checkpoint and JSON files
    # are rewritten, so some room must be left when the appends stop.
    disk_reserve_bytes: int = 64 * MIB
    # How stale the free-space sample the write path judges by may be.
    disk_check_interval_ms: int = 100
    # Past disk_force_clean_ratio, delete the oldest segment even when it holds messages
    # some consumer group has not consumed and that have not expired (logged and counted).
    # Off: only expired or fully consumed segments go, and writes stop when none is left.
    force_clean_unconsumed: bool = False
    io_error_limit: int = 3
    store_host: bytes = bytes(8)
    # A replica's store: a record whose content fails its CRC in the middle of the log
    # is kept aside (not served) for repair from the master rather than stopping the
    # start; the broker sets it when a failover controller runs its group.
    keep_damaged_records: bool = False
    # Idempotent producers (store/producers.py): runs of sequences kept per producer and
    # queue, and how long after its last record a producer is forgotten.
    producer_batches: int = 5
    producer_idle_ms: int = 86_400_000

    def __post_init__(self) -> None:
        largest_record = HEADER_SIZE + 2048 + self.max_properties_bytes + self.max_message_bytes
        problems = []
        if self.commitlog_segment_bytes < largest_record + HEADER_SIZE:
            problems.append(
                f"commitlog_segment_bytes={self.commitlog_segment_bytes} must exceed the "
                f"largest record ({largest_record} bytes with max_message_bytes="
                f"{self.max_message_bytes}); lower max_message_bytes or grow the segments"
            )
        if self.commitlog_cache_bytes < 0:
            problems.append("commitlog_cache_bytes must be 0 (off) or a number of bytes")
        if self.consume_queue_segment_entries < 1:
            problems.append("consume_queue_segment_entries must be at least 1")
        if self.mapped_queue_files < 1:
            problems.append(
                f"mapped_queue_files={self.mapped_queue_files} must be at least 1 (consume-"
                "queue files kept mapped; keep it well under sysctl vm.max_map_count)"
            )
        if self.index_slots < 1 or self.index_entries < 1:
            problems.append("index_slots and index_entries must be at least 1")
        if not 0 < self.disk_clean_ratio <= self.disk_force_clean_ratio <= self.disk_full_ratio:
            problems.append(
                "need 0 < disk_clean_ratio <= disk_force_clean_ratio <= disk_full_ratio <= 1"
            )
        if self.disk_full_ratio > 1:
            problems.append("disk_full_ratio is a fraction of the disk, at most 1")
        if not self.retention_hours > 0:
            problems.append(
                f"retention_hours={self.retention_hours} must be positive: it is how long "
                "messages are kept (72 keeps three days)"
            )
        if not 0 <= self.delete_hour <= 23:
            problems.append("delete_hour is an hour of the day, 0-23")
        if len(self.store_host) != 8:
            problems.append("store_host is 8 bytes: IPv4 address, port, two reserved")
        for name in (
            "max_message_bytes",
            "flush_timeout_ms",
            "flush_interval_ms",
            "flush_dirty_bytes",
            "checkpoint_interval_ms",
            "queue_sync_interval_ms",
            "dispatch_backlog_bytes",
            "dispatch_backlog_wait_ms",
            "clean_interval_s",
            "disk_check_interval_ms",
            "io_error_limit",
            "producer_batches",
            "producer_idle_ms",
        ):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be positive, not {getattr(self, name)}")
        for name in ("max_properties_bytes", "dispatch_inline_bytes", "disk_reserve_bytes"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be 0 or more, not {getattr(self, name)}")
        if problems:
            raise ValueError("invalid store config: " + "; ".join(problems))

    @property
    def commitlog_dir(self) -> Path:
        return self.data_dir / "commitlog"

    @property
    def consume_queue_dir(self) -> Path:
        return self.data_dir / "consumequeue"

    @property
    def index_dir(self) -> Path:
        return self.data_dir / "index"
