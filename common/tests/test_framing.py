"""The data-plane frame codec: round trips, arbitrary chunking, bad and hostile input."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq.common.errors import ErrorCode, ProtocolError
from metaq.common.framing import (
    FLAG_ERROR,
    FLAG_ONE_WAY,
    FLAG_RESPONSE,
    FLAG_SIGNED,
    MAX_FRAME_BYTES,
    MIN_LENGTH,
    PREFIX,
    PREFIX_SIZE,
    PROTOCOL_VERSION,
    Frame,
    FrameDecoder,
    FrameReceiver,
    FrameType,
    encode_error,
    encode_frame,
)
from metaq.common.v1.data_pb2 import ErrorResponse, PullRequest, SendRequest

# --- helpers and strategies -------------------------------------------------------------

Spec = tuple[FrameType, int, int, bytes, bytes]
"""What a frame should decode to: type, flags, request id, header, payload."""

OPERATION_FLAGS = (0, FLAG_ONE_WAY, FLAG_RESPONSE, FLAG_RESPONSE | FLAG_ERROR)


@st.composite
def specs(draw: st.DrawFn, max_payload: int = 2048) -> Spec:
    frame_type = draw(st.sampled_from(list(FrameType)))
    if frame_type is FrameType.CONNECTION:
        flags = FLAG_RESPONSE | FLAG_ERROR
    else:
        flags = draw(st.sampled_from(OPERATION_FLAGS))
    return (
        frame_type,
        flags,
        draw(st.integers(0, 2**32 - 1)),
        draw(st.binary(max_size=300)),
        draw(st.binary(max_size=max_payload)),
    )


def wire(spec: Spec) -> bytes:
    frame_type, flags, request_id, header, payload = spec
    return b"".join(encode_frame(frame_type, request_id, header, payload, flags))


def as_spec(frame: Frame) -> Spec:
    return (frame.type, frame.flags, frame.request_id, bytes(frame.header), bytes(frame.payload))


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given positions (taken modulo its length, in any order)."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def decode(chunks: list[bytes], decoder: FrameDecoder | None = None) -> list[Spec]:
    decoder = decoder or FrameDecoder()
    out: list[Spec] = []
    for chunk in chunks:
        out.extend(as_spec(f) for f in decoder.feed(chunk))
    return out


def decode_until_error(
    chunks: list[bytes], max_frame_bytes: int = MAX_FRAME_BYTES
) -> tuple[list[Spec], ErrorCode | None]:
    """Frames delivered before the stream broke, and how it broke (None if it did not)."""
    decoder = FrameDecoder(max_frame_bytes)
    out: list[Spec] = []
    for chunk in chunks:
        try:
            out.extend(as_spec(f) for f in decoder.feed(chunk))
        except ProtocolError as exc:
            return out, exc.code
    return out, None


def prefix(
    length: int = MIN_LENGTH,
    version: int = PROTOCOL_VERSION,
    frame_type: int = FrameType.SEND,
    flags: int = 0,
    request_id: int = 1,
    header_length: int = 0,
) -> bytes:
    return PREFIX.pack(length, version, frame_type, flags, request_id, header_length)


def protocol_error(data: bytes, max_frame_bytes: int = MAX_FRAME_BYTES) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        FrameDecoder(max_frame_bytes).feed(data)
    return caught.value


# --- round trips ------------------------------------------------------------------------


def test_prefix_is_sixteen_bytes_and_a_bare_frame_is_just_the_prefix() -> None:
    assert PREFIX_SIZE == 16
    (frame,) = encode_frame(FrameType.HEARTBEAT, 9)
    assert frame == struct.pack("<IBBHII", 12, 1, 1, 0, 9, 0)


@pytest.mark.parametrize("frame_type", list(FrameType))
def test_every_frame_type_round_trips(frame_type: FrameType) -> None:
    flags = FLAG_RESPONSE | FLAG_ERROR if frame_type is FrameType.CONNECTION else 0
    spec: Spec = (frame_type, flags, 77, b"head", b"pay" * 100)

    assert decode([wire(spec)]) == [spec]


@given(spec=specs())
def test_any_frame_round_trips(spec: Spec) -> None:
    assert decode([wire(spec)]) == [spec]


@given(
    header=st.binary(max_size=64),
    parts=st.lists(st.binary(max_size=500), max_size=6),
    views=st.booleans(),
)
def test_payload_given_as_several_buffers_arrives_as_their_concatenation(
    header: bytes, parts: list[bytes], views: bool
) -> None:
    payload = [memoryview(p) for p in parts] if views else parts

    buffers = encode_frame(FrameType.PULL, 5, header, payload, FLAG_RESPONSE)

    assert decode([b"".join(buffers)]) == [
        (FrameType.PULL, FLAG_RESPONSE, 5, header, b"".join(parts))
    ]


def test_a_payload_view_of_wide_items_counts_its_bytes_not_its_items() -> None:
    raw = bytes(range(12))
    wide = memoryview(raw).cast("I")  # 3 items of 4 bytes

    for payload in (wide, [wide], [b"ab", wide]):
        buffers = encode_frame(FrameType.PULL, 7, b"h", payload, FLAG_RESPONSE)
        expected = raw if payload is wide or len(payload) == 1 else b"ab" + raw
        assert decode([b"".join(buffers)]) == [(FrameType.PULL, FLAG_RESPONSE, 7, b"h", expected)]


def test_encoding_passes_payload_buffers_through_without_copying() -> None:
    payload = memoryview(bytearray(b"x" * 4096))[100:2000]
    other = bytearray(b"y" * 10)

    buffers = encode_frame(FrameType.SEND, 1, b"h", [payload, b"", other])

    assert buffers[1] is payload
    assert buffers[2] is other
    assert len(buffers) == 3  # the empty part is left out


def test_frames_decoded_from_one_chunk_are_views_of_that_chunk() -> None:
    chunk = wire((FrameType.SEND, 0, 1, b"h", b"p" * 100)) * 3

    frames = FrameDecoder().feed(chunk)

    assert len(frames) == 3
    for frame in frames:
        assert isinstance(frame.payload, memoryview)
        assert frame.payload.obj is chunk


def test_a_chunk_that_may_change_later_is_copied_first() -> None:
    chunk = bytearray(wire((FrameType.SEND, 0, 1, b"h", b"payload")))

    (frame,) = FrameDecoder().feed(chunk)  # type: ignore[arg-type]
    chunk[:] = bytes(len(chunk))

    assert bytes(frame.payload) == b"payload"


def test_frame_flags_read_as_properties() -> None:
    decoder = FrameDecoder()
    request, one_way, response, error = (
        decoder.feed(wire((FrameType.SEND, flags, 1, b"", b"")))[0] for flags in OPERATION_FLAGS
    )
    assert not request.is_response and not request.is_one_way and not request.is_error
    assert one_way.is_one_way and not one_way.is_response
    assert response.is_response and not response.is_error
    assert error.is_response and error.is_error


# --- chunking ---------------------------------------------------------------------------


@given(
    stream=st.lists(specs(max_payload=600), max_size=25),
    cuts=st.lists(st.integers(min_value=0), max_size=40),
)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_any_split_of_a_stream_gives_the_same_frames(stream: list[Spec], cuts: list[int]) -> None:
    data = b"".join(wire(s) for s in stream)
    decoder = FrameDecoder()

    assert decode(split(data, cuts), decoder) == stream
    assert decoder.buffered == 0


def test_a_stream_fed_one_byte_at_a_time_gives_the_same_frames() -> None:
    stream: list[Spec] = [
        (FrameType.SEND, 0, i, bytes([i]) * i, bytes([i]) * (3 * i)) for i in range(40)
    ]
    data = b"".join(wire(s) for s in stream)

    assert decode([data[i : i + 1] for i in range(len(data))]) == stream


def test_a_large_frame_arriving_in_many_small_chunks_is_gathered_once() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    data = wire((FrameType.PULL, FLAG_RESPONSE, 3, b"header", payload)) + wire(
        (FrameType.HEARTBEAT, 0, 4, b"", b"")
    )
    decoder = FrameDecoder()
    frames: list[Frame] = []

    for at in range(0, len(data), 1000):
        frames += decoder.feed(data[at : at + 1000])
        if not frames:
            assert decoder.buffered == min(at + 1000, len(data))
            # Known from the first chunk on: the whole frame's size, not what came so far.
            assert decoder.pending_frame_bytes == len(data) - len(
                wire((FrameType.HEARTBEAT, 0, 4, b"", b""))
            )

    assert [as_spec(f) for f in frames] == [
        (FrameType.PULL, FLAG_RESPONSE, 3, b"header", payload),
        (FrameType.HEARTBEAT, 0, 4, b"", b""),
    ]
    assert decoder.buffered == 0
    assert decoder.pending_frame_bytes == 0


def test_empty_chunks_change_nothing() -> None:
    data = wire((FrameType.SEND, 0, 1, b"abc", b"defg"))
    decoder = FrameDecoder()

    assert decoder.feed(b"") == []
    assert decoder.feed(data[:7]) == []
    assert decoder.feed(b"") == []
    assert decoder.feed(data[7:20]) == []
    assert decoder.feed(b"") == []
    assert [as_spec(f) for f in decoder.feed(data[20:])] == [
        (FrameType.SEND, 0, 1, b"abc", b"defg")
    ]


# --- hostile and broken input -------------------------------------------------------------


def assert_same_outcome_for_any_split(
    data: bytes, cuts: list[int], max_frame_bytes: int = MAX_FRAME_BYTES
) -> None:
    """Fed in chunks or byte by byte, a stream breaks (or not) the same way.

    Byte by byte every frame before the break is delivered; in chunks, the frames cut in
    the same call as the error are dropped, so only a prefix of them may arrive.
    """
    one_by_one, error = decode_until_error(
        [data[i : i + 1] for i in range(len(data))], max_frame_bytes
    )

    chunked, chunked_error = decode_until_error(split(data, cuts), max_frame_bytes)

    assert chunked_error == error
    assert chunked == one_by_one[: len(chunked)]
    if error is None:
        assert chunked == one_by_one
    for frame_type, flags, _, header, payload in chunked:
        assert isinstance(frame_type, FrameType)
        assert flags in OPERATION_FLAGS
        assert PREFIX_SIZE + len(header) + len(payload) <= max_frame_bytes


@given(data=st.binary(max_size=3000), cuts=st.lists(st.integers(min_value=0), max_size=20))
def test_random_bytes_give_frames_or_a_protocol_error_the_same_for_any_split(
    data: bytes, cuts: list[int]
) -> None:
    assert_same_outcome_for_any_split(data, cuts)


@st.composite
def corrupted_streams(draw: st.DrawFn) -> tuple[list[Spec], bytes]:
    stream = draw(st.lists(specs(max_payload=300), min_size=1, max_size=8))
    data = bytearray(b"".join(wire(s) for s in stream))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return stream, bytes(data)


@given(case=corrupted_streams(), cuts=st.lists(st.integers(min_value=0), max_size=10))
def test_corrupted_or_truncated_streams_give_frames_or_a_protocol_error(
    case: tuple[list[Spec], bytes], cuts: list[int]
) -> None:
    _, data = case
    # A small limit, so that corrupted lengths trip it too.
    assert_same_outcome_for_any_split(data, cuts, max_frame_bytes=1024)


@given(stream=st.lists(specs(max_payload=300), min_size=1, max_size=8), data=st.data())
def test_a_truncated_stream_gives_the_whole_frames_and_holds_the_rest(
    stream: list[Spec], data: st.DataObject
) -> None:
    whole = b"".join(wire(s) for s in stream)
    cut = data.draw(st.integers(0, len(whole)))
    decoder = FrameDecoder()

    frames = decode([whole[:cut]], decoder)

    assert frames == stream[: len(frames)]
    assert decoder.buffered == cut - sum(len(wire(s)) for s in frames)


# --- each framing error -----------------------------------------------------------------


def test_a_newer_version_is_refused_and_the_message_says_to_upgrade_this_side() -> None:
    error = protocol_error(prefix(version=2))

    assert error.code is ErrorCode.UNSUPPORTED_VERSION
    assert "version 2" in str(error)
    assert "speaks version 1" in str(error)
    assert "this side is the older one: upgrade it" in str(error)


def test_version_zero_is_refused_as_not_metaq_at_all() -> None:
    error = protocol_error(prefix(version=0))

    assert error.code is ErrorCode.UNSUPPORTED_VERSION
    assert "is the peer a metaq client or broker" in str(error)


def test_another_protocol_is_refused_by_its_version_byte() -> None:
    error = protocol_error(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")

    assert error.code is ErrorCode.UNSUPPORTED_VERSION
    assert "version 47" in str(error)  # the "/" of "GET /"
    assert "wrong port" in str(error)


def test_a_wrong_version_is_refused_as_soon_as_its_byte_arrives() -> None:
    decoder = FrameDecoder()

    assert decoder.feed(prefix(version=3)[:4]) == []
    with pytest.raises(ProtocolError) as caught:
        decoder.feed(prefix(version=3)[4:5])
    assert caught.value.code is ErrorCode.UNSUPPORTED_VERSION


def test_a_frame_over_the_limit_is_refused_from_its_length_alone() -> None:
    error = protocol_error(prefix(length=4096 - 4 + 1), max_frame_bytes=4096)

    assert error.code is ErrorCode.FRAME_TOO_LARGE
    assert "frame of 4097 bytes" in str(error)
    assert "limit of 4096 bytes" in str(error)


def test_a_frame_exactly_at_the_limit_is_accepted() -> None:
    spec: Spec = (FrameType.SEND, 0, 1, b"h", bytes(4096 - PREFIX_SIZE - 1))
    assert len(wire(spec)) == 4096

    assert decode([wire(spec)], FrameDecoder(4096)) == [spec]


def test_the_default_limit_is_64_mib() -> None:
    assert MAX_FRAME_BYTES == 64 * 1024 * 1024
    assert FrameDecoder().max_frame_bytes == MAX_FRAME_BYTES

    error = protocol_error(prefix(length=MAX_FRAME_BYTES - 3))
    assert error.code is ErrorCode.FRAME_TOO_LARGE


def test_a_length_too_short_for_the_fixed_fields_is_malformed() -> None:
    error = protocol_error(prefix(length=11))

    assert error.code is ErrorCode.MALFORMED_FRAME
    assert "length field is 11" in str(error)


def test_a_header_longer_than_the_frame_is_malformed() -> None:
    error = protocol_error(prefix(length=MIN_LENGTH + 10, header_length=11) + bytes(10))

    assert error.code is ErrorCode.MALFORMED_FRAME
    assert "header length 11" in str(error)
    assert "frame of 26 bytes" in str(error)


def test_a_header_filling_the_whole_frame_is_fine() -> None:
    data = prefix(length=MIN_LENGTH + 10, header_length=10) + b"0123456789"

    assert decode([data]) == [(FrameType.SEND, 0, 1, b"0123456789", b"")]


@pytest.mark.parametrize("type_code", [12, 18, 200, 255])
def test_an_unknown_frame_type_is_refused_and_the_known_ones_listed(type_code: int) -> None:
    error = protocol_error(prefix(frame_type=type_code))

    assert error.code is ErrorCode.UNKNOWN_FRAME_TYPE
    assert f"unknown frame type {type_code}" in str(error)
    assert "2 (SEND)" in str(error)


@pytest.mark.parametrize(
    ("frame_type", "flags"),
    [
        (FrameType.SEND, FLAG_ERROR),  # an error that is not a response
        (FrameType.SEND, FLAG_RESPONSE | FLAG_ONE_WAY),
        (FrameType.PULL, 0x10),  # a reserved bit
        (FrameType.PULL, FLAG_SIGNED | FLAG_RESPONSE),  # answers are not signed
        (FrameType.HEARTBEAT, 0x8000),
        (FrameType.CONNECTION, 0),  # the connection only ever gets errors
        (FrameType.CONNECTION, FLAG_RESPONSE),
    ],
)
def test_illegal_flags_are_malformed(frame_type: FrameType, flags: int) -> None:
    error = protocol_error(prefix(frame_type=frame_type, flags=flags))

    assert error.code is ErrorCode.MALFORMED_FRAME
    assert f"flags {flags:#06x}" in str(error)
    assert frame_type.name in str(error)


def test_checks_run_in_wire_order_so_the_first_bad_field_is_reported() -> None:
    # Bad version and bad length and bad type at once: the version is named.
    assert protocol_error(prefix(length=3, version=9, frame_type=99)).code is (
        ErrorCode.UNSUPPORTED_VERSION
    )
    # Good version, bad length and bad type: the length is named.
    assert protocol_error(prefix(length=3, frame_type=99)).code is ErrorCode.MALFORMED_FRAME


def test_good_frames_before_a_bad_one_in_later_chunks_are_delivered() -> None:
    good = wire((FrameType.SEND, 0, 1, b"h", b"p"))
    decoder = FrameDecoder()

    assert len(decoder.feed(good + good)) == 2
    with pytest.raises(ProtocolError):
        decoder.feed(prefix(version=7))


def test_after_an_error_the_decoder_refuses_everything() -> None:
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError):
        decoder.feed(prefix(frame_type=99))

    with pytest.raises(ProtocolError) as caught:
        decoder.feed(wire((FrameType.HEARTBEAT, 0, 1, b"", b"")))

    assert caught.value.code is ErrorCode.UNKNOWN_FRAME_TYPE
    assert "must be closed" in str(caught.value)
    assert decoder.buffered == 0


def test_a_decoder_limit_below_the_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match="max_frame_bytes"):
        FrameDecoder(PREFIX_SIZE - 1)


# --- encoding refusals ------------------------------------------------------------------


def test_encoding_a_frame_over_the_limit_raises_frame_too_large() -> None:
    with pytest.raises(ProtocolError) as caught:
        encode_frame(FrameType.SEND, 1, b"", [bytes(600), bytes(500)], max_frame_bytes=1024)

    assert caught.value.code is ErrorCode.FRAME_TOO_LARGE
    assert "1116 bytes" in str(caught.value)


def test_encoding_illegal_flags_or_request_ids_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="flags"):
        encode_frame(FrameType.SEND, 1, flags=FLAG_ERROR)
    with pytest.raises(ValueError, match="flags"):
        encode_frame(FrameType.CONNECTION, 0)
    with pytest.raises(ValueError, match="request id"):
        encode_frame(FrameType.SEND, 2**32)
    with pytest.raises(ValueError, match="request id"):
        encode_frame(FrameType.SEND, -1)


# --- error frames and headers -----------------------------------------------------------


def test_a_protocol_error_becomes_a_connection_error_frame_the_peer_can_read() -> None:
    error = protocol_error(prefix(version=2))

    (frame,) = FrameDecoder().feed(b"".join(encode_error(error.code, str(error))))

    assert (frame.type, frame.request_id) == (FrameType.CONNECTION, 0)
    assert frame.is_response and frame.is_error
    assert bytes(frame.payload) == b""
    header = ErrorResponse.FromString(frame.header)
    assert header.code == ErrorResponse.UNSUPPORTED_VERSION
    assert header.message == str(error)
    assert not header.retriable


def test_a_request_error_frame_carries_the_request_type_id_and_hints() -> None:
    data = b"".join(
        encode_error(
            ErrorCode.NOT_MASTER,
            "broker-a-1 is a slave",
            request_id=42,
            frame_type=FrameType.SEND,
            retriable=True,
            master_address="10.0.0.1:8100",
        )
    )

    (frame,) = FrameDecoder().feed(data)

    assert (frame.type, frame.request_id, frame.flags) == (
        FrameType.SEND,
        42,
        FLAG_RESPONSE | FLAG_ERROR,
    )
    header = ErrorResponse.FromString(frame.header)
    assert (header.code, header.retriable, header.master_address) == (
        ErrorResponse.NOT_MASTER,
        True,
        "10.0.0.1:8100",
    )


def test_a_send_request_travels_as_a_header_with_its_records_as_payload() -> None:
    request = SendRequest(topic="orders", queue_id=3, producer_group="pg", record_count=2)
    records = [b"record-one", b"record-two"]

    (frame,) = FrameDecoder().feed(
        b"".join(encode_frame(FrameType.SEND, 8, request.SerializeToString(), records))
    )

    assert SendRequest.FromString(frame.header) == request
    assert bytes(frame.payload) == b"record-onerecord-two"


def test_a_pull_request_header_parses_straight_from_the_frame() -> None:
    request = PullRequest(consumer_group="cg", topic="t", offset=10, commit_offset=7)

    (frame,) = FrameDecoder().feed(
        b"".join(encode_frame(FrameType.PULL, 1, request.SerializeToString()))
    )
    parsed = PullRequest.FromString(frame.header)

    assert parsed == request
    assert parsed.HasField("commit_offset")


# --- receiving into one reused buffer ----------------------------------------------------


def receive(receiver: FrameReceiver, data: bytes, cuts: list[int]) -> list[Spec]:
    """Deliver ``data`` as a transport would, in pieces no larger than the buffer offered;
    each frame is read at once, before more arrives (as the buffer's users must)."""
    out: list[Spec] = []
    for chunk in split(data, cuts):
        while chunk:
            room = receiver.buffer()
            n = min(len(room), len(chunk))
            room[:n] = chunk[:n]
            out.extend(as_spec(f) for f in receiver.received(n))
            chunk = chunk[n:]
    return out


@given(
    stream=st.lists(specs(max_payload=3000), max_size=25),
    cuts=st.lists(st.integers(min_value=0), max_size=40),
)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_a_receiver_gives_what_a_decoder_gives_for_any_split(
    stream: list[Spec], cuts: list[int]
) -> None:
    data = b"".join(wire(s) for s in stream)
    # A small buffer: frames larger than it make it grow, partial ones move to its front.
    assert receive(FrameReceiver(initial_bytes=64), data, cuts) == stream


def test_a_receiver_reuses_its_buffer_once_it_holds_the_largest_frame() -> None:
    receiver = FrameReceiver(initial_bytes=1024)
    big = wire((FrameType.REPLICA_FETCH, FLAG_RESPONSE, 1, b"h", bytes(10_000)))
    assert len(receive(receiver, big, [100, 5000])) == 1
    buffer = receiver.buffer()
    assert len(receive(receiver, big, [7])) == 1
    assert receiver.buffer().obj is buffer.obj


def test_a_receiver_refuses_a_bad_prefix_and_stays_broken() -> None:
    receiver = FrameReceiver(max_frame_bytes=1024)
    with pytest.raises(ProtocolError) as caught:
        receive(receiver, prefix(length=5000), [])
    assert caught.value.code is ErrorCode.FRAME_TOO_LARGE
    with pytest.raises(ProtocolError):
        receiver.received(0)
