"""Pulled record bytes to Arrow columns: the same rows the client's decoder makes."""

from __future__ import annotations

import zlib

import pytest

from metaq.client.message import iter_messages
from metaq.common import record
from metaq.common.errors import InvalidRecord
from metaq.spark.arrow_records import to_arrow


def stored(topic: str, body: bytes, offset: int, **fields: object) -> bytearray:
    """A record as a broker stores it: stamped and sealed."""
    rec = record.encode(topic, body, queue_id=3, born_timestamp_ms=1_700_000_000_000 + offset,
                        **fields)  # type: ignore[arg-type]  # fmt: skip
    record.STAMP.pack_into(rec, record.STAMP_AT, 4096 * offset, offset, 1_700_000_000_500, bytes(8))
    record.seal(rec, 0, len(rec))
    return rec


def payload_of(records: list[bytearray]) -> memoryview:
    return memoryview(b"".join(records))


def test_columns_equal_the_decoded_messages() -> None:
    records = [
        stored("orders", b"", 0),
        stored("orders", b"short", 1, tags="red", keys=("k1", "k2")),
        stored("orders", b"x" * 12, 2, properties={"a": "1", "b": "two"}),
        stored("orders", b"y" * 13, 3, tags="blue"),
        stored("orders", zlib.compress(b"z" * 3000), 4, flags=record.FLAG_COMPRESSED),
        stored("orders", bytes(range(256)) * 5, 5, tags="red", keys=("only",)),
    ]
    payload = payload_of(records)
    batch = to_arrow("broker-a", "orders", [payload])
    rows = batch.to_pylist()
    messages = list(iter_messages(payload))
    assert len(rows) == len(messages) == 6
    for row, m in zip(rows, messages, strict=True):
        assert row["topic"] == m.topic
        assert row["broker"] == "broker-a"
        assert row["queue"] == m.queue_id == 3
        assert row["offset"] == m.queue_offset
        assert row["msg_id"] == m.msg_id
        assert row["keys"] == list(m.keys)
        assert row["tags"] == m.tags
        assert dict(row["properties"]) == dict(m.properties)
        assert row["body"] == m.body
        assert int(row["born_timestamp"].timestamp() * 1000) == m.born_timestamp_ms
        assert int(row["store_timestamp"].timestamp() * 1000) == m.store_timestamp_ms


def test_several_pulls_make_the_rows_of_their_records_in_order() -> None:
    records = [
        stored("orders", b"a" * 2000, 0, tags="red", keys=("k1",)),
        stored("orders", b"b", 1, properties={"p": "1"}),
        stored("orders", zlib.compress(b"c" * 3000), 2, flags=record.FLAG_COMPRESSED),
        stored("orders", b"d" * 13, 3, tags="a-tag-longer-than-twelve"),
        stored("orders", b"", 4),
    ]
    pulls = [payload_of(records[:2]), payload_of(records[2:3]), payload_of(records[3:])]
    joined = to_arrow("broker-a", "orders", [payload_of(records)])
    assert to_arrow("broker-a", "orders", pulls).to_pylist() == joined.to_pylist()
    assert joined.column("offset").to_pylist() == [0, 1, 2, 3, 4]
    assert joined.column("body").to_pylist()[2] == b"c" * 3000


def test_rows_of_other_tags_and_past_the_end_offset_are_dropped() -> None:
    tags = ["red", "blue", "red", "", "red"]
    payload = payload_of([stored("t", b"m%d" % i, i, tags=t) for i, t in enumerate(tags)])
    batch = to_arrow("b", "t", [payload], tags=frozenset({"red"}), end_offset=4)
    assert batch.column("offset").to_pylist() == [0, 2]
    assert batch.column("body").to_pylist() == [b"m0", b"m2"]


def test_a_damaged_record_is_refused() -> None:
    good = stored("t", b"hello", 0)
    bad = bytearray(good)
    bad[-1] ^= 0xFF
    with pytest.raises(InvalidRecord, match="CRC"):
        to_arrow("b", "t", [payload_of([good, bad])])
    with pytest.raises(InvalidRecord, match="header"):
        to_arrow("b", "t", [memoryview(bytes(good) + bytes(good)[:50])])
    with pytest.raises(InvalidRecord, match="another topic"):
        to_arrow("b", "u", [payload_of([good])])
    garbled = stored("t", b"not zlib", 0, flags=record.FLAG_COMPRESSED)
    with pytest.raises(InvalidRecord, match="flagged compressed but does not inflate"):
        to_arrow("b", "t", [payload_of([garbled])])
    with pytest.raises(InvalidRecord, match="another topic"):  # a name longer than the record
        to_arrow("b", "a-much-longer-topic-name", [payload_of([stored("t", b"", 0)])])


def test_an_empty_payload_is_an_empty_batch() -> None:
    assert to_arrow("b", "t", [memoryview(b"")]).num_rows == 0
    assert to_arrow("b", "t", []).num_rows == 0


def test_only_the_columns_asked_for_are_built_in_their_order() -> None:
    records = [
        stored("t", b"a", 0, tags="red", keys=("k",), properties={"p": "1"}),
        stored("t", b"b", 1, tags="blue"),
    ]
    batch = to_arrow("b", "t", [payload_of(records)], columns=("offset", "body"))
    assert batch.schema.names == ["offset", "body"]
    assert batch.to_pylist() == [{"offset": 0, "body": b"a"}, {"offset": 1, "body": b"b"}]


def test_a_body_only_read_decodes_neither_keys_nor_properties() -> None:
    # Keys and properties that are not UTF-8 fail a read that asks for them, and only that.
    rec = stored("t", b"body", 0, keys=("k",), properties={"p": "1"})
    at = rec.index(b"k", record.HEADER_SIZE + 1)
    rec[at] = 0xFF
    record.seal(rec, 0, len(rec))
    with pytest.raises(InvalidRecord, match="keys are not UTF-8"):
        to_arrow("b", "t", [payload_of([rec])])
    assert to_arrow("b", "t", [payload_of([rec])], columns=("body",)).to_pylist() == [
        {"body": b"body"}
    ]


def test_rows_outside_the_store_time_bounds_are_dropped() -> None:
    records = [stored("t", b"m%d" % i, i) for i in range(3)]
    for i, rec in enumerate(records):
        record.STAMP.pack_into(rec, record.STAMP_AT, 4096 * i, i, 1_000 + i, bytes(8))
        record.seal(rec, 0, len(rec))
    batch = to_arrow("b", "t", [payload_of(records)], from_ms=1_001, until_ms=1_002)
    assert batch.column("offset").to_pylist() == [1]
