"""The record codec: what producers build, what the broker stamps and seals, what readers decode."""

from __future__ import annotations

import contextlib
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq.common.errors import InvalidMessage, InvalidRecord
from metaq.common.record import (
    BLANK_MAGIC,
    HEADER_SIZE,
    MAGIC,
    MAX_KEYS_BYTES,
    MAX_TAGS_BYTES,
    STAMP,
    STAMP_AT,
    Record,
    crc_ok,
    decode,
    decode_properties,
    decode_run,
    encode,
    encode_properties,
    iter_records,
    new_msg_id,
    seal,
    tag_code,
    topic_of,
)

# --- strategies -------------------------------------------------------------------------

topics = st.from_regex(r"[A-Za-z0-9_|%-]{1,127}", fullmatch=True)
# At most 4 bytes per character, so 63 characters always fit the 255-byte tag limit.
_utf8 = st.characters(codec="utf-8")  # str that can be encoded: no lone surrogates
tags = st.text(_utf8, max_size=63)
keys = st.lists(
    st.text(st.characters(codec="utf-8", exclude_characters=" "), min_size=1, max_size=20),
    max_size=10,
)
_prop_text = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), max_size=12)
properties = st.dictionaries(_prop_text, _prop_text, max_size=6)
bodies = st.binary(max_size=4096)


@st.composite
def messages(draw: st.DrawFn) -> dict[str, object]:
    return {
        "topic": draw(topics),
        "body": draw(bodies),
        "queue_id": draw(st.integers(0, 65_535)),
        "tags": draw(tags),
        "keys": tuple(draw(keys)),
        "properties": draw(properties),
        "flags": draw(st.integers(0, 2**32 - 1)),
        "msg_id": draw(st.binary(min_size=16, max_size=16)),
        "born_timestamp_ms": draw(st.integers(0, 2**63 - 1)),
        "born_host": draw(st.binary(min_size=8, max_size=8)),
        "reconsume_times": draw(st.integers(0, 2**31 - 1)),
    }


@st.composite
def stamps(draw: st.DrawFn) -> tuple[int, int, int, bytes]:
    return (
        draw(st.integers(0, 2**62)),
        draw(st.integers(0, 2**62)),
        draw(st.integers(0, 2**62)),
        draw(st.binary(min_size=8, max_size=8)),
    )


def stamp_and_seal(buf: bytearray, stamp: tuple[int, int, int, bytes]) -> bytearray:
    """Do to a producer-built record what the broker does on append."""
    STAMP.pack_into(buf, STAMP_AT, *stamp)
    seal(buf, 0, len(buf))
    return buf


def sealed(topic: str = "orders", body: bytes = b"hello", **fields: object) -> bytearray:
    return stamp_and_seal(encode(topic, body, **fields), (4096, 7, 1_700_000_000_000, b"H" * 8))  # type: ignore[arg-type]


# --- round trip -------------------------------------------------------------------------


@given(message=messages(), stamp=stamps())
def test_sealed_record_decodes_to_every_field_it_was_built_and_stamped_with(
    message: dict[str, object], stamp: tuple[int, int, int, bytes]
) -> None:
    buf = stamp_and_seal(encode(**message), stamp)  # type: ignore[arg-type]

    record = decode(buf)

    cl_offset, q_offset, store_ms, store_host = stamp
    assert record == Record(
        **message,  # type: ignore[arg-type]
        commitlog_offset=cl_offset,
        queue_offset=q_offset,
        store_timestamp_ms=store_ms,
        store_host=store_host,
        size=len(buf),
    )


@given(batch=st.lists(st.tuples(messages(), stamps()), min_size=1, max_size=5))
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_back_to_back_records_iterate_in_order(
    batch: list[tuple[dict[str, object], tuple[int, int, int, bytes]]],
) -> None:
    run = bytearray()
    for message, stamp in batch:
        run += stamp_and_seal(encode(**message), stamp)  # type: ignore[arg-type]

    decoded = list(iter_records(run))

    assert [(r.topic, r.body, r.keys, r.msg_id) for r in decoded] == [
        (m["topic"], m["body"], m["keys"], m["msg_id"]) for m, _ in batch
    ]
    assert sum(r.size for r in decoded) == len(run)


@given(
    batch=st.lists(st.tuples(messages(), stamps()), min_size=1, max_size=5),
    verify=st.booleans(),
)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_decode_run_gives_exactly_what_iter_records_gives(
    batch: list[tuple[dict[str, object], tuple[int, int, int, bytes]]], verify: bool
) -> None:
    run = bytearray()
    for message, stamp in batch:
        run += stamp_and_seal(encode(**message), stamp)  # type: ignore[arg-type]

    assert decode_run(Record, run, verify=verify) == list(iter_records(run, verify=verify))


