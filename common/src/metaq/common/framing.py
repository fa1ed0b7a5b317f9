"""The data-plane frame codec: bytes to frames and frames to bytes, with no I/O.

A frame (all integers little-endian; ``docs/protocol.md`` has it byte by byte)::

    u32 length        bytes after this field
    u8  version       PROTOCOL_VERSION
    u8  type          FrameType
    u16 flags         FLAG_RESPONSE | FLAG_ONE_WAY | FLAG_ERROR
    u32 request_id    echoed by the response; responses may come out of order
    u32 header_length
    header            a protobuf message from metaq/v1/data.proto, chosen by type and flags
    payload           the rest: raw commitlog records, never decoded by the codec

The decoder is built for the hot path: it cuts payloads straight out of the chunk the
socket delivered (memoryviews, no copy) and keeps only an incomplete trailing frame, so a
stream costs one pass over the bytes however it is split.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import Final, NamedTuple, TypeAlias

from metaq.common.errors import ErrorCode, ProtocolError
from metaq.common.v1.data_pb2 import ErrorResponse

PROTOCOL_VERSION: Final = 1

PREFIX: Final = struct.Struct("<IBBHII")
PREFIX_SIZE: Final = PREFIX.size
# The length field counts everything after itself, so it is at least the rest of the prefix.
MIN_LENGTH: Final = PREFIX_SIZE - 4
MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
"""Default limit on a whole frame, length field included; each decoder may set its own."""
_U32_MAX: Final = 0xFFFFFFFF
_U16: Final = struct.Struct("<H")
_U32: Final = struct.Struct("<I")

FLAG_RESPONSE: Final = 0x1
"""The frame answers the request with the same request id."""
FLAG_ONE_WAY: Final = 0x2
"""A request that wants no answer, not even an error."""
FLAG_ERROR: Final = 0x4
"""A response whose header is an ErrorResponse; always together with FLAG_RESPONSE."""
FLAG_SIGNED: Final = 0x8
"""A request whose payload ends with a signature trailer (``metaq.common.frame_auth``):
sent once the client proved a user's key on the connection (AUTH)."""

Buffer: TypeAlias = bytes | bytearray | memoryview
_BUFFER_TYPES: Final = (bytes, bytearray, memoryview)
"""Buffer's types as a tuple: ``isinstance`` takes a tuple faster than a union."""


class FrameType(enum.IntEnum):
    """What a frame is about; a response carries the type of its request."""

    CONNECTION = 0
    """The connection as a whole: only an error frame with request id 0, before closing."""
    HEARTBEAT = 1
    """Liveness probe; empty header and payload both ways."""
    SEND = 2
    PULL = 3
    COMMIT_OFFSET = 4
    """A consumer group stores its consumed offsets."""
    QUERY_OFFSET = 5
    """A queue's bounds, a group's committed offset, the offset for a timestamp."""
    CONSUMER_HEARTBEAT = 6
    """A consumer announces itself; the answer is its group's members."""
    LOCK_QUEUES = 7
    """An ordered consumer locks, renews or releases the queues it processes."""
    END_TRANSACTION = 8
    """A transactional producer commits or rolls back a half message."""
    CHECK_TRANSACTION = 9
    """The broker asks a producer (one-way) how a half message's transaction ended."""
    AUTH = 10
    """A client proves a user's key, once per connection (``metaq.common.frame_auth``)."""
    CONSUMER_IDS_CHANGED = 11
    """The broker tells a consumer (one-way) that its group's members changed; only sent
    to a consumer whose heartbeat asked for it."""
    # 12-15: further client operations; 16-31: replication (master <-> slave).
    REPLICA_FETCH = 16
    """A slave asks its master for the log from where its own ends, reporting how far it
    holds it."""
    REPLICA_AUTH = 17
    """Slave and master prove the cluster secret to each other, once per connection."""


