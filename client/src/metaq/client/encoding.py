"""Building records on the producer's hot path: byte for byte what ``record.encode`` builds,
at a fraction of the cost (one ``pack`` and one ``join``; topic checked once per topic).

Compression happens here too: a body over the threshold is zlib-compressed and flagged
``FLAG_COMPRESSED`` when that makes it smaller.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Final

from metaq.client.message import OutgoingMessage
from metaq.common import record
from metaq.common.errors import InvalidMessage

_HEADER: Final = record.HEADER
_HEADER_SIZE: Final = record.HEADER_SIZE
_MAGIC: Final = record.MAGIC
_NO_HOST: Final = bytes(8)
_BUFFERS: Final = (bytes, bytearray, memoryview)
QUEUE_ID_AT: Final = record.FIELDS["queue_id"].offset


class RecordEncoder:
    """Encodes producer records; ``encode`` returns immutable bytes ready to send."""

    def __init__(
        self,
        *,
        compress_over_bytes: int = 4096,
        compress_level: int = 5,
        max_message_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.compress_over_bytes = compress_over_bytes
        self.compress_level = compress_level
        self.max_message_bytes = max_message_bytes
        self._topics: dict[str, bytes] = {}

    def topic_bytes(self, topic: str) -> bytes:
        raw = self._topics.get(topic)
        if raw is None:
            record.check_topic(topic)
            raw = self._topics[topic] = topic.encode()
        return raw

    def encode(
        self,
        topic: str,
        body: bytes,
        queue_id: int = 0,
        tags: str = "",
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
    ) -> bytes:
        topic_b = self._topics.get(topic) or self.topic_bytes(topic)
        flags = 0
        size = len(body)
        if size > self.compress_over_bytes:
            packed = zlib.compress(body, self.compress_level)
            if len(packed) < size:
                body, flags, size = packed, record.FLAG_COMPRESSED, len(packed)
        if size > self.max_message_bytes:
            after = " after compression" if flags else ""
            raise InvalidMessage(
                f"message body is {size} bytes{after}; the producer's limit is "
                f"{self.max_message_bytes} bytes (max_message_bytes)"
            )
        if tags or keys or properties:
            tags_b, keys_b, props_b = _extras(tags, keys, properties)
            flags |= _property_flags(properties)
        else:
            tags_b = keys_b = props_b = b""
        header = _HEADER.pack(
            _HEADER_SIZE + len(topic_b) + len(tags_b) + len(keys_b) + len(props_b) + size,
            _MAGIC, 0, flags, -1, -1, 0, _NO_HOST, queue_id, 0,
            time.time_ns() // 1_000_000, _IDS.next(), _NO_HOST,
            len(topic_b), len(tags_b), len(keys_b), len(props_b), size,
        )  # fmt: skip
        return b"".join((header, topic_b, tags_b, keys_b, props_b, body))

    def encode_batch(
        self,
        topic: str,
        messages: Sequence[OutgoingMessage | bytes | bytearray | memoryview],
        queue_id: int,
        *,
        max_records: int,
        max_bytes: int,
    ) -> list[tuple[bytes, int, int]]:
        """Encode messages back to back into as few buffers as the batch limits allow;
        returns (buffer, record count, first message-id number) per batch. One buffer per
        batch means one write and no per-record bookkeeping downstream; the ids of a batch
        are consecutive (see :func:`msg_id_hex`)."""
        topic_b = self._topics.get(topic) or self.topic_bytes(topic)
        topic_len = len(topic_b)
        pack, fixed = _HEADER.pack, _HEADER_SIZE + topic_len
        ids = _IDS
        prefix, first = ids.take(len(messages))
        number = first
        threshold, limit = self.compress_over_bytes, self.max_message_bytes
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
                tags_b, keys_b, props_b = _extras(message.tags, message.keys, message.properties)
                extras = tags_b + keys_b + props_b
                tags_len, keys_len, props_len = len(tags_b), len(keys_b), len(props_b)
                flags = _property_flags(message.properties)
            size = len(body)
            if size > threshold:
                packed = zlib.compress(body, self.compress_level)
                if len(packed) < size:
                    body, flags, size = packed, flags | record.FLAG_COMPRESSED, len(packed)
            if size > limit:
                raise InvalidMessage(
                    f"message {index} of the batch has a body of {size} bytes; the "
                    f"producer's limit is {limit} bytes (max_message_bytes)"
                )
            total = fixed + len(extras) + size
            if count and (count >= max_records or nbytes + total > max_bytes):
                batches.append((b"".join(parts), count, number - count))
                parts = []
                nbytes = count = 0
            parts.append(
                pack(
                    total, _MAGIC, 0, flags, -1, -1, 0, _NO_HOST, queue_id, 0, born,
                    prefix + number.to_bytes(8, "big"),
                    _NO_HOST, topic_len, tags_len, keys_len, props_len, size,
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
            batches.append((b"".join(parts), count, number - count))
        return batches


def _property_flags(properties: Mapping[str, str] | None) -> int:
    """The flags the broker must see without reading properties: delayed, half message."""
    if not properties:
        return 0
    flags = 0
    if record.PROP_DELAY_LEVEL in properties or record.PROP_DELIVER_AT in properties:
        flags |= record.FLAG_DELAYED
    if record.PROP_TRANSACTION in properties:
        flags |= record.FLAG_TRANSACTION
    return flags


class _MessageIds:
    """Process-unique 16-byte message ids: 8 random bytes, then a 64-bit big-endian
    counter — the layout of ``record.new_msg_id``, with blocks of consecutive ids for
    batches, so a batch's ids need not be read back from the broker's answer."""

    def __init__(self) -> None:
        self._reseed()
        os.register_at_fork(after_in_child=self._reseed)

    def _reseed(self) -> None:
        self.prefix = os.urandom(8)
        self.prefix_hex = self.prefix.hex()
        self._next = 0

    def next(self) -> bytes:
        number = self._next
        self._next = number + 1
        return self.prefix + number.to_bytes(8, "big")

    def take(self, count: int) -> tuple[bytes, int]:
        """Reserve ``count`` consecutive ids: (prefix, first number)."""
        first = self._next
        self._next = first + count
        return self.prefix, first


_IDS: Final = _MessageIds()


def msg_id_hex(number: int) -> str:
    """The hex message id of id number ``number`` of this process (see encode_batch)."""
    return f"{_IDS.prefix_hex}{number:016x}"


def msg_id_prefix_hex() -> str:
    return _IDS.prefix_hex


def _extras(
    tags: str, keys: Sequence[str], properties: Mapping[str, str] | None
) -> tuple[bytes, bytes, bytes]:
    """Tags, keys and properties as record bytes, checked as ``record.encode`` checks them."""
    try:
        tags_b = tags.encode()
        if len(tags_b) > record.MAX_TAGS_BYTES:
            raise InvalidMessage(
                f"tags are {len(tags_b)} bytes; the limit is {record.MAX_TAGS_BYTES}"
            )
        if isinstance(keys, str):
            raise InvalidMessage(f"keys must be a sequence of strings, not the string {keys!r}")
        for key in keys:
            if not key or " " in key:
                raise InvalidMessage(f"message key {key!r} is empty or contains a space")
        keys_b = " ".join(keys).encode()
    except UnicodeEncodeError as exc:
        raise InvalidMessage(f"tags or keys cannot be encoded as UTF-8: {exc.reason}") from None
    if len(keys_b) > record.MAX_KEYS_BYTES:
        raise InvalidMessage(f"keys are {len(keys_b)} bytes; the limit is {record.MAX_KEYS_BYTES}")
    props_b = record.encode_properties(properties) if properties else b""
    if len(props_b) > 0xFFFF:
        raise InvalidMessage(f"properties are {len(props_b)} bytes; the limit is 65535")
    return tags_b, keys_b, props_b


def with_queue_id(records: bytes | bytearray | memoryview, queue_id: int) -> bytearray:
    """A copy of ``records`` (one record or several back to back) aimed at another queue,
    for a retry elsewhere."""
    out = bytearray(records)
    raw = queue_id.to_bytes(4, "little", signed=True)
    at = 0
    while at + _HEADER_SIZE <= len(out):
        out[at + QUEUE_ID_AT : at + QUEUE_ID_AT + 4] = raw
        size = int.from_bytes(out[at : at + 4], "little")
        if size < _HEADER_SIZE:
            raise ValueError(f"not a record at byte {at}: size field {size}")
        at += size
    return out
