"""The store stops writing before the filesystem is full, and a write that meets a full
disk leaves nothing of itself behind."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

import pytest

from metaq.broker.store import GetStatus, MessageStore
from metaq.broker.store.config import MIB
from metaq.broker.store.retention import DiskSpace
from metaq.broker.store.segment import Segment
from metaq.common.errors import StoreUnavailable
from metaq.common.record import decode, encode

OpenStore = Callable[..., MessageStore]

SEGMENT = 1 << 20  # conftest's SMALL
TOTAL = 1000 * MIB


class FakeDisk:
    """A filesystem of TOTAL bytes with ``available`` free, as statvfs would say."""

    def __init__(self, available: int, used: int | None = None) -> None:
        self.available = available
        self.used = used
        """None: whatever is not available (size = used + available)."""

    def __call__(self, _path: Path) -> DiskSpace:
        used = TOTAL - self.available if self.used is None else self.used
        return DiskSpace(used, self.available)


def _forget_prepared(store: MessageStore) -> None:
    """Drop the next segment made ahead, as if there had been no room to make it."""
    segments = store.commitlog.segments
    if segments._next is not None:
        segments._discard(segments._next.result())
        segments._next = None


def _fill_first_segment(store: MessageStore) -> None:
    """Append until the next 8 KiB record no longer fits the first segment."""
    n = 0
    while store.commitlog.write_offset + 8200 <= SEGMENT:
        store.append([encode("orders", bytes(8000), keys=[f"k{n}"])])
        n += 1


def test_writes_are_refused_when_free_space_less_the_next_segment_is_under_the_reserve(
    open_store: OpenStore,
) -> None:
    disk = FakeDisk(available=100 * MIB)
    store = open_store(
        disk_usage=disk,
        disk_reserve_bytes=10 * MIB,
        disk_check_interval_ms=1,
        disk_full_ratio=1.0,  # the reserve alone decides here
    )
    store.put("orders", b"kept")
    _forget_prepared(store)

    disk.available = 10 * MIB + SEGMENT - 1
    store.guard.refresh_disk()
    refusal = r"under the reserve: .*store.disk_reserve_bytes"
    with pytest.raises(StoreUnavailable, match=refusal) as info:
        store.put("orders", b"refused")
    assert info.value.retriable
    assert "next segment" in str(info.value)
    store.dispatcher.catch_up()
    assert store.get("orders", 0, 0).status is GetStatus.FOUND

    disk.available = 10 * MIB + SEGMENT
    store.guard.refresh_disk()
    assert store.put("orders", b"accepted again").appended.queue_offsets == [1]


def test_disk_use_is_counted_as_df_counts_it_on_a_volume_larger_than_used_plus_available(
    open_store: OpenStore,
) -> None:
    # A thin-provisioned 252 GB volume: 42 GB used, 61 GB available, which df calls 41 %
    # used; 1 - available / size would say 76 %.
    gb = 1000**3
    assert DiskSpace(42 * gb, 61 * gb).used_ratio == pytest.approx(42 / 103)
    # The fake volume is TOTAL (1000 MiB) large: by 1 - available / size it is 94 % full.
    disk = FakeDisk(available=61 * MIB, used=42 * MIB)
    store = open_store(disk_usage=disk, disk_reserve_bytes=1 * MIB)
    assert store.config.disk_full_ratio == 0.9
    assert store.put("orders", b"taken at 41 %").appended.queue_offsets == [0]

    # Over the ratio: the refusal says both figures, the ratio and the bytes free
    # beside the reserve.
    disk.used, disk.available = 95 * MIB, 5 * MIB
    store.guard.refresh_disk()
    with pytest.raises(StoreUnavailable, match="disk 95% full") as info:
        store.put("orders", b"refused")
    message = str(info.value)
    assert "limit 90%, store.disk_full_ratio" in message
    assert "95.0 MiB used, 5.0 MiB available (reserve 1.0 MiB, store.disk_reserve_bytes)" in (
        message
    )


def test_the_write_path_samples_the_disk_itself_between_cleaner_rounds(
    open_store: OpenStore, wait_until: Callable[[Callable[[], bool], float, str], None]
) -> None:
    """The cleaner runs every clean_interval_s (an hour here); a disk filling from
    outside is noticed within disk_check_interval_ms anyway."""
    disk = FakeDisk(available=500 * MIB)
    store = open_store(disk_usage=disk, disk_check_interval_ms=20)
    store.put("orders", b"kept")

    disk.available = TOTAL // 20  # 95 % full

    def refused() -> bool:
        try:
            store.put("orders", b"probe")
        except StoreUnavailable as exc:
            return "disk 95% full" in str(exc)
        return False

    wait_until(refused, 5.0, "a send is refused for the full disk")


@pytest.mark.parametrize("checked", [False, True], ids=["records", "checked-batch"])
def test_a_batch_that_cannot_get_its_next_segment_leaves_nothing_behind(
    open_store: OpenStore, monkeypatch: pytest.MonkeyPatch, checked: bool
) -> None:
    store = open_store()
    _fill_first_segment(store)
    store.flusher.flush()
    end = store.commitlog.write_offset
    _forget_prepared(store)
    segments = store.commitlog.segments

    def no_space(start: int, prefault: bool) -> Segment:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(segments, "_open", no_space)
    batch = [encode("orders", bytes(8000), keys=[f"lost-{n}"]) for n in range(3)]
    records = store.commitlog.check_batch(memoryview(b"".join(batch)), b"orders", 0)
    assert records is not None
    with pytest.raises(StoreUnavailable, match="disk full"):
        store.append(records if checked else batch)
    assert store.commitlog.write_offset == end
    # Not sticky: a full disk is not a failing device.
    assert store.guard.io_errors == 0
    store.flusher.flush()
    monkeypatch.undo()
    config = store.config
    store.halt()  # a crash: recovery walks the log past the checkpoint

    reopened = open_store(config)

    assert reopened.commitlog.write_offset == end
    keys = [decode(r).keys for r in reopened.get("orders", 0, 0, max_messages=1000).records]
    assert not any(k[0].startswith("lost-") for k in keys)
    appended = reopened.append(batch)
    assert appended.start == end


def test_the_guard_lets_writes_through_again_after_enospc_once_room_returns(
    open_store: OpenStore,
) -> None:
    disk = FakeDisk(available=500 * MIB)
    store = open_store(disk_usage=disk, disk_reserve_bytes=10 * MIB, disk_full_ratio=1.0)
    store.put("orders", b"kept")

    disk.available = 1 * MIB
    for _ in range(store.config.io_error_limit + 1):
        store.guard.record_io_error(OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(StoreUnavailable, match="disk"):
        store.put("orders", b"refused")

    disk.available = 500 * MIB
    store.guard.refresh_disk()
    assert store.put("orders", b"accepted").appended.queue_offsets == [1]


class FillingDisk(FakeDisk):
    """``available`` less what the commitlog's files take, as on a real filesystem."""

    def __call__(self, path: Path) -> DiskSpace:
        taken = sum(f.stat().st_size for f in (path / "commitlog").glob("*"))
        return DiskSpace(TOTAL - self.available + taken, self.available - taken)


def test_a_segment_not_prepared_for_want_of_room_is_made_once_room_returns(
    open_store: OpenStore,
) -> None:
    disk = FillingDisk(available=10 * MIB)
    store = open_store(
        disk_usage=disk, disk_reserve_bytes=10 * MIB - SEGMENT - SEGMENT // 2, disk_full_ratio=1.0
    )
    # The first segment was allowed; the next one, prepared behind it, was not.
    segments = store.commitlog.segments
    assert segments._next is not None
    segments._next.exception(timeout=5.0)
    assert segments.pending_bytes() == SEGMENT
    assert sorted(p.name for p in store.config.commitlog_dir.iterdir()) == [f"{0:020d}"]
    with pytest.raises(StoreUnavailable, match="next segment"):
        store.put("orders", b"refused")

    disk.available = 100 * MIB
    store.guard.refresh_disk()
    _fill_first_segment(store)
    crossing = store.append([encode("orders", bytes(8000)) for _ in range(2)])

    assert crossing.end > SEGMENT
    assert len(segments.segments) == 2
