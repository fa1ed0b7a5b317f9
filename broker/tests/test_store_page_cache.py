"""The commitlog's page-cache window: flushed, dispatched pages behind it are handed back
to the kernel, the records in them still read back intact, and nothing ahead is touched.

Residency is asked of the kernel itself (mincore on a mapping of the segment file).
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Callable
from pathlib import Path

import pytest

from metaq.broker.store import MessageStore
from metaq.broker.store.config import StoreConfig, share_of_memory
from metaq.broker.store.page_cache import STEP_BYTES
from metaq.common.record import encode

OpenStore = Callable[..., MessageStore]
MIB = 1 << 20
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
_libc.mmap.argtypes += [ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_bytes(path: Path, start: int, end: int) -> int:
    """How many bytes of ``path`` between ``start`` and ``end`` are in the page cache.

    A fresh read-only mapping faults nothing in; mincore then reports the page cache.
    """
    size = path.stat().st_size
    with path.open("rb") as file:
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, file.fileno(), 0)
        assert address not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vector = (ctypes.c_ubyte * pages)()
            assert _libc.mincore(address, size, vector) == 0, ctypes.get_errno()
        finally:
            _libc.munmap(address, size)
    first, last = start // mmap.PAGESIZE, -(-end // mmap.PAGESIZE)
    return sum(vector[n] & 1 for n in range(first, last)) * mmap.PAGESIZE


def resident_in_log(store: MessageStore, start: int, end: int) -> int:
    total = 0
    for segment in store.commitlog.segments.segments:
        lo, hi = max(start, segment.start), min(end, segment.end)
        if lo < hi:
            total += resident_bytes(segment.path, lo - segment.start, hi - segment.start)
    return total


def fill(store: MessageStore, nbytes: int) -> list[int]:
    """Append 1 KiB messages until the log holds ``nbytes``; their commitlog offsets."""
    offsets: list[int] = []
    while store.commitlog.write_offset < nbytes:
        first = len(offsets)
        batch = [encode("T", b"%07d" % n + bytes(1017)) for n in range(first, first + 64)]
        offsets += store.append(batch).commitlog_offsets
    return offsets


@pytest.fixture
def windowed(open_store: OpenStore) -> MessageStore:
    """A store of 4 MiB segments keeping 4 MiB of the log in the page cache."""
    return open_store(commitlog_segment_bytes=4 * MIB, commitlog_cache_bytes=4 * MIB)


def test_a_flush_round_hands_back_the_pages_behind_the_window(windowed: MessageStore) -> None:
    store = windowed
    fill(store, 14 * MIB)
    store.dispatcher.catch_up()
    store.flusher.run_once()

    end = store.commitlog.write_offset
    released = store.page_cache.released
    # Up to the window, rounded down to whole steps, and not a byte further.
    assert released == (end - 4 * MIB) // STEP_BYTES * STEP_BYTES
    assert store.page_cache.released_bytes == released
    assert resident_in_log(store, 0, released) == 0
    assert resident_in_log(store, end - 4 * MIB, end) >= 4 * MIB - mmap.PAGESIZE


def test_records_in_released_pages_read_back_intact(windowed: MessageStore) -> None:
    store = windowed
    offsets = fill(store, 10 * MIB)
    store.dispatcher.catch_up()
    store.flusher.run_once()
    assert store.page_cache.released > offsets[100]

    record = store.record_at(offsets[100])
    assert record is not None
    assert record.body.startswith(b"0000100")
    result = store.get("T", 0, 100, max_messages=1, max_bytes=MIB)
    assert result.queue_offsets == [100]
    assert bytes(result.records[0]).find(b"0000100") > 0
    result.release()


def test_nothing_the_dispatcher_has_yet_to_read_is_released(windowed: MessageStore) -> None:
    store = windowed
    store.dispatch_service.stop()  # dispatch only when the test says
    fill(store, 14 * MIB)
    store.dispatcher.dispatch(limit_bytes=6 * MIB)
    store.flusher.run_once()
    # Everything is flushed, but only ~6 MiB dispatched: 4 MiB behind that is < one step.
    assert store.page_cache.released == 0

    store.dispatcher.dispatch(limit_bytes=6 * MIB)
    store.flusher.run_once()
    assert store.page_cache.released == 8 * MIB
    assert resident_in_log(store, 8 * MIB, store.dispatcher.dispatched) > 3 * MIB


def test_a_window_of_zero_leaves_the_page_cache_to_the_kernel(open_store: OpenStore) -> None:
    store = open_store(commitlog_segment_bytes=4 * MIB, commitlog_cache_bytes=0)
    fill(store, 10 * MIB)
    store.dispatcher.catch_up()
    store.flusher.run_once()
    assert store.page_cache.released_bytes == 0
    assert resident_in_log(store, 0, store.commitlog.write_offset) > 9 * MIB


def test_a_truncated_log_is_released_again_from_the_cut(windowed: MessageStore) -> None:
    store = windowed
    offsets = fill(store, 14 * MIB)
    store.dispatcher.catch_up()
    store.flusher.run_once()
    assert store.page_cache.released == 8 * MIB

    cut = offsets[len(offsets) // 3]  # about 4.7 MiB in
    store.truncate(cut)
    assert store.page_cache.released == cut // STEP_BYTES * STEP_BYTES


def test_the_window_defaults_to_two_fifths_of_memory_and_refuses_negatives(
    tmp_path: Path,
) -> None:
    assert StoreConfig(data_dir=tmp_path).commitlog_cache_bytes == share_of_memory(0.4)
    with pytest.raises(ValueError, match="commitlog_cache_bytes"):
        StoreConfig(data_dir=tmp_path, commitlog_cache_bytes=-1)
