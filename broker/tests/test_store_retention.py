"""Retention deletes old segments; the write guard refuses writes on a full or failing disk."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from metaq.broker.store import GetStatus, MessageStore, StoreConfig
from metaq.broker.store.retention import Deletion, Retention
from metaq.broker.store.segment import RealDisk, Segment
from metaq.common.errors import StoreUnavailable
from metaq.common.record import decode, encode

OpenStore = Callable[..., MessageStore]

HOUR = 3600.0
NOW = time.time()
THIS_HOUR = time.localtime(NOW).tm_hour
OTHER_HOUR = (THIS_HOUR + 12) % 24


# --- Retention.doomed --------------------------------------------------------------------


def _segments(tmp_path: Path, ages_h: Sequence[float]) -> list[tuple[Path, int]]:
    """Segment files aged ``ages_h`` hours, oldest first, each ending 100 bytes later."""
    out = []
    for n, age in enumerate(ages_h):
        path = tmp_path / f"{n * 100:020d}"
        path.write_bytes(b"")
        os.utime(path, (NOW - age * HOUR, NOW - age * HOUR))
        out.append((path, (n + 1) * 100))
    return out


def _retention(tmp_path: Path, *, delete_hour: int) -> Retention:
    return Retention(
        StoreConfig(
            data_dir=tmp_path,
            commitlog_segment_bytes=1 << 20,
            max_message_bytes=64 * 1024,
            retention_hours=72,
            delete_hour=delete_hour,
            disk_clean_ratio=0.75,
            disk_force_clean_ratio=0.85,
            disk_full_ratio=0.90,
        )
    )


def test_expired_segments_go_at_the_delete_hour(tmp_path: Path) -> None:
    segments = _segments(tmp_path, [100, 90, 80, 1])
    retention = _retention(tmp_path, delete_hour=THIS_HOUR)

    assert len(retention.doomed(segments, safe_end=10**9, disk_ratio=0.1, now_s=NOW)) == 3


def test_expired_segments_stay_outside_the_delete_hour_while_the_disk_has_room(
    tmp_path: Path,
) -> None:
    segments = _segments(tmp_path, [100, 90, 1])
    retention = _retention(tmp_path, delete_hour=OTHER_HOUR)

    assert len(retention.doomed(segments, safe_end=10**9, disk_ratio=0.74, now_s=NOW)) == 0


@pytest.mark.parametrize("ratio", [0.75, 0.8])
def test_expired_segments_go_at_any_hour_once_the_disk_passes_the_clean_ratio(
    tmp_path: Path, ratio: float
) -> None:
    segments = _segments(tmp_path, [100, 90, 1])
    retention = _retention(tmp_path, delete_hour=OTHER_HOUR)

    assert len(retention.doomed(segments, safe_end=10**9, disk_ratio=ratio, now_s=NOW)) == 2


def test_unexpired_segments_stay_below_the_force_ratio(tmp_path: Path) -> None:
    segments = _segments(tmp_path, [10, 5, 1])
    retention = _retention(tmp_path, delete_hour=THIS_HOUR)

    assert len(retention.doomed(segments, safe_end=10**9, disk_ratio=0.84, now_s=NOW)) == 0


@pytest.mark.parametrize("ratio", [0.85, 0.95])
def test_unexpired_unconsumed_segments_stay_past_the_force_ratio_by_default(
    tmp_path: Path, ratio: float
) -> None:
    segments = _segments(tmp_path, [10, 5, 1])
    retention = _retention(tmp_path, delete_hour=OTHER_HOUR)

    assert retention.doomed(segments, safe_end=10**9, disk_ratio=ratio, now_s=NOW) == []


def test_consumed_segments_go_past_the_force_ratio_before_they_expire(tmp_path: Path) -> None:
    segments = _segments(tmp_path, [10, 5, 3, 1])
    retention = _retention(tmp_path, delete_hour=OTHER_HOUR)
    consumed_below = 200

    def consumed(end: int) -> bool:
        return end <= consumed_below

    below_force = retention.doomed(segments, 10**9, disk_ratio=0.84, now_s=NOW, consumed=consumed)
    past_force = retention.doomed(segments, 10**9, disk_ratio=0.85, now_s=NOW, consumed=consumed)

    assert below_force == []
    assert past_force == [Deletion.CONSUMED, Deletion.CONSUMED]


def test_expired_then_consumed_segments_go_in_order(tmp_path: Path) -> None:
    segments = _segments(tmp_path, [100, 5, 3, 1])
    retention = _retention(tmp_path, delete_hour=OTHER_HOUR)

    doomed = retention.doomed(
        segments, 10**9, disk_ratio=0.9, now_s=NOW, consumed=lambda end: end <= 200
    )

    assert doomed == [Deletion.EXPIRED, Deletion.CONSUMED]


@pytest.mark.parametrize("ratio", [0.85, 0.95])
def test_force_clean_unconsumed_deletes_the_oldest_unexpired_segment_and_warns(
    tmp_path: Path, ratio: float, caplog: pytest.LogCaptureFixture
) -> None:
    segments = _segments(tmp_path, [10, 5, 1])
    retention = Retention(
        dataclasses.replace(_retention(tmp_path, delete_hour=OTHER_HOUR).config,
                            force_clean_unconsumed=True)
    )  # fmt: skip

    with caplog.at_level(logging.WARNING):
        doomed = retention.doomed(segments, safe_end=10**9, disk_ratio=ratio, now_s=NOW)

    assert doomed == [Deletion.UNCONSUMED]
    assert segments[0][0].name in caplog.text
    assert "force_clean_unconsumed" in caplog.text
    below = retention.doomed(segments, safe_end=10**9, disk_ratio=0.84, now_s=NOW)
    assert below == []


def test_deletion_stops_at_the_first_unexpired_segment(tmp_path: Path) -> None:
    segments = _segments(tmp_path, [100, 10, 90, 1])
    retention = _retention(tmp_path, delete_hour=THIS_HOUR)

    assert len(retention.doomed(segments, safe_end=10**9, disk_ratio=0.1, now_s=NOW)) == 1


def test_the_last_segment_is_never_deleted(tmp_path: Path) -> None:
    segments = _segments(tmp_path, [100, 100, 100])
    retention = _retention(tmp_path, delete_hour=THIS_HOUR)

    assert len(retention.doomed(segments, safe_end=10**9, disk_ratio=0.99, now_s=NOW)) == 2
    assert len(retention.doomed(segments[-1:], safe_end=10**9, disk_ratio=0.99, now_s=NOW)) == 0


@pytest.mark.parametrize(("safe_end", "expected"), [(0, 0), (99, 0), (100, 1), (250, 2)])
def test_nothing_past_safe_end_is_deleted(tmp_path: Path, safe_end: int, expected: int) -> None:
    segments = _segments(tmp_path, [100, 100, 100, 100])
    retention = _retention(tmp_path, delete_hour=THIS_HOUR)

    assert len(retention.doomed(segments, safe_end, disk_ratio=0.99, now_s=NOW)) == expected


# --- store.clean ---------------------------------------------------------------------------

SEGMENT = 256 * 1024


@pytest.fixture
def aged(open_store: OpenStore) -> MessageStore:
    """A store whose commitlog spans four and a half segments, all but the last expired."""
    store = open_store(
        commitlog_segment_bytes=SEGMENT,
        consume_queue_segment_entries=16,
        index_entries=64,
        delete_hour=THIS_HOUR,
    )
    n = 0
    while store.commitlog.write_offset < 4 * SEGMENT + SEGMENT // 2:
        store.append([encode("t", bytes([n % 256]) * 4000, queue_id=n % 2, keys=[f"k{n}"])])
        n += 1
    store.dispatcher.catch_up()
    store.flusher.flush()
    for segment in store.commitlog.segments.segments[:-1]:
        os.utime(segment.path, (NOW - 100 * HOUR, NOW - 100 * HOUR))
    return store


def test_clean_deletes_expired_segments_and_queues_follow(aged: MessageStore) -> None:
    store = aged
    first = decode(store.get("t", 0, 0).records[0])
    survivor_at = 4 * SEGMENT
    index_files = len(list(store.config.index_dir.iterdir()))

    deleted = store.clean(now_s=NOW)

    assert deleted == 4
    assert store.commitlog.min_offset == survivor_at
    assert sorted(p.name for p in store.config.commitlog_dir.iterdir())[0] == f"{survivor_at:020d}"
    assert len(list(store.config.index_dir.iterdir())) < index_files
    assert store.lookup_id(first.msg_id) is None
    for queue_id in (0, 1):
        low = store.min_offset("t", queue_id)
        assert low > 0
        too_small = store.get("t", queue_id, 0)
        assert (too_small.status, too_small.next_offset) == (GetStatus.OFFSET_TOO_SMALL, low)
        assert store.get("t", queue_id, low - 1).status is GetStatus.OFFSET_TOO_SMALL
        found = store.get("t", queue_id, low, max_messages=1)
        assert found.status is GetStatus.FOUND
        record = decode(found.records[0])
        assert record.commitlog_offset >= survivor_at
        assert store.lookup_id(record.msg_id) == record
        # Queue files wholly below the new minimum are gone too.
        names = sorted((store.config.consume_queue_dir / "t" / str(queue_id)).iterdir())
        assert int(names[0].name) // 20 <= low < int(names[0].name) // 20 + 16


def test_clean_outside_the_delete_hour_keeps_everything(aged: MessageStore) -> None:
    other = NOW + 12 * HOUR  # twelve hours away from the configured delete hour

    assert aged.clean(now_s=other) == 0
    assert aged.commitlog.min_offset == 0


def test_clean_never_deletes_what_is_not_yet_flushed(aged: MessageStore) -> None:
    aged.flusher.durable = SEGMENT + 1  # pretend the flusher lags behind

    assert aged.clean(now_s=NOW) == 1
    assert aged.commitlog.min_offset == SEGMENT


def test_queue_min_offsets_survive_a_restart_after_retention(
    aged: MessageStore, open_store: OpenStore
) -> None:
    aged.clean(now_s=NOW)
    lows = [aged.min_offset("t", q) for q in (0, 1)]
    aged.close()

    store = open_store(aged.config)

    assert [store.min_offset("t", q) for q in (0, 1)] == lows
    result = store.get("t", 0, 0)
    assert (result.status, result.next_offset) == (GetStatus.OFFSET_TOO_SMALL, lows[0])


def test_reading_entries_whose_records_were_deleted_is_offset_moved(aged: MessageStore) -> None:
    """clean() deletes commitlog files before the queues follow; a read in between."""
    store = aged
    store.commitlog.segments.delete_before(2 * SEGMENT)
    first_left = next(
        n
        for n in range(store.max_offset("t", 0))
        if store.queues.get(b"t", 0).entry(n)[0] >= 2 * SEGMENT  # type: ignore[union-attr]
    )

    result = store.get("t", 0, 0)

    assert (result.status, result.records) == (GetStatus.OFFSET_MOVED, [])
    assert result.next_offset == first_left
    assert store.get("t", 0, first_left).status is GetStatus.FOUND


def test_a_readers_view_of_a_deleted_segment_stays_readable(aged: MessageStore) -> None:
    store = aged
    result = store.get("t", 0, 0, max_messages=8)
    copies = [bytes(view) for view in result.records]
    path = store.commitlog.segments.segments[0].path

    store.clean(now_s=NOW)

    assert not path.exists()
    assert [bytes(view) for view in result.records] == copies
    assert decode(result.records[0]).body == copies[0][-4000:]
    assert store.commitlog.segments.close_retired() == 1  # still mapped for the reader
    result.release()
    assert store.commitlog.segments.close_retired() == 0  # unmapped once it let go


def _three_segments(store: MessageStore) -> None:
    while store.commitlog.write_offset < 3 * SEGMENT:
        store.append([encode("t", bytes(4000), queue_id=n % 2) for n in range(4)])
    store.dispatcher.catch_up()
    store.flusher.flush()


def test_clean_keeps_unconsumed_unexpired_segments_when_the_disk_is_nearly_full(
    open_store: OpenStore,
) -> None:
    store = open_store(
        commitlog_segment_bytes=SEGMENT, delete_hour=OTHER_HOUR, disk_usage=lambda _p: 0.86
    )
    _three_segments(store)

    assert store.clean(now_s=NOW) == 0
    assert store.commitlog.min_offset == 0
    assert store.deleted_segments == {"expired": 0, "consumed": 0, "unconsumed": 0}


def test_clean_deletes_segments_every_group_consumed_when_the_disk_is_nearly_full(
    open_store: OpenStore,
) -> None:
    store = open_store(
        commitlog_segment_bytes=SEGMENT, delete_hour=OTHER_HOUR, disk_usage=lambda _p: 0.86
    )
    _three_segments(store)
    queue0, queue1 = store.queues.get(b"t", 0), store.queues.get(b"t", 1)
    assert queue0 is not None and queue1 is not None
    # Every entry of both queues whose record lies in the first segment.
    first = [
        sum(1 for n in range(q.max_offset) if q.entry(n)[0] < SEGMENT) for q in (queue0, queue1)
    ]
    floors = {("t", 0): first[0], ("t", 1): first[1] - 1}
    store.consumed_floors = lambda: floors

    assert store.clean(now_s=NOW) == 0  # queue 1's last entry there is not consumed yet

    floors[("t", 1)] = first[1]
    assert store.clean(now_s=NOW) == 1
    assert store.commitlog.min_offset == SEGMENT
    assert store.deleted_segments["consumed"] == 1
    assert store.min_offset("t", 0) == first[0]


def test_clean_with_force_clean_unconsumed_deletes_the_oldest_segment_and_counts_it(
    open_store: OpenStore,
) -> None:
    usage = {"ratio": 0.0}
    store = open_store(
        commitlog_segment_bytes=SEGMENT,
        delete_hour=OTHER_HOUR,
        force_clean_unconsumed=True,
        disk_usage=lambda _p: usage["ratio"],
    )
    _three_segments(store)

    assert store.clean(now_s=NOW) == 0
    usage["ratio"] = 0.86
    assert store.clean(now_s=NOW) == 1
    assert store.commitlog.min_offset == SEGMENT
    assert store.deleted_segments["unconsumed"] == 1


# --- the write guard -----------------------------------------------------------------------


def test_a_full_disk_refuses_writes_but_reads_go_on(open_store: OpenStore) -> None:
    usage = {"ratio": 0.5}
    store = open_store(disk_usage=lambda _p: usage["ratio"])
    store.put("orders", b"kept")
    store.dispatcher.catch_up()
    end = store.commitlog.write_offset

    usage["ratio"] = 0.95
    store.clean()  # the cleaner's round is what notices

    with pytest.raises(StoreUnavailable, match="disk 95% full") as info:
        store.put("orders", b"refused")
    assert info.value.retriable
    assert store.commitlog.write_offset == end
    result = store.get("orders", 0, 0)
    assert result.status is GetStatus.FOUND
    assert decode(result.records[0]).body == b"kept"

    usage["ratio"] = 0.5
    store.clean()
    assert store.put("orders", b"accepted again").appended.queue_offsets == [1]


def test_a_disk_full_at_start_refuses_the_first_write(open_store: OpenStore) -> None:
    store = open_store(disk_usage=lambda _p: 0.95)

    with pytest.raises(StoreUnavailable, match="full"):
        store.append([encode("orders", b"x")])
    assert store.commitlog.write_offset == 0


def test_repeated_io_errors_refuse_writes(open_store: OpenStore) -> None:
    store = open_store()
    store.put("orders", b"kept")
    store.dispatcher.catch_up()
    error = OSError(5, "Input/output error")

    store.guard.record_io_error(error)
    store.guard.record_io_error(error)
    store.put("orders", b"two errors are tolerated")
    store.guard.record_io_error(error)

    with pytest.raises(StoreUnavailable, match="3 consecutive I/O errors"):
        store.put("orders", b"refused")
    assert store.get("orders", 0, 0).status is GetStatus.FOUND


def test_a_success_between_io_errors_resets_the_count(open_store: OpenStore) -> None:
    store = open_store()
    error = OSError(5, "Input/output error")

    for _ in range(2):
        store.guard.record_io_error(error)
    store.guard.record_io_success()
    for _ in range(2):
        store.guard.record_io_error(error)

    store.put("orders", b"still writable")


class FailingDisk:
    """Syncs for real until told to fail."""

    def __init__(self) -> None:
        self.real = RealDisk()
        self.failing = False

    def sync(self, segment: Segment) -> None:
        if self.failing:
            raise OSError(5, "Input/output error")
        self.real.sync(segment)

    def sync_all(self, segments: Sequence[Segment]) -> None:
        self.real.sync_all(segments)


def test_failing_commitlog_syncs_refuse_writes(open_store: OpenStore) -> None:
    disk = FailingDisk()
    store = open_store(disk=disk)
    store.put("orders", b"durable")
    store.flusher.flush()
    disk.failing = True

    for n in range(3):
        store.put("orders", f"not durable {n}".encode())
        store.flusher.flush()

    with pytest.raises(StoreUnavailable, match=r"I/O errors.*Input/output error"):
        store.put("orders", b"refused")
