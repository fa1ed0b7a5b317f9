"""The commitlog record: one self-describing message, as producers build it and the log stores it.

A record is built once by the producer and then travels as bytes: the broker stamps the
few fields only it knows (commitlog offset, queue offset, store time, store host) and the
CRC, appends it to the commitlog, and later slices it back out for consumers and slaves
without decoding it. The byte layout is written down in ``docs/storage-format.md``.
"""

from __future__ import annotations

import itertools
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, NoReturn, Protocol, TypeVar

# zlib-ng's CRC-32 (the same checksum as zlib's) runs several times faster than zlib's on
# a KiB (docs/benchmarks.md), and every consumer checks every record it receives.
from zlib_ng.zlib_ng import crc32

from metaq.common.errors import InvalidMessage, InvalidRecord
from metaq.common.names import shown

FORMAT_VERSION: Final = 1
MAGIC: Final = 0x4D510000 | FORMAT_VERSION
# Fills the unused end of a commitlog segment so that no record spans two segments.
BLANK_MAGIC: Final = 0x4D51FFFF


@dataclass(frozen=True, slots=True)
class Field:
    """One fixed-size field of the record header and where it lies."""

    name: str
    code: str
    """Its ``struct`` format code; every integer is little-endian."""
    offset: int
    packer: struct.Struct
    """The field alone, to read or write it at ``record start + offset``."""

    @property
    def end(self) -> int:
        return self.offset + self.packer.size

    def read(self, buf: bytes | bytearray | memoryview, at: int = 0) -> int | bytes:
        """The field of the record at ``buf[at:]``; hot loops use a :class:`HeaderView`."""
        value: int | bytes = self.packer.unpack_from(buf, at + self.offset)[0]
        return value


def _layout(*fields: tuple[str, str]) -> dict[str, Field]:
    table: dict[str, Field] = {}
    at = 0
    for name, code in fields:
        one = struct.Struct("<" + code)
        table[name] = Field(name, code, at, one)
        at += one.size
    return table


FIELDS: Final[Mapping[str, Field]] = MappingProxyType(
    _layout(
        ("size", "I"),  # the whole record, header included
        ("magic", "I"),
        ("crc", "I"),
        ("flags", "I"),
        ("commitlog_offset", "q"),  # commitlog_offset .. store_host: stamped by the broker
        ("queue_offset", "q"),
        ("store_timestamp_ms", "q"),
        ("store_host", "8s"),
        ("queue_id", "i"),
        ("reconsume_times", "i"),
        ("born_timestamp_ms", "q"),
        ("msg_id", "16s"),
        ("born_host", "8s"),
        ("topic_len", "H"),  # the lengths of the variable parts, which follow in this order
        ("tags_len", "H"),
        ("keys_len", "H"),
        ("props_len", "H"),
        ("body_len", "I"),
    )
)
"""The record header field by field, in byte order (``docs/storage-format.md``): the one
statement of its layout. :data:`HEADER` and every partial view are derived from it."""

HEADER: Final = struct.Struct("<" + "".join(f.code for f in FIELDS.values()))
HEADER_SIZE: Final = HEADER.size


def header_view(*names: str, topic_len: int | None = None) -> struct.Struct:
    """A struct that unpacks only the header fields ``names`` (in header order) from a
    record's first byte, skipping the others as pad bytes, so a hot loop that needs three
    fields does not pay to unpack eighteen; with ``topic_len``, the topic that follows the
    header too. For reading: packing one writes zeros over the skipped bytes."""
    codes = ["<"]
    at = 0
    for name in names:
        field = FIELDS[name]
        if field.offset < at:
            raise ValueError(f"header field {name!r} is out of header order in {names}")
        if field.offset > at:
            codes.append(f"{field.offset - at}x")
        codes.append(field.code)
        at = field.end
    if topic_len is not None:
        codes.append(f"{HEADER_SIZE - at}x{topic_len}s" if at < HEADER_SIZE else f"{topic_len}s")
    return struct.Struct("".join(codes))


_CODE: Final = re.compile(r"(\d*)([a-zA-Z?])")