_OPERATION_FLAGS: Final = (
    0,
    FLAG_ONE_WAY,
    FLAG_SIGNED,
    FLAG_SIGNED | FLAG_ONE_WAY,
    FLAG_RESPONSE,
    FLAG_RESPONSE | FLAG_ERROR,
)
# Every legal (type, flags) pair, keyed as type << 16 | flags, so the hot loop checks the
# type and the flags with one dict lookup that also yields the enum member.
_KINDS: Final[dict[int, FrameType]] = {
    (t << 16) | f: t
    for t in FrameType
    for f in (_OPERATION_FLAGS if t is not FrameType.CONNECTION else (FLAG_RESPONSE | FLAG_ERROR,))
}
_TYPE_CODES: Final = frozenset(FrameType)
# The same prefix read as four u32s: version, type and flags land in one word that is
# looked up whole.
_FAST_PREFIX: Final = struct.Struct("<IIII")
_KINDS_BY_WORD: Final[dict[int, FrameType]] = {
    PROTOCOL_VERSION | ((key >> 16) << 8) | ((key & 0xFFFF) << 16): t for key, t in _KINDS.items()
}


class Frame(NamedTuple):
    """One decoded frame.

    ``header`` is a small copy, ready for ``Message.FromString``. ``payload`` is a view of
    the chunk the frame arrived in and keeps that chunk alive: take ``bytes()`` of it to
    keep it long after the frame is handled.
    """

    type: FrameType
    flags: int
    request_id: int
    header: bytes
    payload: memoryview

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FLAG_RESPONSE)

    @property
    def is_error(self) -> bool:
        return bool(self.flags & FLAG_ERROR)

    @property
    def is_one_way(self) -> bool:
        return bool(self.flags & FLAG_ONE_WAY)


def encode_frame(
    frame_type: FrameType,
    request_id: int,
    header: bytes = b"",
    payload: Buffer | Sequence[Buffer] = b"",
    flags: int = 0,
    *,
    max_frame_bytes: int = MAX_FRAME_BYTES,
) -> list[Buffer]:
    """The buffers of one frame, for ``transport.writelines``.

    The prefix and the (small) header are joined into one bytes object; payload buffers
    are passed through untouched, so a payload sliced from the commitlog is never copied
    here. Raises ProtocolError(FRAME_TOO_LARGE) rather than build a frame the peer's
    default decoder would refuse, and ValueError for a type/flags pair or request id the
    protocol does not allow.
    """
    # One pass with the sizes inline: this runs for every request and answer, and a
    # helper call per part, twice over, cost more than the rest of the frame.
    if isinstance(payload, _BUFFER_TYPES):
        size = payload.nbytes if type(payload) is memoryview else len(payload)
        parts: list[Buffer] = [payload] if size else []
    else:
        parts = []
        size = 0
        for part in payload:
            n = part.nbytes if type(part) is memoryview else len(part)
            if n:
                parts.append(part)
                size += n
    length = MIN_LENGTH + len(header) + size
    if length + 4 > max_frame_bytes:
        raise ProtocolError(
            ErrorCode.FRAME_TOO_LARGE,
            f"a frame of {length + 4} bytes exceeds the limit of {max_frame_bytes} bytes; "
            "send fewer or smaller messages per request",
        )
    if ((frame_type << 16) | flags) not in _KINDS:
        name = getattr(frame_type, "name", frame_type)
        raise ValueError(f"flags {flags:#x} are not allowed on a frame of type {name}")
    if not 0 <= request_id <= _U32_MAX:
        raise ValueError(f"request id {request_id} does not fit in 32 bits")
    prefix = PREFIX.pack(length, PROTOCOL_VERSION, frame_type, flags, request_id, len(header))
    return [prefix + header if header else prefix, *parts]


