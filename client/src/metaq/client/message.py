"""Messages as applications see them, and the decoding of the records brokers return.

A pull (or a lookup) returns commitlog records exactly as stored. :func:`decode_message`
checks one record's CRC, inflates a body the producer compressed (``FLAG_COMPRESSED``)
and returns a :class:`Message`; :func:`iter_messages` does the same for a run of
records back to back, as a PULL response's payload holds them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

import msgspec

from metaq.common import record

__all__ = [
    "Message",
    "OutgoingMessage",
    "decode_message",
    "decode_messages",
    "host_text",
    "iter_messages",
]


class Message(msgspec.Struct, frozen=True, gc=False):
    """One stored message, body inflated.

    ``msg_id`` is the 16-byte message id in hex (what ``SendResult.msg_id`` and
    ``metaq query id`` use). ``queue_offset`` is the message's position in its consume
    queue; commit ``queue_offset + 1`` once it is processed. Immutable; a changed copy
    is ``msgspec.structs.replace(message, topic=...)``.

    A ``msgspec.Struct`` rather than a dataclass because a consumer builds one per
    message: its sixteen fields are set in C (an order of magnitude faster than a frozen,
    slotted dataclass's), and ``gc=False`` keeps the cyclic collector from tracking
    millions of them (a message refers to strings, bytes, a tuple and a dict, never to
    itself).
    """

    topic: str
    body: bytes
    tags: str = ""
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = msgspec.field(default_factory=dict)
    msg_id: str = ""
    queue_id: int = 0
    queue_offset: int = -1
    commitlog_offset: int = -1
    born_timestamp_ms: int = 0
    store_timestamp_ms: int = 0
    born_host: str = ""
    store_host: str = ""
    reconsume_times: int = 0
    flags: int = 0
    """The record's flags as stored (``FLAG_COMPRESSED`` says the body came compressed)."""
    size: int = 0
    """Bytes the record takes in the commitlog."""

    @property
    def text(self) -> str:
        """The body as UTF-8 text (replacement characters where it is not)."""
        return self.body.decode(errors="replace")


@functools.lru_cache(maxsize=1024)
def host_text(host: bytes) -> str:
    """The 8-byte born/store host of a record (IPv4, port u16 LE, reserved) as ``a.b.c.d:p``.

    Cached: a consumer sees the same few producer and broker hosts on every message."""
    if len(host) != 8 or host == bytes(8):
        return ""
    port = int.from_bytes(host[4:6], "little")
    return f"{host[0]}.{host[1]}.{host[2]}.{host[3]}:{port}"


def _message(
    topic: str, body: bytes, queue_id: int, tags: str, keys: tuple[str, ...],
    properties: dict[str, str], flags: int, msg_id: bytes, born_timestamp_ms: int,
    born_host: bytes, reconsume_times: int, commitlog_offset: int, queue_offset: int,
    store_timestamp_ms: int, store_host: bytes, size: int, /,
) -> Message:  # fmt: skip
    """A record's fields as a Message (a :class:`~metaq.common.record.RecordBuilder`)."""
    if flags & record.FLAG_COMPRESSED:
        body = record.inflate(body, f"message {msg_id.hex()}")
    # Positional, in Message's field order: a consumer builds one per message. A plain
    # dict in front of host_text's cache halves the cost of the two lookups.
    born = _HOSTS.get(born_host)
    if born is None:
        born = _host(born_host)
    store = _HOSTS.get(store_host)
    if store is None:
        store = _host(store_host)
    return Message(
        topic, body, tags, keys, properties, msg_id.hex(), queue_id, queue_offset,
        commitlog_offset, born_timestamp_ms, store_timestamp_ms, born, store,
        reconsume_times, flags, size,
    )  # fmt: skip


_HOSTS: dict[bytes, str] = {}
_MAX_HOSTS: Final = 1024


def _host(host: bytes) -> str:
    text = host_text(host)
    if len(_HOSTS) >= _MAX_HOSTS:  # a consumer sees a few hosts; never grow unbounded
        _HOSTS.clear()
    _HOSTS[host] = text
    return text


def decode_message(
    record_bytes: bytes | bytearray | memoryview, at: int = 0, *, verify: bool = True
) -> Message:
    """Decode the record at ``record_bytes[at:]``: check its CRC (unless ``verify`` is
    off), inflate a compressed body. InvalidRecord when it is damaged."""
    return record.decode_built(_message, record_bytes, at, verify=verify)


def iter_messages(
    payload: bytes | bytearray | memoryview, *, verify: bool = True
) -> Iterator[Message]:
    """Decode records back to back (a PULL response's payload), in order."""
    return iter(decode_messages(payload, verify=verify))


def decode_messages(
    payload: bytes | bytearray | memoryview, *, verify: bool = True
) -> list[Message]:
    """:func:`iter_messages` as a list: the consumer's hot path."""
    return record.decode_run(_message, payload, verify=verify)


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One message of :meth:`Producer.send_batch <metaq.client.producer.Producer.send_batch>`."""

    body: bytes
    tags: str = ""
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] | None = None