def view_fields(view: struct.Struct) -> tuple[str, ...]:
    """The names of what ``view`` unpacks, read back from its format against
    :data:`FIELDS` ("topic" for a topic after the header); ValueError where it would read
    bytes that are no field, or a field with another code."""
    by_offset = {field.offset: field for field in FIELDS.values()}
    names: list[str] = []
    at = 0
    for count, code in _CODE.findall(view.format.lstrip("<")):
        if code == "x":
            at += int(count or 1)
        elif at >= HEADER_SIZE and code == "s":
            names.append("topic")
            at += int(count or 1)
        else:
            field = by_offset.get(at)
            if field is None or field.code != count + code:
                raise ValueError(f"{view.format!r} reads {count + code} at byte {at}: no field")
            names.append(field.name)
            at = field.end
    return tuple(names)


def _span(first: str, last: str) -> struct.Struct:
    """The contiguous fields ``first`` .. ``last`` as one struct, to write them at once."""
    fields = list(FIELDS.values())
    run = fields[fields.index(FIELDS[first]) : fields.index(FIELDS[last]) + 1]
    return struct.Struct("<" + "".join(f.code for f in run))


CRC_AT: Final = FIELDS["crc"].offset
# Everything from the end of the CRC to the end of the record is covered by the CRC.
CRC_START: Final = FIELDS["crc"].end
# The fields the broker fills in on append, contiguous so one pack_into stamps them all.
STAMP: Final = _span("commitlog_offset", "store_host")
STAMP_AT: Final = FIELDS["commitlog_offset"].offset
_CRC: Final = FIELDS["crc"].packer
_SIZE: Final = FIELDS["size"]
_QUEUE_ID: Final = FIELDS["queue_id"]

MAX_TOPIC_BYTES: Final = 127
MAX_TAGS_BYTES: Final = 255
MAX_KEYS_BYTES: Final = 1024
TOPIC_PATTERN: Final = re.compile(r"[A-Za-z0-9_|%-]{1,127}")
MAX_QUEUES_PER_TOPIC: Final = 65_536
"""Queue ids are 0 up to this (exclusive): brokers store no more, nameservers route no more."""

FLAG_COMPRESSED: Final = 0x1
"""The body is zlib-compressed; consumers inflate it, the broker never looks."""
FLAG_DELAYED: Final = 0x2
"""Deliver later: the properties say when (``DELAY``: a delay level, 1-based, or
``DELIVER_AT``: ms since the Unix epoch). The flag spares the broker reading the
properties of every other record."""
FLAG_TRANSACTION: Final = 0x4
"""A half message: stored, but delivered only once its producer commits it."""
FLAG_SEQUENCED: Final = 0x8
"""The message id is an idempotent producer's sequence number (:data:`SEQUENCED_ID`):
producer id, epoch, queue id and the record's sequence in that queue. The broker keeps
the last few batches of each producer and queue, from the records themselves (so slaves
and recovery rebuild them from the log), and answers a re-sent sequence from the log."""
SEQUENCED_ID: Final = struct.Struct(">QQ")
"""A sequenced message id as two big-endian words: producer id (48 bits) and epoch (16),
then queue id (16) and sequence (48). Unique like any id: the producer id is random."""
UNPLACED: Final = (1 << 64) - 1
"""The queue and commitlog offset a SEND answers for a re-sent sequence stored too long
ago for the broker to remember where: stored, place unknown (clients show -1)."""
MAX_PRODUCER_ID: Final = (1 << 48) - 1
MAX_SEQUENCE: Final = (1 << 48) - 1


def sequenced_id(producer_id: int, epoch: int, queue_id: int, sequence: int) -> bytes:
    """The message id of record ``sequence`` of producer ``producer_id`` (at ``epoch``)
    in queue ``queue_id``; see :data:`FLAG_SEQUENCED`."""
    if not (0 <= producer_id <= MAX_PRODUCER_ID and 0 <= epoch < 1 << 16):
        raise InvalidMessage(
            f"producer id {producer_id} / epoch {epoch} out of range "
            f"(0-{MAX_PRODUCER_ID} / 0-65535)"
        )
    if not 0 <= sequence <= MAX_SEQUENCE:
        raise InvalidMessage(f"sequence {sequence} out of range (0-{MAX_SEQUENCE})")
    return SEQUENCED_ID.pack(producer_id << 16 | epoch, (queue_id & 0xFFFF) << 48 | sequence)


