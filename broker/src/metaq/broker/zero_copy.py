"""Answers written from the commitlog's files with ``sendfile``, not from their mapping.

A pull for records the broker just read in from disk (:mod:`metaq.broker.cold_reads`)
would, written from the mapping, fault each of their pages into the broker's address
space on the event loop and copy them into the socket's buffers; ``os.sendfile`` hands
the kernel the file's pages instead. While a group drained a cold backlog that cut the
broker's system time and the real-time group's end-to-end latency. (Warm records gain
nothing by it on loopback: in warm drains it raised the broker's CPU a message; the
figures are in docs/benchmarks.md, ``make bench-accumulation``.) It is used where it
is safe:

- on a plain TCP socket (TLS encrypts in user space, so its records go through it);
- for parts of at least :data:`MIN_BYTES` (a small part goes in the one ``writev``
  with the frame's header);
- only when the transport holds nothing unwritten: bytes written past it must not
  overtake its buffer.

Whatever the socket does not take at once goes through the transport from the mapped
view, which keeps the mapping (and so the file, :class:`~metaq.broker.store.segment.Segment`)
open until it is written.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from metaq.common.framing import Buffer

MIN_BYTES: Final = 16 * 1024


@dataclass(frozen=True, slots=True)
class FileRange:
    """Part of an answer: ``view``'s bytes, which lie in open file ``fd`` at ``offset``."""

    fd: int
    offset: int
    view: memoryview

    def __len__(self) -> int:
        return len(self.view)


Part = Buffer | FileRange


def socket_fd(transport: asyncio.BaseTransport) -> int | None:
    """The descriptor ``sendfile`` may write to: a plain TCP socket's, else None."""
    if transport.get_extra_info("ssl_object") is not None:
        return None
    sock = transport.get_extra_info("socket")
    return None if sock is None else int(sock.fileno())


def write(transport: asyncio.Transport, fd: int | None, parts: Sequence[Part]) -> int:
    """Write ``parts`` in order; return the bytes that went by ``sendfile``."""
    zero_copied = 0
    pending: list[Buffer] = []
    for part in parts:
        if not isinstance(part, FileRange):
            pending.append(part)
            continue
        if pending:
            transport.writelines(pending)
            pending = []
        sent = 0
        if fd is not None and not transport.get_write_buffer_size():
            sent = _sendfile(fd, part)
            zero_copied += sent
        if sent < len(part.view):
            transport.write(part.view[sent:])
    if pending:
        transport.writelines(pending)
    return zero_copied


def _sendfile(fd: int, part: FileRange) -> int:
    """As much of ``part`` as the socket takes now, without blocking on it."""
    sent, size = 0, len(part.view)
    try:
        while sent < size:
            n = os.sendfile(fd, part.fd, part.offset + sent, size - sent)
            if not n:
                break
            sent += n
    except BlockingIOError:
        pass  # the socket's buffer is full: the transport writes the rest when it drains
    except OSError:
        pass  # a broken connection: the transport's own write meets it and closes
    return sent
