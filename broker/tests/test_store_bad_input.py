"""Unacceptable records are refused with a clear error and leave no trace in the store."""

from __future__ import annotations

import errno
import struct
from collections.abc import Callable
from typing import NoReturn

import pytest

from metaq.broker.store import MessageStore
from metaq.common.errors import InvalidMessage, StoreUnavailable
from metaq.common.record import HEADER_SIZE, encode

OpenStore = Callable[..., MessageStore]


def with_topic(record: bytearray, topic: bytes) -> bytearray:
    """Replace a record's topic bytes, fixing up its size and topic length."""
    old_len = struct.unpack_from("<H", record, 88)[0]
    out = record[:HEADER_SIZE] + topic + record[HEADER_SIZE + old_len :]
    struct.pack_into("<I", out, 0, len(out))
    struct.pack_into("<H", out, 88, len(topic))
    return out


def with_queue_id(record: bytearray, queue_id: int) -> bytearray:
    struct.pack_into("<i", record, 48, queue_id)
    return record


class Snapshot:
    """What an append that was refused must not have changed."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.write_offset = store.commitlog.write_offset
        self.queue_offsets = dict(store.commitlog.queue_offsets)
        segment = store.commitlog.segments.find(self.write_offset)
        assert segment is not None
        self.tail = bytes(segment.view[self.write_offset - segment.start :][:4096])

    def assert_unchanged(self) -> None:
        store = self.store
        assert store.commitlog.write_offset == self.write_offset
        assert store.commitlog.queue_offsets == self.queue_offsets
        segment = store.commitlog.segments.find(self.write_offset)
        assert segment is not None
        assert bytes(segment.view[self.write_offset - segment.start :][:4096]) == self.tail
        store.dispatcher.catch_up()
        assert store.dispatcher.dispatched == self.write_offset


@pytest.fixture
def store(open_store: OpenStore) -> MessageStore:
    store = open_store()
    store.append([encode("orders", b"before", queue_id=q) for q in (0, 1)])
    store.dispatcher.catch_up()
    return store


def _then_a_good_append_continues_the_queues(store: MessageStore) -> None:
    appended = store.append([encode("orders", b"after", queue_id=q) for q in (0, 1)])
    assert appended.queue_offsets == [1, 1]


def test_body_over_max_message_bytes_is_refused(store: MessageStore) -> None:
    limit = store.config.max_message_bytes
    snapshot = Snapshot(store)

    with pytest.raises(InvalidMessage, match=f"body is {limit + 1} bytes; the limit is {limit}"):
        store.put("orders", bytes(limit + 1))

    snapshot.assert_unchanged()
    store.put("orders", bytes(limit), queue_id=7)  # exactly the limit is fine
    _then_a_good_append_continues_the_queues(store)


def test_properties_over_max_properties_bytes_are_refused(store: MessageStore) -> None:
    limit = store.config.max_properties_bytes
    snapshot = Snapshot(store)

    with pytest.raises(InvalidMessage, match=f"properties are .* the limit is {limit}"):
        store.put("orders", b"x", properties={"big": "v" * limit})

    snapshot.assert_unchanged()
    _then_a_good_append_continues_the_queues(store)


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        (b"", "illegal topic name ''"),
        (b"has space", "illegal topic name 'has space'"),
        (b"slash/ed", "illegal topic name 'slash/ed'"),
        (b"\xff\xfe", "topic name is not UTF-8"),
    ],
)
def test_empty_or_illegal_topic_is_refused(
    store: MessageStore, topic: bytes, expected: str
) -> None:
    snapshot = Snapshot(store)

    with pytest.raises(InvalidMessage, match=expected):
        store.append([with_topic(encode("orders", b"x"), topic)])

    snapshot.assert_unchanged()
    assert set(store.queues.queues) == {(b"orders", 0), (b"orders", 1)}


@pytest.mark.parametrize("queue_id", [-1, -(2**31), 65_536, 70_000, 2**31 - 1])
def test_queue_id_outside_0_to_65535_is_refused(store: MessageStore, queue_id: int) -> None:
    snapshot = Snapshot(store)

    with pytest.raises(InvalidMessage, match=f"queue id {queue_id} is outside 0..65535"):
        store.append([with_queue_id(encode("orders", b"x"), queue_id)])

    snapshot.assert_unchanged()
    store.put("orders", b"x", queue_id=65_535)  # the highest legal id


def test_put_with_an_out_of_range_queue_id_is_refused(store: MessageStore) -> None:
    snapshot = Snapshot(store)

    with pytest.raises(InvalidMessage, match="queue id 65536"):
        store.put("orders", b"x", queue_id=65_536)

    snapshot.assert_unchanged()


@pytest.mark.parametrize(
    ("mangle", "expected"),
    [
        (lambda r: r[: HEADER_SIZE - 1], "shorter than the 100-byte header"),
        (lambda r: r[:-1], "record size .* disagrees with its .* bytes"),
        (lambda r: r + b"extra", "disagrees"),
        (lambda r: r[:4] + struct.pack("<I", 0x4D510002) + r[8:], "is not format 1"),
    ],
    ids=["short", "truncated", "trailing-bytes", "future-format"],
)
def test_malformed_records_are_refused(
    store: MessageStore, mangle: Callable[[bytearray], bytearray], expected: str
) -> None:
    snapshot = Snapshot(store)

    with pytest.raises(InvalidMessage, match=expected):
        store.append([mangle(encode("orders", b"payload"))])

    snapshot.assert_unchanged()


@pytest.mark.parametrize("bad_at", [0, 2, 4])
def test_a_batch_with_one_bad_record_writes_nothing_at_all(
    store: MessageStore, bad_at: int
) -> None:
    limit = store.config.max_message_bytes
    batch = [encode("orders", f"good {n}".encode(), queue_id=n % 2) for n in range(5)]
    batch[bad_at] = encode("orders", bytes(limit + 1), queue_id=0)
    snapshot = Snapshot(store)

    with pytest.raises(InvalidMessage, match=f"body is {limit + 1} bytes"):
        store.append(batch)

    snapshot.assert_unchanged()
    assert store.max_offset("orders", 0) == store.max_offset("orders", 1) == 1
    _then_a_good_append_continues_the_queues(store)


def test_a_batch_spanning_a_segment_with_a_bad_last_record_writes_nothing(
    open_store: OpenStore,
) -> None:
    store = open_store(
        commitlog_segment_bytes=16 * 1024, max_message_bytes=4096, max_properties_bytes=1024
    )
    store.append([encode("t", bytes(3000)) for _ in range(4)])
    snapshot = Snapshot(store)

    with pytest.raises(InvalidMessage, match="queue id -5"):
        store.append(
            [encode("t", bytes(3000)) for _ in range(4)] + [with_queue_id(encode("t", b"x"), -5)]
        )

    snapshot.assert_unchanged()
    # The first segment was not sealed with a blank, so a small record still goes there.
    assert store.append([encode("t", bytes(100))]).start == snapshot.write_offset


def test_append_to_a_closed_store_is_refused_as_retriable(open_store: OpenStore) -> None:
    store = open_store()
    store.close()

    with pytest.raises(StoreUnavailable, match="not open") as info:
        store.put("orders", b"x")
    assert info.value.retriable


def test_a_batch_that_cannot_get_a_new_segment_is_refused_whole_and_takes_no_offsets(
    open_store: Callable[..., MessageStore],
) -> None:
    store = open_store(commitlog_segment_bytes=64 * 1024, max_message_bytes=8 * 1024)
    body = b"x" * 6000

    def room() -> int:
        return 64 * 1024 - store.commitlog.write_offset % (64 * 1024)

    while room() > 10_000:
        store.append([encode("T", body, queue_id=1)])
    # Leave exactly 3,000 bytes: the batch's small first record fits, its second does not.
    store.append([encode("T", b"f" * (room() - 3000 - HEADER_SIZE - 1), queue_id=3)])
    assert room() == 3000
    end_before = store.commitlog.write_offset
    offsets_before = dict(store.commitlog.queue_offsets)
    segments = store.commitlog.segments

    def no_space(start: int, prefault: bool) -> NoReturn:
        raise OSError(errno.ENOSPC, "No space left on device")

    real_open, segments._open = segments._open, no_space  # type: ignore[method-assign]
    segments._next = None  # no file prepared in the background either
    with pytest.raises(StoreUnavailable, match="No space left"):
        store.append([encode("T", b"small", queue_id=1), encode("T", body, queue_id=2)])

    assert store.commitlog.write_offset == end_before
    assert store.commitlog.queue_offsets == offsets_before
    segments._open = real_open  # type: ignore[method-assign]
    appended = store.append([encode("T", body, queue_id=1)])
    assert appended.queue_offsets == [offsets_before[(b"T", 1)]]
