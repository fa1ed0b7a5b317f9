"""The one-copy append of a SEND's records: the same log as record by record, or refused."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from metaq.broker.store import MessageStore
from metaq.broker.store.commitlog import RecordBatch
from metaq.common.record import FLAG_DELAYED, decode, encode

OpenStore = Callable[..., MessageStore]


def batch_of(store: MessageStore, records: list[bytes], topic: bytes, queue_id: int) -> RecordBatch:
    batch = store.commitlog.check_batch(memoryview(b"".join(records)), topic, queue_id)
    assert batch is not None
    return batch


def log_bytes(store: MessageStore) -> bytes:
    """The whole log with its stamped store timestamps zeroed (they differ run to run)."""
    out = bytearray()
    for _, view in store.commitlog.records(
        store.commitlog.min_offset, store.commitlog.write_offset
    ):
        record = bytearray(view)
        struct.pack_into("<q", record, 32, 0)
        struct.pack_into("<I", record, 8, 0)
        out += record
    return bytes(out)


def test_a_batch_lands_as_record_by_record_appends_would_put_it(
    open_store: OpenStore, tmp_path: Path
) -> None:
    records = [
        encode("t", bytes([n]) * (n * 37 % 900), queue_id=3, keys=[f"k{n}"]) for n in range(50)
    ]
    by_records = open_store(data_dir=tmp_path / "records")
    by_batch = open_store(data_dir=tmp_path / "batch")
    first = encode("t", b"first", queue_id=3)
    by_records.append([first])
    by_batch.append([first])

    expected = by_records.append(records)
    got = by_batch.append(batch_of(by_batch, records, b"t", 3))

    assert got.commitlog_offsets == expected.commitlog_offsets
    assert got.queue_offsets == expected.queue_offsets == list(range(1, 51))
    assert (got.start, got.end) == (expected.start, expected.end)
    assert log_bytes(by_batch) == log_bytes(by_records)
    for offset in got.commitlog_offsets:
        view = by_batch.commitlog.slice(offset, 4)
        assert view is not None
        size = int.from_bytes(view, "little")
        whole = by_batch.commitlog.slice(offset, size)
        assert whole is not None
        decode(bytes(whole))  # verifies the CRC the append wrote
    by_batch.dispatcher.catch_up()
    assert by_batch.queues.get_or_create(b"t", 3).max_offset == 51


def test_a_batch_crossing_a_segment_end_continues_in_the_next_file(
    open_store: OpenStore,
) -> None:
    segment_bytes = 16 * 1024
    store = open_store(
        commitlog_segment_bytes=segment_bytes, max_message_bytes=8192, max_properties_bytes=1024
    )
    store.append([encode("t", b"seed")])
    records = [encode("t", bytes(1000)) for _ in range(40)]  # about 2.5 segments

    appended = store.append(batch_of(store, records, b"t", 0))

    assert appended.queue_offsets == list(range(1, 41))
    for offset, raw in zip(appended.commitlog_offsets, records, strict=True):
        assert offset // segment_bytes == (offset + len(raw) - 1) // segment_bytes
        stored = store.commitlog.slice(offset, len(raw))
        assert stored is not None
        assert decode(bytes(stored)).body == bytes(1000)
    assert appended.end == store.commitlog.write_offset > 2 * segment_bytes
    assert len(store.commitlog.segments.segments) == 3
    store.dispatcher.catch_up()
    assert store.dispatcher.dispatched == store.commitlog.write_offset


def test_what_the_one_pass_check_refuses_goes_record_by_record(open_store: OpenStore) -> None:
    store = open_store(max_message_bytes=1000)
    good = encode("t", b"x")
    check = store.commitlog.check_batch

    # A topic not seen yet is checked by name on the record-by-record path first.
    assert check(memoryview(good), b"t", 0) is None
    store.append([good])
    assert check(memoryview(good), b"t", 0) is not None

    bad_magic = bytearray(good)
    struct.pack_into("<I", bad_magic, 4, 0x12345678)
    assert check(memoryview(b""), b"t", 0) is None
    refused = [
        good[:50],
        good + good[:-1],
        encode("t", b"x", queue_id=1),
        encode("u", b"x"),
        encode("tt", b"x"),
        bytes(bad_magic),
        encode("t", bytes(1001)),
        bytes(200),
    ]
    for payload in refused:
        assert check(memoryview(good + payload), b"t", 0) is None, payload[:20]


def test_a_batch_says_which_flags_its_records_carry(open_store: OpenStore) -> None:
    store = open_store()
    store.append([encode("t", b"x")])
    delayed = encode("t", b"later", properties={"DELAY": "1"}, flags=FLAG_DELAYED)

    now = encode("t", b"now")

    batch = batch_of(store, [now, delayed], b"t", 0)

    assert batch.flags & FLAG_DELAYED
    assert batch.sizes == [len(now), len(delayed)]


@pytest.mark.parametrize("count", [1, 2, 300])
def test_message_ids_come_back_in_order(open_store: OpenStore, count: int) -> None:
    store = open_store()
    store.append([encode("t", b"x")])
    records = [encode("t", b"%d" % n) for n in range(count)]

    batch = batch_of(store, records, b"t", 0)

    assert batch.msg_ids == [decode(r, verify=False).msg_id for r in records]