def id_sequence(msg_id: bytes) -> tuple[int, int, int]:
    """(producer id, epoch, sequence) of a sequenced message id."""
    producer, place = SEQUENCED_ID.unpack(msg_id)
    return producer >> 16, producer & 0xFFFF, place & MAX_SEQUENCE


PROP_TRANSACTION: Final = "TRAN_MSG"
"""Set by a transactional producer; the encoder turns it into FLAG_TRANSACTION."""
PROP_REAL_TOPIC: Final = "REAL_TOPIC"
PROP_REAL_QUEUE: Final = "REAL_QID"
"""Where a message held in a system topic (delayed, half) is finally to be delivered."""
PROP_DELAY_LEVEL: Final = "DELAY"
PROP_DELIVER_AT: Final = "DELIVER_AT"

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

_KV: Final = "\x01"
_PAIR: Final = "\x02"
_KEY_SEPARATOR: Final = " "


@dataclass(frozen=True, slots=True)
class Record:
    """A decoded record; producers and tools use it, the broker's hot paths do not."""

    topic: str
    body: bytes
    queue_id: int = 0
    tags: str = ""
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    flags: int = 0
    msg_id: bytes = b""
    born_timestamp_ms: int = 0
    born_host: bytes = bytes(8)
    reconsume_times: int = 0
    commitlog_offset: int = -1
    queue_offset: int = -1
    store_timestamp_ms: int = 0
    store_host: bytes = bytes(8)
    size: int = 0

    @property
    def msg_id_hex(self) -> str:
        return self.msg_id.hex()


def inflate(body: bytes, what: str) -> bytes:
    """The body of a record flagged ``FLAG_COMPRESSED``; InvalidRecord naming ``what``
    (the message or row it belongs to) when it does not inflate."""
    try:
        return zlib.decompress(body)
    except zlib.error as exc:
        raise InvalidRecord(f"{what} is flagged compressed but does not inflate: {exc}") from None


def check_topic(topic: str) -> None:
    """Raise InvalidMessage unless ``topic`` is a legal topic name."""
    if not TOPIC_PATTERN.fullmatch(topic):
        raise InvalidMessage(
            f"illegal topic name {shown(topic)}: use 1-{MAX_TOPIC_BYTES} characters from "
            "letters, digits, '_', '-', '|' and '%'"
        )


class _MessageIds:
    """Process-unique 16-byte message ids: 8 random bytes, then a 64-bit big-endian
    number; blocks of consecutive numbers for batches, so a batch's ids need not be read
    back from the broker's answer."""

    def __init__(self) -> None:
        self._reseed()
        os.register_at_fork(after_in_child=self._reseed)

    def _reseed(self) -> None:
        self.prefix = os.urandom(8)
        self.prefix_hex = self.prefix.hex()
        self._counter = itertools.count()
        # Blocks come from the upper half of the numbers and single ids from the lower, so
        # single ids need no lock (drawing from a C counter is atomic) and a block takes
        # one lock per batch.
        self._blocks = threading.Lock()
        self._next_block = _BLOCKS_FROM

    def next(self) -> bytes:
        return self.prefix + next(self._counter).to_bytes(8, "big")

    def take(self, count: int) -> int:
        """Reserve ``count`` consecutive id numbers; return the first."""
        with self._blocks:
            first = self._next_block
            self._next_block = first + count
        return first


_BLOCKS_FROM: Final = 1 << 63
_IDS: Final = _MessageIds()
new_msg_id: Final = _IDS.next


def msg_id_hex(number: int) -> str:
    """The hex message id of id number ``number`` of this process (see
    :meth:`RecordEncoder.encode_batch`)."""
    return f"{_IDS.prefix_hex}{number:016x}"


def msg_id_prefix_hex() -> str:
    return _IDS.prefix_hex


