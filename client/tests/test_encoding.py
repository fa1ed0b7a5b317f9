"""Producer-side record encoding and compression, and decode_message on the way back."""

from __future__ import annotations

import os
import zlib

import msgspec
import pytest

from metaq.client.message import Message, OutgoingMessage, decode_message, iter_messages
from metaq.common import record
from metaq.common.errors import InvalidMessage, InvalidRecord
from metaq.common.record import RecordEncoder, msg_id_hex, with_queue_id


def _sealed(raw: bytes | bytearray) -> bytearray:
    """As the broker stores it: CRC sealed."""
    out = bytearray(raw)
    record.seal(out, 0, len(out))
    return out


def test_the_fast_encoder_builds_what_record_encode_builds() -> None:
    encoder = RecordEncoder()
    fast = encoder.encode("t", b"body", 3, "tag-a", ("k1", "k2"), {"p": "v"})
    decoded = record.decode(fast, verify=False)
    reference = record.encode(
        "t",
        b"body",
        queue_id=3,
        tags="tag-a",
        keys=("k1", "k2"),
        properties={"p": "v"},
        msg_id=decoded.msg_id,
        born_timestamp_ms=decoded.born_timestamp_ms,
    )

    assert fast == bytes(reference)


def test_bodies_up_to_the_threshold_are_sent_as_they_are() -> None:
    encoder = RecordEncoder(compress_over_bytes=100)
    body = b"a" * 100

    rec = record.decode(encoder.encode("t", body), verify=False)

    assert rec.flags == 0 and rec.body == body


def test_bodies_over_the_threshold_are_compressed_and_flagged() -> None:
    encoder = RecordEncoder(compress_over_bytes=100)
    body = b"a" * 101

    raw = encoder.encode("t", body)
    rec = record.decode(raw, verify=False)

    assert rec.flags & record.FLAG_COMPRESSED
    assert zlib.decompress(rec.body) == body
    assert decode_message(_sealed(raw)).body == body


def test_incompressible_bodies_stay_uncompressed() -> None:
    encoder = RecordEncoder(compress_over_bytes=100)
    body = os.urandom(4096)

    rec = record.decode(encoder.encode("t", body), verify=False)

    assert rec.flags == 0 and rec.body == body


def test_a_body_over_the_limit_is_refused_before_anything_is_sent() -> None:
    encoder = RecordEncoder(compress_over_bytes=4096, max_message_bytes=1000)
    with pytest.raises(InvalidMessage, match="1001 bytes; the producer's limit is 1000"):
        encoder.encode("t", os.urandom(1001))
    # Compressible bodies are judged after compression.
    assert encoder.encode("t", b"z" * 5000)


@pytest.mark.parametrize(
    ("topic", "tags", "keys", "match"),
    [
        ("bad topic", "", (), "illegal topic name"),
        ("t", "x" * 256, (), "tags are 256 bytes"),
        ("t", "", ("has space",), "contains a space"),
        ("t", "", "k1", "sequence of strings"),
    ],
)
def test_bad_fields_are_refused_with_a_clear_message(
    topic: str, tags: str, keys: tuple[str, ...], match: str
) -> None:
    with pytest.raises(InvalidMessage, match=match):
        RecordEncoder().encode(topic, b"x", 0, tags, keys)


def test_decode_message_returns_every_field_and_checks_the_crc() -> None:
    raw = _sealed(RecordEncoder().encode("orders", b"hello", 2, "new", ("o-1",), {"a": "b"}))

    message = decode_message(raw)

    assert (message.topic, message.body, message.tags, message.keys) == (
        "orders",
        b"hello",
        "new",
        ("o-1",),
    )
    assert message.properties == {"a": "b"}
    assert message.queue_id == 2 and len(message.msg_id) == 32
    assert message.born_timestamp_ms > 0
    raw[-1] ^= 0xFF
    with pytest.raises(InvalidRecord, match="CRC"):
        decode_message(raw)


def test_a_compressed_body_that_does_not_inflate_is_refused_naming_the_message() -> None:
    raw = bytearray(record.encode("orders", b"not zlib", flags=record.FLAG_COMPRESSED))
    record.seal(raw, 0, len(raw))
    msg_id = record.decode(raw).msg_id.hex()
    with pytest.raises(InvalidRecord, match=f"message {msg_id} is flagged compressed"):
        decode_message(raw)


