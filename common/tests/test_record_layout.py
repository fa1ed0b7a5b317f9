"""The record's bytes, pinned: what producers send and brokers store must not drift.

The expected bytes were produced by the encoder before the layout was described by a
field table; any change to the table or the encoder that moves a byte fails here.
"""

from __future__ import annotations

import struct

import pytest

from metaq.common import record

MSG_ID = bytes(range(16))
HOST = bytes([10, 0, 0, 1, 0x90, 0x1F, 0, 0])
STORE_HOST = bytes([192, 168, 1, 2, 0x90, 0x1F, 0, 0])

PLAIN = bytes.fromhex(
    "6f000000" "0100514d" "00000000" "00000000"  # size, magic, CRC (unset), flags
    "ffffffffffffffff" "ffffffffffffffff"  # commitlog and queue offsets (unset)
    "0000000000000000" "0000000000000000"  # store time, store host (unset)
    "03000000" "00000000" "7b68e5cf8b010000"  # queue id, reconsume times, born time
    "000102030405060708090a0b0c0d0e0f" "0000000000000000"  # message id, born host
    "0600" "0000" "0000" "0000" "05000000"  # topic, tags, keys, properties, body lengths
    "6f7264657273" "68656c6c6f"  # topic, body
)  # fmt: skip

FULL = bytes.fromhex(
    "84000000" "0100514d" "00000000" "02000000"
    "ffffffffffffffff" "ffffffffffffffff"
    "0000000000000000" "0000000000000000"
    "07000000" "02000000" "c869e5cf8b010000"
    "000102030405060708090a0b0c0d0e0f" "0a000001901f0000"
    "0600" "0500" "0500" "0c00" "04000000"
    "6f7264657273" "7461672d61" "6b31206b32" "7001760244454c4159013202" "626f6479"
)  # fmt: skip

STAMPED = bytes.fromhex(
    "6f000000" "0100514d" "f0727aeb" "00000000"
    "0010000000000000" "2900000000000000"  # commitlog offset 4096, queue offset 41
    "156be5cf8b010000" "c0a80102901f0000"  # store time, store host
    "03000000" "00000000" "7b68e5cf8b010000"
    "000102030405060708090a0b0c0d0e0f" "0000000000000000"
    "0600" "0000" "0000" "0000" "05000000"
    "6f7264657273" "68656c6c6f"
)  # fmt: skip


def _plain() -> bytearray:
    return record.encode(
        "orders", b"hello", queue_id=3, msg_id=MSG_ID, born_timestamp_ms=1_700_000_000_123
    )


def test_a_plain_record_is_encoded_byte_for_byte_as_before() -> None:
    assert bytes(_plain()) == PLAIN


def test_a_record_with_every_producer_field_is_encoded_byte_for_byte_as_before() -> None:
    raw = record.encode(
        "orders",
        b"body",
        queue_id=7,
        tags="tag-a",
        keys=("k1", "k2"),
        properties={"p": "v", "DELAY": "2"},
        flags=record.FLAG_DELAYED,
        msg_id=MSG_ID,
        born_timestamp_ms=1_700_000_000_456,
        born_host=HOST,
        reconsume_times=2,
    )

    assert bytes(raw) == FULL


def test_a_stamped_and_sealed_record_is_stored_byte_for_byte_as_before() -> None:
    raw = _plain()
    record.STAMP.pack_into(raw, record.STAMP_AT, 4096, 41, 1_700_000_000_789, STORE_HOST)
    record.seal(raw, 0, len(raw))

    assert bytes(raw) == STAMPED


def _distinct_fields() -> bytes:
    """A stored record whose header fields all hold different values, so a view that
    read one field for another would be caught."""
    raw = record.encode(
        "orders",
        b"body",
        queue_id=7,
        tags="tag-abcd",
        keys=("key-1", "key-2"),
        properties={"p": "v", "DELAY": "2"},
        flags=record.FLAG_DELAYED,
        msg_id=MSG_ID,
        born_timestamp_ms=1_700_000_000_456,
        born_host=HOST,
        reconsume_times=3,
    )
    record.STAMP.pack_into(raw, record.STAMP_AT, 4096, 41, 1_700_000_000_789, STORE_HOST)
    record.seal(raw, 0, len(raw))
    return bytes(raw)