@given(
    message=messages(),
    patches=st.lists(st.tuples(st.integers(0, 10_000), st.binary(min_size=1, max_size=8))),
    reseal=st.booleans(),
    verify=st.booleans(),
)
def test_decode_run_refuses_a_mangled_run_as_decode_does(
    message: dict[str, object],
    patches: list[tuple[int, bytes]],
    reseal: bool,
    verify: bool,
) -> None:
    """Same records, or the same InvalidRecord (same words) at the first bad one."""
    good = sealed(**message)  # type: ignore[arg-type]
    buf = bytearray(good)
    for at, raw in patches:
        at %= len(buf)
        buf[at : at + len(raw)] = raw[: len(buf) - at]
    if reseal and len(buf) >= HEADER_SIZE:
        seal(buf, 0, len(buf))
    run = bytes(good) + bytes(buf)
    try:
        expected: list[Record] | str = list(iter_records(run, verify=verify))
    except InvalidRecord as exc:
        expected = str(exc)
    try:
        got: list[Record] | str = decode_run(Record, run, verify=verify)
    except InvalidRecord as exc:
        got = str(exc)
    assert got == expected


@given(message=messages())
def test_decode_at_an_offset_reads_the_record_there(message: dict[str, object]) -> None:
    buf = bytes(b"\xaa" * 37) + sealed(**message)  # type: ignore[arg-type]

    assert decode(buf, 37).msg_id == message["msg_id"]


def test_encode_leaves_broker_fields_unset_and_crc_unsealed() -> None:
    buf = encode("orders", b"x", queue_id=3)
    record = decode(buf, verify=False)

    assert (record.commitlog_offset, record.queue_offset, record.store_timestamp_ms) == (-1, -1, 0)
    assert record.store_host == bytes(8)
    assert struct.unpack_from("<I", buf, 8)[0] == 0
    with pytest.raises(InvalidRecord, match="CRC mismatch"):
        decode(buf)


def test_seal_writes_the_crc_of_the_bytes_after_the_crc_field() -> None:
    buf = sealed()
    crc = struct.unpack_from("<I", buf, 8)[0]

    assert crc == zlib.crc32(bytes(buf[12:]))
    assert crc_ok(buf, 0, len(buf), crc)
    assert not crc_ok(buf, 0, len(buf), crc ^ 1)


def test_message_ids_are_unique_and_sixteen_bytes() -> None:
    ids = {new_msg_id() for _ in range(10_000)}

    assert len(ids) == 10_000
    assert {len(i) for i in ids} == {16}
    assert encode("t", b"").hex() != encode("t", b"").hex()  # each encode draws a new id


@given(properties)
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert decode_properties(encode_properties(props)) == props


def test_tag_code_is_the_crc_of_the_tags_and_zero_for_none() -> None:
    assert tag_code("a") == tag_code(b"a") == zlib.crc32(b"a")
    assert tag_code("a") != tag_code("b")
    assert tag_code("") == tag_code(b"") == 0


# --- damaged bytes ----------------------------------------------------------------------


@given(message=messages(), data=st.data())
def test_every_truncation_of_a_record_is_invalid(
    message: dict[str, object], data: st.DataObject
) -> None:
    buf = sealed(**message)  # type: ignore[arg-type]
    cut = data.draw(st.integers(0, len(buf) - 1))

    with pytest.raises(InvalidRecord):
        decode(buf[:cut])