def test_every_stored_field_lands_in_its_own_message_field() -> None:
    raw = bytearray(
        record.encode(
            "orders", b"body", queue_id=5, tags="t", keys=("k1", "k2"), properties={"p": "v"},
            born_timestamp_ms=1_700_000_000_000, born_host=bytes([10, 0, 0, 7, 0x39, 0x30, 0, 0]),
            reconsume_times=3,
        )
    )  # fmt: skip
    store_host = bytes([10, 0, 0, 9, 0x8F, 0x2A, 0, 0])
    record.STAMP.pack_into(raw, record.STAMP_AT, 111, 222, 1_700_000_000_333, store_host)
    stored = _sealed(raw)
    expected = record.decode(stored)

    message = decode_message(stored)

    assert message == Message(
        topic="orders", body=b"body", tags="t", keys=("k1", "k2"), properties={"p": "v"},
        msg_id=expected.msg_id.hex(), queue_id=5, queue_offset=222, commitlog_offset=111,
        born_timestamp_ms=1_700_000_000_000, store_timestamp_ms=1_700_000_000_333,
        born_host="10.0.0.7:12345", store_host="10.0.0.9:10895", reconsume_times=3,
        flags=expected.flags, size=len(stored),
    )  # fmt: skip


def test_iter_messages_reads_records_back_to_back() -> None:
    encoder = RecordEncoder(compress_over_bytes=10)
    payload = b"".join(_sealed(encoder.encode("t", b"m%d" % n * 20)) for n in range(3))

    assert [m.body for m in iter_messages(payload)] == [b"m%d" % n * 20 for n in range(3)]


def test_a_record_can_be_re_aimed_at_another_queue() -> None:
    raw = RecordEncoder().encode("t", b"x", 1)

    assert record.decode(with_queue_id(raw, 7), verify=False).queue_id == 7
    assert record.decode(raw, verify=False).queue_id == 1


def test_a_batch_is_encoded_into_buffers_within_the_batch_limits() -> None:
    encoder = RecordEncoder(compress_over_bytes=100)
    messages = [b"m%d" % n for n in range(10)] + [OutgoingMessage(b"x" * 500, tags="t")]

    batches = encoder.encode_batch("t", messages, 3, max_records=4, max_bytes=1 << 20)

    assert [count for _, count, _ in batches] == [4, 4, 3]
    records = [r for buf, _, _ in batches for r in record.iter_records(buf, verify=False)]
    assert [r.body for r in records[:10]] == [b"m%d" % n for n in range(10)]
    assert records[10].tags == "t" and records[10].flags & record.FLAG_COMPRESSED
    assert {r.queue_id for r in records} == {3}
    assert len({r.msg_id for r in records}) == 11


def test_a_batch_also_splits_on_bytes() -> None:
    batches = RecordEncoder().encode_batch(
        "t", [bytes(100)] * 10, 0, max_records=100, max_bytes=400
    )

    assert all(len(buf) <= 400 for buf, _, _ in batches)
    assert sum(count for _, count, _ in batches) == 10


def test_every_record_of_a_buffer_can_be_re_aimed_at_another_queue() -> None:
    ((buf, _, first),) = RecordEncoder().encode_batch(
        "t", [b"a", b"b", b"c"], 1, max_records=9, max_bytes=1 << 20
    )

    moved = with_queue_id(buf, 5)

    records = list(record.iter_records(moved, verify=False))
    assert [r.queue_id for r in records] == [5, 5, 5]
    # A batch's ids are consecutive and named by the first one's number.
    assert [r.msg_id.hex() for r in records] == [msg_id_hex(first + n) for n in range(3)]


def test_a_decoded_message_is_as_frozen_as_one_built_by_hand() -> None:
    message = decode_message(_sealed(RecordEncoder().encode("orders", b"hello", 1, "", (), {})))

    with pytest.raises(AttributeError, match="immutable"):
        message.body = b"changed"  # type: ignore[misc]
    changed = msgspec.structs.replace(message, body=b"other")
    assert (changed.topic, changed.body, message.body) == ("orders", b"other", b"hello")
    assert repr(message).startswith("Message(topic='orders', body=b'hello'")