def encode_properties(properties: Mapping[str, str]) -> bytes:
    for key, value in properties.items():
        for text in (key, value):
            if _KV in text or _PAIR in text:
                raise InvalidMessage(
                    f"property {key!r} contains a reserved control character (\\x01 or \\x02)"
                )
    return _utf8("properties", "".join(f"{k}{_KV}{v}{_PAIR}" for k, v in properties.items()))


def _utf8(what: str, text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidMessage(f"{what} cannot be encoded as UTF-8: {exc.reason}") from None


def decode_properties(raw: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in raw.decode().split(_PAIR):
        if pair:
            key, _, value = pair.partition(_KV)
            out[key] = value
    return out


def encode_extras(
    tags: str, keys: Sequence[str], properties: Mapping[str, str] | None
) -> tuple[bytes, bytes, bytes]:
    """Tags, keys and properties as record bytes; InvalidMessage unless they fit."""
    if isinstance(keys, str):
        raise InvalidMessage(f"keys must be a sequence of strings, not the string {keys!r}")
    try:
        tags_b = tags.encode()
        keys_b = _KEY_SEPARATOR.join(keys).encode()
    except UnicodeEncodeError:
        _utf8("tags", tags)  # raises, naming the part that is not UTF-8
        _utf8("keys", _KEY_SEPARATOR.join(keys))
        raise
    if len(tags_b) > MAX_TAGS_BYTES:
        raise InvalidMessage(f"tags are {len(tags_b)} bytes; the limit is {MAX_TAGS_BYTES}")
    for key in keys:
        if not key or _KEY_SEPARATOR in key:
            raise InvalidMessage(f"message key {key!r} is empty or contains a space")
    if len(keys_b) > MAX_KEYS_BYTES:
        raise InvalidMessage(f"keys are {len(keys_b)} bytes; the limit is {MAX_KEYS_BYTES}")
    props_b = encode_properties(properties) if properties else b""
    if len(props_b) > 0xFFFF:
        raise InvalidMessage(f"properties are {len(props_b)} bytes; the limit is 65535")
    return tags_b, keys_b, props_b


def property_flags(properties: Mapping[str, str] | None) -> int:
    """The flags the broker must see without reading properties: delayed, half message."""
    if not properties:
        return 0
    flags = 0
    if PROP_DELAY_LEVEL in properties or PROP_DELIVER_AT in properties:
        flags |= FLAG_DELAYED
    if PROP_TRANSACTION in properties:
        flags |= FLAG_TRANSACTION
    return flags


class OutgoingRecord(Protocol):
    """What :meth:`RecordEncoder.encode_batch` takes of a message that is more than a body."""

    @property
    def body(self) -> bytes: ...
    @property
    def tags(self) -> str: ...
    @property
    def keys(self) -> Sequence[str]: ...
    @property
    def properties(self) -> Mapping[str, str] | None: ...


NO_HOST: Final = bytes(8)
_NEVER: Final = 1 << 62
_BUFFERS: Final = (bytes, bytearray, memoryview)


class RecordEncoder:
    """The record encoder: producers, Spark's writer and the broker's re-addressing all
    build records here (:func:`encode` is the one-off form), with one ``pack`` of
    :data:`HEADER` per record and one ``join`` per buffer; each topic is checked once.

    Records are built as a producer sends them: broker-stamped fields unset, CRC unset.
    The broker computes the CRC after stamping (see :func:`seal`), so a record is checked
    end to end over the exact bytes that reach the disk.

    With ``compress_over_bytes``, a larger body is zlib-compressed and flagged
    ``FLAG_COMPRESSED`` when that makes it smaller; with ``max_message_bytes``, a larger
    body (after compression) is refused.
    """

    def __init__(
        self,
        *,
        compress_over_bytes: int | None = None,
        compress_level: int = 5,
        max_message_bytes: int | None = None,
    ) -> None:
        self.compress_over_bytes = compress_over_bytes
        self.compress_level = compress_level
        self.max_message_bytes = max_message_bytes
        self._compress_over = _NEVER if compress_over_bytes is None else compress_over_bytes
        self._max_bytes = _NEVER if max_message_bytes is None else max_message_bytes
        self._topics: dict[str, bytes] = {}

    def topic_bytes(self, topic: str) -> bytes:
        raw = self._topics.get(topic)
        if raw is None:
            check_topic(topic)
            raw = self._topics[topic] = topic.encode()
        return raw

    def encode(
        self,
        topic: str,
        body: bytes | bytearray | memoryview,
        queue_id: int = 0,
        tags: str = "",
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        *,
        msg_id: bytes | None = None,
        flags: int = 0,
    ) -> bytes:
        """A producer's record: a new id of this process (or ``msg_id``, with ``flags``
        for it: a sequenced id), born now, flagged as its ``properties`` ask (delayed,
        half message) and compressed as configured."""
        topic_b = self._topics.get(topic) or self.topic_bytes(topic)
        size = len(body)
        if size > self._compress_over:
            packed = zlib.compress(body, self.compress_level)
            if len(packed) < size:
                body, flags, size = packed, flags | FLAG_COMPRESSED, len(packed)
        if size > self._max_bytes:
            after = " after compression" if flags & FLAG_COMPRESSED else ""
            raise InvalidMessage(
                f"message body is {size} bytes{after}; the producer's limit is "
                f"{self.max_message_bytes} bytes (max_message_bytes)"
            )
        return b"".join(
            _parts(
                topic_b, body, flags | property_flags(properties), queue_id, 0,
                time.time_ns() // 1_000_000, msg_id or _IDS.next(), NO_HOST, tags, keys,
                properties,
            )
        )  # fmt: skip

    def encode_batch(
        self,
        topic: str,
        messages: Sequence[OutgoingRecord | bytes | bytearray | memoryview],
        queue_id: int,
        *,
        max_records: int,
        max_bytes: int,
        sequenced: tuple[int, int] | None = None,
    ) -> list[tuple[bytes, int, int]]:
        """Encode messages back to back into as few buffers as the batch limits allow;
        returns (buffer, record count, first message-id number) per batch. One buffer per
        batch means one write and no per-record bookkeeping downstream; the ids of a batch
        are consecutive (see :func:`msg_id_hex`). With ``sequenced`` (producer id, first
        sequence) the ids are that producer's sequences (epoch 0) and the first id
        number returned is -1."""
        if not messages:
            return []
        topic_b = self._topics.get(topic) or self.topic_bytes(topic)
        topic_len = len(topic_b)
        pack, fixed = HEADER.pack, HEADER_SIZE + topic_len
        prefix = _IDS.prefix
        number = _IDS.take(len(messages))
        seq_flag = word = place = 0
        pack_id = SEQUENCED_ID.pack
        if sequenced is not None:
            seq_flag = FLAG_SEQUENCED
            word = sequenced[0] << 16
            place = (queue_id & 0xFFFF) << 48 | sequenced[1]
            number = 0
        threshold, limit = self._compress_over, self._max_bytes
        born = time.time_ns() // 1_000_000
        batches: list[tuple[bytes, int, int]] = []
        parts: list[bytes | bytearray | memoryview] = []
        nbytes = count = 0
        for index, message in enumerate(messages):
            if type(message) is bytes or isinstance(message, _BUFFERS):
                body, extras = message, b""
                tags_len = keys_len = props_len = flags = 0
            else:
                body = message.body
                tags_b, keys_b, props_b = encode_extras(
                    message.tags, message.keys, message.properties
                )
                extras = tags_b + keys_b + props_b
                tags_len, keys_len, props_len = len(tags_b), len(keys_b), len(props_b)
                flags = property_flags(message.properties)
            flags |= seq_flag
            size = len(body)
            if size > threshold:
                packed = zlib.compress(body, self.compress_level)
                if len(packed) < size:
                    body, flags, size = packed, flags | FLAG_COMPRESSED, len(packed)
            if size > limit:
                raise InvalidMessage(
                    f"message {index} of the batch has a body of {size} bytes; the "
                    f"producer's limit is {limit} bytes (max_message_bytes)"
                )
            total = fixed + len(extras) + size
            if count and (count >= max_records or nbytes + total > max_bytes):
                batches.append((b"".join(parts), count, number - count if not seq_flag else -1))
                parts = []
                nbytes = count = 0
            msg_id = (
                pack_id(word, place + number) if seq_flag else prefix + number.to_bytes(8, "big")
            )
            parts.append(
                pack(
                    total, MAGIC, 0, flags, -1, -1, 0, NO_HOST, queue_id, 0, born, msg_id,
                    NO_HOST, topic_len, tags_len, keys_len, props_len, size,
                )
            )  # fmt: skip
            parts.append(topic_b)
            if extras:
                parts.append(extras)
            parts.append(body)
            nbytes += total
            count += 1
            number += 1
        if count:
            batches.append((b"".join(parts), count, number - count if not seq_flag else -1))
        return batches


def _parts(
    topic_b: bytes,
    body: bytes | bytearray | memoryview,
    flags: int,
    queue_id: int,
    reconsume_times: int,
    born_timestamp_ms: int,
    msg_id: bytes,
    born_host: bytes,
    tags: str,
    keys: Sequence[str],
    properties: Mapping[str, str] | None,
) -> tuple[bytes | bytearray | memoryview, ...]:
    """The parts of one record of these fields, in order, to be joined: the header with
    the broker-stamped fields and the CRC unset, then topic, extras and body."""
    if tags or keys or properties:
        tags_b, keys_b, props_b = encode_extras(tags, keys, properties)
    else:
        tags_b = keys_b = props_b = b""
    size = len(body)
    header = HEADER.pack(
        HEADER_SIZE + len(topic_b) + len(tags_b) + len(keys_b) + len(props_b) + size,
        MAGIC, 0, flags, -1, -1, 0, NO_HOST, queue_id, reconsume_times,
        born_timestamp_ms, msg_id, born_host,
        len(topic_b), len(tags_b), len(keys_b), len(props_b), size,
    )  # fmt: skip
    return header, topic_b, tags_b, keys_b, props_b, body


_PLAIN: Final = RecordEncoder()


def encode(
    topic: str,
    body: bytes | bytearray | memoryview,
    *,
    queue_id: int = 0,
    tags: str = "",
    keys: Sequence[str] = (),
    properties: Mapping[str, str] | None = None,
    flags: int = 0,
    msg_id: bytes | None = None,
    born_timestamp_ms: int = 0,
    born_host: bytes = NO_HOST,
    reconsume_times: int = 0,
) -> bytearray:
    """A record of exactly these fields, in a buffer the caller may stamp and seal: the
    body as given (never compressed here), the flags as given; ``msg_id`` None for a new
    id of this process."""
    topic_b = _PLAIN.topic_bytes(topic)
    if msg_id is None:
        msg_id = _IDS.next()
    elif len(msg_id) != 16:
        raise InvalidMessage(f"a message id is 16 bytes, not {len(msg_id)}")
    if len(born_host) != 8:
        raise InvalidMessage("born_host is 8 bytes: IPv4 address, port, two reserved")
    return bytearray().join(
        _parts(
            topic_b, body, flags, queue_id, reconsume_times, born_timestamp_ms, msg_id,
            born_host, tags, keys, properties,
        )
    )  # fmt: skip


def with_queue_id(records: bytes | bytearray | memoryview, queue_id: int) -> bytearray:
    """A copy of ``records`` (one record or several back to back) aimed at another queue,
    for a retry elsewhere."""
    out = bytearray(records)
    put = _QUEUE_ID.packer.pack_into
    queue_id_at = _QUEUE_ID.offset
    read_size = _SIZE.packer.unpack_from
    at = 0
    while at + HEADER_SIZE <= len(out):
        put(out, at + queue_id_at, queue_id)
        (size,) = read_size(out, at)
        if size < HEADER_SIZE:
            raise ValueError(f"not a record at byte {at}: size field {size}")
        at += size
    return out


def readdress(
    rec: Record, topic: str, queue_id: int, properties: Mapping[str, str], *, clear_flags: int = 0
) -> bytearray:
    """``rec`` encoded again for another topic and queue: same id, body, tags, keys and
    origin; the broker stamps it anew when it is appended."""
    return encode(
        topic,
        rec.body,
        queue_id=queue_id,
        tags=rec.tags,
        keys=rec.keys,
        properties=properties,
        flags=rec.flags & ~clear_flags,
        msg_id=rec.msg_id,
        born_timestamp_ms=rec.born_timestamp_ms,
        born_host=rec.born_host,
        reconsume_times=rec.reconsume_times,
    )


def seal(buf: bytearray | memoryview, at: int, size: int) -> None:
    """Write the CRC of the record at ``buf[at:at+size]`` into its header."""
    crc = crc32(memoryview(buf)[at + CRC_START : at + size])
    _CRC.pack_into(buf, at + CRC_AT, crc)


def crc_ok(buf: bytes | bytearray | memoryview, at: int, size: int, crc: int) -> bool:
    return crc32(memoryview(buf)[at + CRC_START : at + size]) == crc


class RecordBuilder(Protocol[T_co]):
    """Builds what a decoded record becomes from its fields, in :class:`Record`'s field
    order (so ``Record`` itself is one): decoding straight into the caller's own type
    spares building a Record first on a consumer's hot path."""

    def __call__(
        self, topic: str, body: bytes, queue_id: int, tags: str, keys: tuple[str, ...],
        properties: dict[str, str], flags: int, msg_id: bytes, born_timestamp_ms: int,
        born_host: bytes, reconsume_times: int, commitlog_offset: int, queue_offset: int,
        store_timestamp_ms: int, store_host: bytes, size: int, /,
    ) -> T_co: ...  # fmt: skip


def decode(buf: bytes | bytearray | memoryview, at: int = 0, *, verify: bool = True) -> Record:
    """Decode one record; raise InvalidRecord if it is malformed or its CRC is wrong."""
    return decode_built(Record, buf, at, verify=verify)


def iter_records(buf: bytes | bytearray | memoryview, *, verify: bool = True) -> Iterator[Record]:
    """Decode a run of back-to-back records, as a pull or a batch send carries them."""
    return iter_built(Record, buf, verify=verify)


def decode_built(
    build: RecordBuilder[T], buf: bytes | bytearray | memoryview, at: int = 0, *,
    verify: bool = True,
) -> T:  # fmt: skip
    """:func:`decode`, into what ``build`` makes of the record's fields."""
    return _decode(build, memoryview(buf), at, verify)[0]


def iter_built(
    build: RecordBuilder[T], buf: bytes | bytearray | memoryview, *, verify: bool = True
) -> Iterator[T]:
    """:func:`iter_records`, into what ``build`` makes of each record's fields."""
    view = memoryview(buf)
    at = 0
    while at < len(view):
        built, size = _decode(build, view, at, verify)
        yield built
        at += size


def decode_run(
    build: RecordBuilder[T], buf: bytes | bytearray | memoryview, *, verify: bool = True
) -> list[T]:
    """:func:`iter_built` as a list, with :func:`_decode`'s checks inlined in one loop.

    A consumer decodes every record it receives, so what it spends per record beside the
    checks counts: no generator step, call or tuple per record here (the figure is in
    docs/benchmarks.md). The checks and errors are ``_decode``'s.
    """
    view = memoryview(buf)
    end = len(view)
    unpack = HEADER.unpack_from
    built: list[T] = []
    append = built.append
    at = 0
    while at < end:
        if end - at < HEADER_SIZE:
            _reject(build, view, at, verify)
        (
            total, magic, crc, flags, cl_off, q_off, store_ts, store_host, queue_id, reconsume,
            born_ts, msg_id, born_host, topic_len, tags_len, keys_len, props_len, body_len,
        ) = unpack(view, at)  # fmt: skip
        props_end = at + HEADER_SIZE + topic_len + tags_len + keys_len + props_len
        record_end = at + total
        if (
            magic != MAGIC
            or record_end != props_end + body_len
            or record_end > end
            or (verify and crc != crc32(view[at + CRC_START : record_end]))
        ):
            _reject(build, view, at, verify)
        topic_end = at + HEADER_SIZE + topic_len
        try:
            topic = str(view[topic_end - topic_len : topic_end], "utf-8")
            if tags_len or keys_len or props_len:
                tags_end = topic_end + tags_len
                keys_end = tags_end + keys_len
                tags = str(view[topic_end:tags_end], "utf-8") if tags_len else ""
                keys = (
                    str(view[tags_end:keys_end], "utf-8").split(_KEY_SEPARATOR) if keys_len else ()
                )
                properties = decode_properties(bytes(view[keys_end:props_end])) if props_len else {}
            else:
                tags, keys, properties = "", (), {}
        except UnicodeDecodeError as exc:
            raise InvalidRecord(f"a text field of the record is not UTF-8: {exc}") from None
        append(
            build(
                topic, bytes(view[props_end:record_end]), queue_id, tags, tuple(keys),
                properties, flags, msg_id, born_ts, born_host, reconsume, cl_off, q_off,
                store_ts, store_host, total,
            )
        )  # fmt: skip
        at = record_end
    return built


def _reject(build: RecordBuilder[T], view: memoryview, at: int, verify: bool) -> NoReturn:
    """Raise InvalidRecord saying what is wrong with the record at ``at``: the one
    place that words those errors is :func:`_decode`."""
    _decode(build, view, at, verify)
    raise AssertionError(f"decode_run refused the record at byte {at}, which _decode takes")


def _decode(build: RecordBuilder[T], view: memoryview, at: int, verify: bool) -> tuple[T, int]:
    if len(view) - at < HEADER_SIZE:
        raise InvalidRecord(f"{len(view) - at} bytes cannot hold a {HEADER_SIZE}-byte header")
    (
        total, magic, crc, flags, cl_off, q_off, store_ts, store_host, queue_id, reconsume,
        born_ts, msg_id, born_host, topic_len, tags_len, keys_len, props_len, body_len,
    ) = HEADER.unpack_from(view, at)  # fmt: skip
    if magic != MAGIC:
        raise InvalidRecord(
            f"unknown record magic {magic:#010x} (this build reads format {FORMAT_VERSION})"
        )
    variable = topic_len + tags_len + keys_len + props_len + body_len
    if total != HEADER_SIZE + variable or at + total > len(view):
        raise InvalidRecord(f"record size {total} disagrees with its field lengths")
    if verify and crc != crc32(view[at + CRC_START : at + total]):
        raise InvalidRecord("record CRC mismatch")
    pos = at + HEADER_SIZE
    topic_end = pos + topic_len
    tags_end = topic_end + tags_len
    keys_end = tags_end + keys_len
    props_end = keys_end + props_len
    try:
        topic = str(view[pos:topic_end], "utf-8")
        tags = str(view[topic_end:tags_end], "utf-8") if tags_len else ""
        keys = str(view[tags_end:keys_end], "utf-8") if keys_len else ""
        properties = decode_properties(bytes(view[keys_end:props_end])) if props_len else {}
    except UnicodeDecodeError as exc:
        raise InvalidRecord(f"a text field of the record is not UTF-8: {exc}") from None
    built = build(
        topic, bytes(view[props_end : at + total]), queue_id, tags,
        tuple(keys.split(_KEY_SEPARATOR)) if keys else (), properties, flags, msg_id,
        born_ts, born_host, reconsume, cl_off, q_off, store_ts, store_host, total,
    )  # fmt: skip
    return built, total


_TOPIC_LEN: Final = header_view("topic_len")


def topic_of(buf: bytes | bytearray | memoryview, at: int = 0) -> str:
    """The topic of the well-formed record at ``buf[at:]``, read from its header without
    decoding the rest (a full decode copies the body)."""
    (length,) = _TOPIC_LEN.unpack_from(buf, at)
    start = at + HEADER_SIZE
    return str(memoryview(buf)[start : start + length], "utf-8")


def tag_code(tags: bytes | str) -> int:
    """The tag hash stored in consume-queue entries; equal tags give equal codes."""
    if isinstance(tags, str):
        tags = tags.encode()
    return crc32(tags) if tags else 0