def encode_error(
    code: ErrorCode,
    message: str,
    *,
    request_id: int = 0,
    frame_type: FrameType = FrameType.CONNECTION,
    retriable: bool = False,
    master_address: str = "",
) -> list[Buffer]:
    """An ERROR frame: for a request (its id and type) or, by default, for the connection.

    After a ProtocolError, send ``encode_error(exc.code, str(exc))`` and close.
    """
    header = ErrorResponse(
        code=ErrorResponse.Code.ValueType(code),
        message=message,
        retriable=retriable,
        master_address=master_address,
    ).SerializeToString()
    return encode_frame(frame_type, request_id, header, b"", FLAG_RESPONSE | FLAG_ERROR)


def _version_error(version: int) -> ProtocolError:
    if version == 0:
        advice = "no metaq release speaks version 0: is the peer a metaq client or broker?"
    elif version > PROTOCOL_VERSION:
        # Other protocols hitting the port also land here (HTTP's "GET /" reads as 47).
        advice = (
            "this side is the older one: upgrade it (or, if the peer is not metaq at all, "
            "it is talking to the wrong port)"
        )
    else:
        advice = "the peer is the older one: upgrade it"
    return ProtocolError(
        ErrorCode.UNSUPPORTED_VERSION,
        f"peer sent data-plane protocol version {version} but this side speaks version "
        f"{PROTOCOL_VERSION}; {advice}",
    )


def _check_prefix(buf: Buffer, at: int, avail: int, max_length: int) -> int:
    """Check the prefix fields present in ``buf[at:at+avail]``, in wire order.

    Returns the whole frame's size once all 16 prefix bytes are there, else 0. Each field
    is judged as soon as it has arrived, and always in the same order, so a broken stream
    fails with the same error however it was split into chunks.
    """
    if avail < 5:
        return 0
    version = buf[at + 4]
    if version != PROTOCOL_VERSION:
        raise _version_error(version)
    (length,) = _U32.unpack_from(buf, at)
    if length > max_length:
        raise ProtocolError(
            ErrorCode.FRAME_TOO_LARGE,
            f"frame of {length + 4} bytes exceeds this side's limit of {max_length + 4} "
            "bytes (max_frame_bytes); the sender must split its batch or this side raise "
            "its limit",
        )
    if length < MIN_LENGTH:
        raise ProtocolError(
            ErrorCode.MALFORMED_FRAME,
            f"frame length field is {length}, less than the {MIN_LENGTH} bytes of fixed "
            "fields after it",
        )
    if avail < 6:
        return 0
    type_code = buf[at + 5]
    if type_code not in _TYPE_CODES:
        spoken = ", ".join(f"{t.value} ({t.name})" for t in FrameType)
        raise ProtocolError(
            ErrorCode.UNKNOWN_FRAME_TYPE,
            f"unknown frame type {type_code}; protocol version {PROTOCOL_VERSION} has {spoken}",
        )
    if avail < 8:
        return 0
    (flags,) = _U16.unpack_from(buf, at + 6)
    if ((type_code << 16) | flags) not in _KINDS:
        frame_type = FrameType(type_code)
        allowed = (
            "RESPONSE|ERROR only"
            if frame_type is FrameType.CONNECTION
            else "none, ONE_WAY, SIGNED, SIGNED|ONE_WAY, RESPONSE or RESPONSE|ERROR"
        )
        raise ProtocolError(
            ErrorCode.MALFORMED_FRAME,
            f"flags {flags:#06x} are not valid on a {frame_type.name} frame (allowed: {allowed})",
        )
    if avail < PREFIX_SIZE:
        return 0
    (header_length,) = _U32.unpack_from(buf, at + 12)
    if header_length > length - MIN_LENGTH:
        raise ProtocolError(
            ErrorCode.MALFORMED_FRAME,
            f"header length {header_length} does not fit in a frame of {length + 4} bytes "
            f"({length - MIN_LENGTH} bytes follow the fixed fields)",
        )
    size: int = length + 4
    return size


