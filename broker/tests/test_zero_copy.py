"""Answers with parts sent from files: in order, by sendfile only when nothing waits
ahead of them in the transport, and never on a TLS connection."""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import uvloop

from metaq.broker import zero_copy
from metaq.broker.zero_copy import FileRange

CONTENT = bytes(range(256)) * 1024  # 256 KiB


class _Collect(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.transport: asyncio.Transport | None = None
        self.grew = asyncio.Event()
        self.made = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.made.set()

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.grew.set()

    async def until(self, size: int) -> bytes:
        async with asyncio.timeout(10):
            while len(self.data) < size:
                self.grew.clear()
                await self.grew.wait()
        return bytes(self.data)


@asynccontextmanager
async def _pair() -> AsyncIterator[tuple[asyncio.Transport, _Collect]]:
    loop = asyncio.get_running_loop()
    received = _Collect()
    server = await loop.create_server(lambda: received, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
    try:
        await asyncio.wait_for(received.made.wait(), 10)
        yield transport, received  # type: ignore[misc]
    finally:
        transport.close()
        server.close()


@contextmanager
def _mapped_file(tmp_path: Path) -> Iterator[tuple[int, memoryview]]:
    path = tmp_path / "segment"
    path.write_bytes(CONTENT)
    fd = os.open(path, os.O_RDONLY)
    mm = mmap.mmap(fd, len(CONTENT), prot=mmap.PROT_READ)
    view = memoryview(mm)
    try:
        yield fd, view
    finally:
        view.release()
        # The transport lets go of a slice it wrote in a later turn of its loop; the
        # mapping is then closed by its collection.
        with contextlib.suppress(BufferError):
            mm.close()
        os.close(fd)


def test_file_parts_go_by_sendfile_between_the_buffers_in_order(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, bytes]:
        async with _pair() as (transport, received):
            with _mapped_file(tmp_path) as (fd, view):
                part = FileRange(fd, 1000, view[1000:200_000])
                parts: list[zero_copy.Part] = [b"head", part, b"tail"]
                sent = zero_copy.write(transport, zero_copy.socket_fd(transport), parts)
                data = await received.until(4 + len(part) + 4)
                part.view.release()
                return sent, data

    sent, data = uvloop.run(scenario())

    assert sent == 199_000
    assert data == b"head" + CONTENT[1000:200_000] + b"tail"


class _Holding:
    """A transport that says it still holds unwritten bytes (as one does while its
    socket is full), writing through the real one."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def get_write_buffer_size(self) -> int:
        return 1

    def write(self, data: Any) -> None:
        self.transport.write(data)

    def writelines(self, data: Any) -> None:
        self.transport.writelines(data)


def test_a_file_part_never_overtakes_what_the_transport_still_holds(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, bytes]:
        async with _pair() as (transport, received):
            with _mapped_file(tmp_path) as (fd, view):
                part = FileRange(fd, 0, view[:100_000])
                holding = _Holding(transport)
                sent = zero_copy.write(holding, zero_copy.socket_fd(transport), [b"h", part])  # type: ignore[arg-type]
                data = await received.until(1 + len(part))
                part.view.release()
                return sent, data

    sent, data = uvloop.run(scenario())

    assert sent == 0
    assert data == b"h" + CONTENT[:100_000]


class _Transport:
    def __init__(self, **extra: Any) -> None:
        self.extra = extra

    def get_extra_info(self, name: str) -> Any:
        return self.extra.get(name)


def test_a_tls_connection_never_gets_a_descriptor_to_sendfile_to() -> None:
    class _Socket:
        def fileno(self) -> int:
            return 7

    plain = _Transport(socket=_Socket())
    tls = _Transport(socket=_Socket(), ssl_object=object())

    assert zero_copy.socket_fd(plain) == 7  # type: ignore[arg-type]
    assert zero_copy.socket_fd(tls) is None  # type: ignore[arg-type]