SAMPLE = _distinct_fields()
EXPECTED = dict(zip(record.FIELDS, record.HEADER.unpack_from(SAMPLE), strict=True))


def test_the_field_table_describes_the_header_field_by_field() -> None:
    fields = list(record.FIELDS.values())

    assert [f.offset for f in fields] == [0, *(f.end for f in fields[:-1])]
    assert fields[-1].end == record.HEADER_SIZE == 100
    assert {f.name: f.read(SAMPLE) for f in fields} == EXPECTED
    assert len(set(EXPECTED.values())) == len(EXPECTED)


def test_every_header_view_reads_what_the_header_holds() -> None:
    names = list(record.FIELDS)
    views = [record.header_view(name) for name in names]
    views += [record.header_view(*names[start::step]) for start in range(3) for step in (1, 2, 5)]
    views.append(record.header_view("size", "msg_id", "body_len", topic_len=6))

    for view in views:
        names = record.view_fields(view)
        got = dict(zip(names, view.unpack_from(SAMPLE), strict=True))
        want = {name: EXPECTED[name] for name in names if name != "topic"}
        if "topic" in names:
            want["topic"] = b"orders"
        assert got == want, view.format


def test_a_header_view_refuses_fields_out_of_order() -> None:
    with pytest.raises(ValueError, match="out of header order"):
        record.header_view("queue_id", "size")


@pytest.mark.parametrize("format", ["<I8xi", "<4xq", "<II40xq"])
def test_a_struct_that_reads_across_fields_is_no_header_view(format: str) -> None:
    with pytest.raises(ValueError, match="no field"):
        record.view_fields(struct.Struct(format))


def test_the_stamp_and_crc_positions_are_the_tables() -> None:
    stamp = record.STAMP.unpack_from(SAMPLE, record.STAMP_AT)
    stamped = ("commitlog_offset", "queue_offset", "store_timestamp_ms", "store_host")

    assert stamp == tuple(EXPECTED[name] for name in stamped)
    assert record.FIELDS["flags"].offset == record.CRC_START
    assert record.FIELDS["crc"].read(SAMPLE, 0) == EXPECTED["crc"]
    assert record.topic_of(b"xx" + SAMPLE, 2) == "orders"


def test_the_producers_encoder_builds_the_same_bytes() -> None:
    encoder = record.RecordEncoder(compress_over_bytes=4096, max_message_bytes=1 << 20)
    fresh = encoder.encode("orders", b"hello", 3)
    pinned = bytearray(fresh)
    record.FIELDS["msg_id"].packer.pack_into(pinned, record.FIELDS["msg_id"].offset, MSG_ID)
    born = record.FIELDS["born_timestamp_ms"]
    born.packer.pack_into(pinned, born.offset, 1_700_000_000_123)
    assert bytes(pinned) == PLAIN
    ((batch, count, first),) = encoder.encode_batch(
        "orders", [b"hello"], 3, max_records=10, max_bytes=1 << 20
    )
    assert count == 1
    assert record.decode(batch, verify=False).msg_id.hex() == record.msg_id_hex(first)


def test_batch_ids_are_consecutive_and_never_a_single_ids() -> None:
    encoder = record.RecordEncoder()
    singles = {record.new_msg_id() for _ in range(100)}
    batches = encoder.encode_batch("orders", [b"x"] * 5, 0, max_records=10, max_bytes=1 << 20)
    ((raw, _, first),) = batches

    ids = [r.msg_id for r in record.iter_records(raw, verify=False)]

    assert [i.hex() for i in ids] == [record.msg_id_hex(first + n) for n in range(5)]
    assert singles.isdisjoint(ids)