class FrameDecoder:
    """Cuts a byte stream, delivered in chunks of any size, into frames.

    The payloads of frames that arrive whole within one chunk are views of that chunk;
    only a frame split across chunks is gathered into a buffer of its own. Unlike one
    long-lived buffer with a read offset, this copies no byte twice and never compacts:
    a buffer that frames still view could not be resized anyway. A large frame arriving
    in many pieces costs linear time. Any ProtocolError leaves the decoder dead: every
    later ``feed`` raises too, and the connection must be closed. Frames cut earlier in
    the failing ``feed`` call are dropped with the connection.
    """

    __slots__ = ("_error", "_max_length", "_need", "_partial")

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        if not PREFIX_SIZE <= max_frame_bytes <= _U32_MAX + 4:
            raise ValueError(
                f"max_frame_bytes must be between {PREFIX_SIZE} and {_U32_MAX + 4}, "
                f"not {max_frame_bytes}"
            )
        self._max_length = max_frame_bytes - 4
        # The start of a frame that did not fit in the chunks so far; never exported as a
        # memoryview while it still grows.
        self._partial = bytearray()
        # That frame's full size once its prefix is complete and checked, else 0.
        self._need = 0
        self._error: ProtocolError | None = None

    @property
    def max_frame_bytes(self) -> int:
        return self._max_length + 4

    @property
    def buffered(self) -> int:
        """Bytes held of an incomplete frame."""
        return len(self._partial)

    @property
    def pending_frame_bytes(self) -> int:
        """The whole size of the incomplete frame once its prefix has arrived, else 0:
        what holding it will cost by the time it is complete."""
        return self._need

    def feed(self, data: bytes) -> list[Frame]:
        """Take the next chunk of the stream; return the frames it completed, in order."""
        if self._error is not None:
            raise ProtocolError(
                self._error.code,
                f"the connection already broke the protocol and must be closed: {self._error}",
            )
        try:
            return self._feed(data)
        except ProtocolError as exc:
            self._error = exc
            self._partial = bytearray()
            self._need = 0
            raise

    def _feed(self, data: bytes) -> list[Frame]:
        if type(data) is not bytes:
            # Payloads are views of the chunk: it must not change under them.
            data = bytes(data)
        view = memoryview(data)
        n = len(view)
        frames: list[Frame] = []
        pos = 0
        if self._partial:
            pos = self._complete(view, frames)
            if pos < 0:
                return frames
        unpack = _FAST_PREFIX.unpack_from
        kinds = _KINDS_BY_WORD
        min_length = MIN_LENGTH
        max_length = self._max_length
        new = tuple.__new__
        append = frames.append
        while n - pos >= PREFIX_SIZE:
            length, word, request_id, header_length = unpack(view, pos)
            # One lookup checks version, type and flags; one chained comparison checks
            # the length against the limit and the header against the length.
            kind = kinds.get(word)
            if kind is None or not min_length + header_length <= length <= max_length:
                _check_prefix(view, pos, n - pos, max_length)
                raise AssertionError("the fast and the careful prefix checks disagree")
            end = pos + 4 + length
            if end > n:
                break
            at = pos + PREFIX_SIZE + header_length
            append(
                new(
                    Frame,
                    (kind, word >> 16, request_id, data[pos + PREFIX_SIZE : at], view[at:end]),
                )
            )
            pos = end
        if pos < n:
            # Checked now rather than when the rest arrives, so a peer that sent a bad
            # prefix and waits is told at once instead of hanging.
            self._need = _check_prefix(view, pos, n - pos, max_length)
            self._partial = bytearray(view[pos:])
        return frames

    def _complete(self, view: memoryview, frames: list[Frame]) -> int:
        """Add the chunk's first bytes to the pending frame; return where the chunk's own
        frames start, or -1 when the whole chunk went into the still incomplete frame."""
        partial = self._partial
        n = len(view)
        pos = 0
        if not self._need:
            pos = min(PREFIX_SIZE - len(partial), n)
            partial += view[:pos]
            self._need = _check_prefix(partial, 0, len(partial), self._max_length)
            if not self._need:
                return -1
        missing = self._need - len(partial)
        if n - pos < missing:
            partial += view[pos:]
            return -1
        partial += view[pos : pos + missing]
        _, _, type_code, flags, request_id, header_length = PREFIX.unpack_from(partial)
        whole = memoryview(partial)
        at = PREFIX_SIZE + header_length
        frames.append(
            Frame(
                _KINDS[(type_code << 16) | flags],
                flags,
                request_id,
                bytes(whole[PREFIX_SIZE:at]),
                whole[at:],
            )
        )
        # The views pin this buffer's size; the next partial frame gets a new one.
        self._partial = bytearray()
        self._need = 0
        return pos + missing


