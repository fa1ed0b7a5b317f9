"""REPLICA_FETCH over the data plane: one connection from a slave to its master."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket

from metaq.common.errors import ErrorCode, MetaqError
from metaq.common.framing import Buffer, Frame, FrameDecoder, FrameType, encode_frame
from metaq.common.v1.data_pb2 import ErrorResponse, ReplicaFetchRequest, ReplicaFetchResponse


class FetchError(MetaqError):
    """The master answered a fetch with an ERROR frame."""

    retriable = True

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class DataPlaneChannel:
    """Sequential fetches on one connection; a slave needs no more."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._decoder = FrameDecoder()
        self._ids = itertools.count(1)
        self.address = address

    @classmethod
    async def open(cls, address: str, timeout_s: float = 3.0) -> DataPlaneChannel:
        host, _, port = address.rpartition(":")
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer, address)

    async def fetch(self, request: ReplicaFetchRequest) -> tuple[ReplicaFetchResponse, Buffer]:
        request_id = next(self._ids)
        self._writer.writelines(
            encode_frame(FrameType.REPLICA_FETCH, request_id, request.SerializeToString())
        )
        # The master holds a fetch for up to wait_ms; beyond that plus slack it is gone.
        async with asyncio.timeout(request.wait_ms / 1e3 + 5.0):
            while True:
                chunk = await self._reader.read(1 << 20)
                if not chunk:
                    raise ConnectionError(f"master {self.address} closed the connection")
                for frame in self._decoder.feed(chunk):
                    if frame.is_error:
                        error = ErrorResponse.FromString(frame.header)
                        raise FetchError(ErrorCode(error.code), error.message)
                    if frame.type is FrameType.REPLICA_FETCH and frame.request_id == request_id:
                        return ReplicaFetchResponse.FromString(frame.header), frame.payload

    async def request(self, frame_type: FrameType, header: bytes, timeout_s: float) -> Frame:
        """Any other request on this connection, answered before the next one is sent (a
        slave forwarding its consumers' offset commits); an ERROR frame raises FetchError."""
        request_id = next(self._ids)
        self._writer.writelines(encode_frame(frame_type, request_id, header))
        async with asyncio.timeout(timeout_s):
            while True:
                chunk = await self._reader.read(1 << 20)
                if not chunk:
                    raise ConnectionError(f"master {self.address} closed the connection")
                for frame in self._decoder.feed(chunk):
                    if frame.is_error:
                        error = ErrorResponse.FromString(frame.header)
                        raise FetchError(ErrorCode(error.code), error.message)
                    if frame.type is frame_type and frame.request_id == request_id:
                        return frame

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self._writer.wait_closed()
