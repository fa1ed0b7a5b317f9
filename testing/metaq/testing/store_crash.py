"""Shared by the crash tests and their child process: a small-segment config and a checker.

Not a test module (pytest does not collect it). Tests load it by path, the child imports
it from its own directory.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from pathlib import Path
from typing import Any

from metaq.broker.store import FlushMode, GetStatus, MessageStore, StoreConfig
from metaq.broker.store.config import KIB
from metaq.common.record import Record, decode, tag_code

SEGMENT_BYTES = 256 * KIB


def small_config(data_dir: Path, flush_mode: FlushMode, **overrides: Any) -> StoreConfig:
    """Small files everywhere, so a few MiB of messages roll every kind of file."""
    settings: dict[str, Any] = {
        "flush_mode": flush_mode,
        "commitlog_segment_bytes": SEGMENT_BYTES,
        "max_message_bytes": 64 * KIB,
        "max_properties_bytes": 1 * KIB,
        "consume_queue_segment_entries": 64,
        "index_slots": 256,
        "index_entries": 512,
        "clean_interval_s": 3600.0,
    }
    settings.update(overrides)
    return StoreConfig(data_dir, **settings)


def no_disk_pressure(_: Path) -> float:
    """Disk usage as the store sees it: never full, so retention never deletes a segment."""
    return 0.0


def open_store(config: StoreConfig, **kwargs: Any) -> MessageStore:
    store = MessageStore(config, disk_usage=no_disk_pressure, **kwargs)
    store.start()
    return store


def body_hash(body: bytes) -> str:
    return hashlib.blake2b(body, digest_size=16).hexdigest()


def check_store(store: MessageStore) -> list[tuple[Record, bytes]]:
    """Assert the commitlog and the consume queues agree; return (record, raw bytes) in log order.

    Every record in the log decodes with a good CRC at the offset stamped in it; each
    (topic, queue) has queue offsets 0..n-1 in log order with no gap; every queue entry
    points at the record with its topic, queue id and queue offset; and get() returns
    those records whole, byte for byte. Call it on a quiescent store.
    """
    commitlog = store.commitlog
    found: list[tuple[Record, bytes]] = []
    end = commitlog.min_offset
    for offset, view in commitlog.records(commitlog.min_offset, commitlog.write_offset):
        record = decode(view)  # raises InvalidRecord on a torn or corrupt record
        assert record.commitlog_offset == offset, f"record at {offset} stamped elsewhere"
        found.append((record, bytes(view)))
        end = offset + record.size
    # The walk stops at the first empty slot; it must have reached the end of the log
    # (or the blank end of a full segment just before it), so no record hides past a hole.
    write_offset = commitlog.write_offset
    assert end == write_offset or (
        write_offset % commitlog.segments.segment_bytes == 0
        and write_offset - commitlog.segments.segment_bytes < end < write_offset
    ), f"log walk ended at {end}, write offset is {write_offset}"

    by_queue: dict[tuple[str, int], list[tuple[Record, bytes]]] = defaultdict(list)
    for record, raw in found:
        by_queue[(record.topic, record.queue_id)].append((record, raw))
    known = set(by_queue) | {(t.decode(), q) for t, q in store.queues.queues}
    for topic, queue_id in sorted(known):
        expected = by_queue.get((topic, queue_id), [])
        offsets = [record.queue_offset for record, _ in expected]
        assert offsets == list(range(len(expected))), f"{topic}/{queue_id} offsets {offsets}"
        assert store.min_offset(topic, queue_id) == 0
        assert store.max_offset(topic, queue_id) == len(expected), f"{topic}/{queue_id}"
        queue = store.queues.get(topic.encode(), queue_id)
        for n, (record, raw) in enumerate(expected):
            assert queue is not None
            assert queue.entry(n) == (record.commitlog_offset, len(raw), tag_code(record.tags))
        _walk_queue(store, topic, queue_id, expected)
    return found


def _walk_queue(
    store: MessageStore, topic: str, queue_id: int, expected: list[tuple[Record, bytes]]
) -> None:
    offset = 0
    while True:
        result = store.get(topic, queue_id, offset, max_messages=7)
        try:
            if result.status in (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE):
                break
            assert result.status is GetStatus.FOUND, f"{topic}/{queue_id}@{offset}: {result}"
            assert result.queue_offsets[0] == offset
            for n, view in zip(result.queue_offsets, result.records, strict=True):
                got = decode(view)  # a partial record would fail its CRC here
                want, raw = expected[n]
                assert bytes(view) == raw
                assert got.commitlog_offset == want.commitlog_offset
                assert (got.topic, got.queue_id, got.queue_offset) == (topic, queue_id, n)
            offset = result.next_offset
        finally:
            result.release()
    assert offset == len(expected)