class FrameReceiver:
    """Cuts a byte stream into frames received straight into one buffer that is reused.

    For an ``asyncio.BufferedProtocol``: :meth:`buffer` is where the transport puts the
    next bytes, :meth:`received` says how many came. No chunk is copied and no frame
    gets memory of its own, which is what a slave copying its master's log at disk
    speed needs (each new page of a fresh buffer costs more than the bytes in it). The
    price: a payload is a view of the buffer and is overwritten by later frames, so only
    a connection that asks one thing at a time and has done with each answer before it
    asks the next may use this; others use :class:`FrameDecoder`. The buffer grows to
    the largest frame seen. Any ProtocolError leaves the receiver dead.
    """

    __slots__ = ("_buffer", "_end", "_error", "_max_length", "_start", "_view")

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES, initial_bytes: int = 1 << 20):
        self._max_length = FrameDecoder(max_frame_bytes).max_frame_bytes - 4
        self._buffer = bytearray(max(initial_bytes, PREFIX_SIZE))
        self._view = memoryview(self._buffer)
        # Bytes [_start, _end) of the buffer are received and not yet cut into frames.
        self._start = self._end = 0
        self._error: ProtocolError | None = None

    def buffer(self) -> memoryview:
        """Where the next bytes go: the free end of the buffer, never empty."""
        if self._start == self._end:
            self._start = self._end = 0  # every frame handed out: start over
        elif self._end == len(self._buffer):
            self._make_room()
        return self._view[self._end :]

    def _make_room(self) -> None:
        pending = self._end - self._start
        need = _check_prefix(self._buffer, self._start, pending, self._max_length)
        size = max(need, pending + PREFIX_SIZE, len(self._buffer))
        if size > len(self._buffer):
            # Earlier payloads may still be viewed: they keep the old buffer alive.
            self._buffer = bytearray(size)
            self._buffer[:pending] = self._view[self._start : self._end]
            self._view = memoryview(self._buffer)
        else:
            self._view[:pending] = self._view[self._start : self._end]
        self._start, self._end = 0, pending

    def received(self, nbytes: int) -> list[Frame]:
        """``nbytes`` arrived in :meth:`buffer`; return the frames now complete, in order."""
        if self._error is not None:
            raise ProtocolError(
                self._error.code,
                f"the connection already broke the protocol and must be closed: {self._error}",
            )
        self._end += nbytes
        frames: list[Frame] = []
        view, start, end = self._view, self._start, self._end
        try:
            while end - start >= PREFIX_SIZE:
                size = _check_prefix(view, start, end - start, self._max_length)
                if end - start < size:
                    break
                _, _, type_code, flags, request_id, header_length = PREFIX.unpack_from(view, start)
                at = start + PREFIX_SIZE + header_length
                frames.append(
                    Frame(
                        _KINDS[(type_code << 16) | flags],
                        flags,
                        request_id,
                        bytes(view[start + PREFIX_SIZE : at]),
                        view[at : start + size],
                    )
                )
                start += size
        except ProtocolError as exc:
            self._error = exc
            raise
        self._start = start
        return frames