@given(message=messages(), data=st.data())
def test_every_single_bit_flip_is_detected(message: dict[str, object], data: st.DataObject) -> None:
    buf = sealed(**message)  # type: ignore[arg-type]
    bit = data.draw(st.integers(0, len(buf) * 8 - 1))
    buf[bit // 8] ^= 1 << (bit % 8)

    with pytest.raises(InvalidRecord):
        decode(buf)


@pytest.mark.parametrize("magic", [0, MAGIC + 1, BLANK_MAGIC, 0x4D510002])
def test_wrong_magic_is_invalid_and_says_so(magic: int) -> None:
    buf = sealed()
    struct.pack_into("<I", buf, 4, magic)

    with pytest.raises(InvalidRecord, match="magic"):
        decode(buf, verify=False)


def test_size_disagreeing_with_field_lengths_is_invalid() -> None:
    buf = sealed(body=b"0123456789")
    struct.pack_into("<I", buf, 96, 9)  # body length one short of the bytes present

    with pytest.raises(InvalidRecord, match="disagrees"):
        decode(buf, verify=False)


def test_crc_mismatch_is_invalid_and_says_so() -> None:
    buf = sealed(body=b"payload")
    buf[-1] ^= 0x20  # 'd' -> 'D'

    with pytest.raises(InvalidRecord, match="CRC mismatch"):
        decode(buf)
    assert decode(buf, verify=False).body == b"payloaD"


@given(st.binary(max_size=600))
def test_decoding_random_bytes_raises_invalid_record_or_returns(raw: bytes) -> None:
    with contextlib.suppress(InvalidRecord):
        decode(raw)


@given(
    message=messages(),
    patches=st.lists(st.tuples(st.integers(0, 10_000), st.binary(min_size=1, max_size=8))),
    reseal=st.booleans(),
    verify=st.booleans(),
)
def test_decoding_a_mangled_record_raises_invalid_record_or_returns(
    message: dict[str, object],
    patches: list[tuple[int, bytes]],
    reseal: bool,
    verify: bool,
) -> None:
    """Bytes past the CRC check (resealed, or verify off) never escape as another error."""
    buf = sealed(**message)  # type: ignore[arg-type]
    for at, raw in patches:
        at %= len(buf)
        buf[at : at + len(raw)] = raw[: len(buf) - at]
    if reseal and len(buf) >= HEADER_SIZE:
        seal(buf, 0, len(buf))
    with contextlib.suppress(InvalidRecord):
        decode(buf, verify=verify)


@pytest.mark.parametrize("field", ["topic", "tags", "keys", "properties"])
@pytest.mark.parametrize("verify", [True, False])
def test_text_fields_that_are_not_utf8_are_an_invalid_record(field: str, verify: bool) -> None:
    buf = sealed(topic="t", tags="g", keys=("k",), properties={"p": "v"})
    at = HEADER_SIZE + ["topic", "tags", "keys", "properties"].index(field)
    buf[at] = 0xFF  # never valid in UTF-8
    seal(buf, 0, len(buf))

    with pytest.raises(InvalidRecord, match="UTF-8"):
        decode(buf, verify=verify)


# --- unacceptable messages --------------------------------------------------------------


@pytest.mark.parametrize(
    "topic", ["", "has space", "a/b", "dot.ted", "tópico", "x" * 128, "new\nline", "a#b"]
)
def test_illegal_topic_names_are_refused(topic: str) -> None:
    with pytest.raises(InvalidMessage, match="illegal topic name"):
        encode(topic, b"x")


@pytest.mark.parametrize("topic", ["a", "x" * 127, "Order_Events-2|eu%1", "0"])
def test_legal_topic_names_are_accepted(topic: str) -> None:
    assert decode(sealed(topic=topic)).topic == topic


@pytest.mark.parametrize("bad_keys", [("has space",), ("ok", ""), (" lead",), ("trail ",)])
def test_keys_that_are_empty_or_contain_a_space_are_refused(bad_keys: tuple[str, ...]) -> None:
    with pytest.raises(InvalidMessage, match="empty or contains a space"):
        encode("t", b"x", keys=bad_keys)


def test_keys_over_the_limit_are_refused() -> None:
    assert decode(sealed(keys=("k" * MAX_KEYS_BYTES,))).keys == ("k" * MAX_KEYS_BYTES,)
    # Two keys of 512 plus the separating space: one byte over.
    with pytest.raises(InvalidMessage, match=f"keys are {MAX_KEYS_BYTES + 1} bytes"):
        encode("t", b"x", keys=("k" * 512, "k" * 512))


@pytest.mark.parametrize(
    "props",
    [{"a\x01b": "v"}, {"k": "v\x01"}, {"k\x02": "v"}, {"k": "\x02"}],
    ids=["key-kv", "value-kv", "key-pair", "value-pair"],
)
def test_reserved_characters_in_properties_are_refused(props: dict[str, str]) -> None:
    with pytest.raises(InvalidMessage, match="reserved control character"):
        encode("t", b"x", properties=props)


def test_properties_over_65535_bytes_are_refused() -> None:
    with pytest.raises(InvalidMessage, match="properties are 65538 bytes"):
        encode("t", b"x", properties={"k": "v" * 65_535})


@pytest.mark.parametrize("too_long", ["t" * (MAX_TAGS_BYTES + 1), "é" * 128])
def test_tags_over_255_bytes_are_refused(too_long: str) -> None:
    encode("t", b"x", tags=too_long[: MAX_TAGS_BYTES // len(too_long[0].encode())])
    with pytest.raises(InvalidMessage, match=f"tags are {len(too_long.encode())} bytes"):
        encode("t", b"x", tags=too_long)


def test_message_id_and_born_host_must_have_their_fixed_lengths() -> None:
    with pytest.raises(InvalidMessage, match="16 bytes"):
        encode("t", b"x", msg_id=b"short")
    with pytest.raises(InvalidMessage, match="born_host is 8 bytes"):
        encode("t", b"x", born_host=b"\x7f\x00\x00\x01")


@pytest.mark.parametrize("field", ["tags", "keys", "properties"])
def test_encode_rejects_text_that_is_not_utf8_encodable(field: str) -> None:
    lone_surrogate = "\udc80"
    kwargs: dict[str, object] = {
        "tags": {"tags": lone_surrogate},
        "keys": {"keys": [lone_surrogate]},
        "properties": {"properties": {"k": lone_surrogate}},
    }[field]
    with pytest.raises(InvalidMessage, match="UTF-8"):
        encode("T", b"body", **kwargs)  # type: ignore[arg-type]


def test_topic_of_reads_the_topic_without_decoding_the_record() -> None:
    first = encode("orders", b"x" * 100)
    second = encode("audit-log", b"")
    joined = bytes(first + second)
    assert topic_of(first) == "orders"
    assert topic_of(joined, len(first)) == "audit-log"
    assert topic_of(memoryview(joined)[len(first) :]) == "audit-log"
