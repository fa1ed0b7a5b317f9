"""The record's bytes, pinned: what producers send and brokers store must not drift.

The expected bytes were produced by the encoder before the layout was described by a
field table; any change to the table or the encoder that moves a byte fails here.
"""

from __future__ import annotations

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
