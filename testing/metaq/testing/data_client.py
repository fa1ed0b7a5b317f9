"""A minimal data-plane client for tests and benchmarks: pipelined requests over one
connection, answers matched by request id.

Not the producer or consumer (``metaq.client`` builds those): no routing, retries or
batching policy. Requests written during one loop turn go out in one ``writelines``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import NamedTuple, cast

from google.protobuf.message import Message

from metaq.common.errors import ErrorCode, MetaqError
from metaq.common.framing import (
    FLAG_ONE_WAY,
    Buffer,
    Frame,
    FrameDecoder,
    FrameType,
    encode_frame,
)
from metaq.common.record import Record, iter_records
from metaq.common.v1.data_pb2 import (
    CommitOffsetRequest,
    ConsumerHeartbeatRequest,
    ConsumerHeartbeatResponse,
    ErrorResponse,
    PullRequest,
    PullResponse,
    QueryOffsetRequest,
    QueryOffsetResponse,
    QueueOffset,
    SendRequest,
    SendResponse,
)


class BrokerError(MetaqError):
    """The broker answered with an ERROR frame."""

    def __init__(self, code: ErrorCode, message: str, retriable: bool, frame_type: FrameType):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.retriable = retriable
        self.frame_type = frame_type
        self.detail = message


class Reply(NamedTuple):
    header: bytes
    payload: bytes


class DataClient(asyncio.Protocol):
    """One connection to a broker's data port."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._decoder = FrameDecoder()
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._ids = itertools.count(1)
        self._out: list[Buffer] = []
        self._flush_scheduled = False
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self.connection_error: BrokerError | None = None
        """The CONNECTION error frame the broker sent before closing, if any."""

    @classmethod
    async def connect(cls, host: str, port: int) -> DataClient:
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(cls, host, port)
        return protocol

    # --- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        for frame in self._decoder.feed(data):
            self._deliver(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        reason = self.connection_error or ConnectionError(f"connection closed: {exc}")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(reason)
        self._pending.clear()
        if not self.closed.done():
            self.closed.set_result(None)

    def _deliver(self, frame: Frame) -> None:
        if frame.is_error:
            error = ErrorResponse.FromString(frame.header)
            exc = BrokerError(ErrorCode(error.code), error.message, error.retriable, frame.type)
            if frame.type is FrameType.CONNECTION:
                self.connection_error = exc
                return
            future = self._pending.pop(frame.request_id, None)
            if future is not None and not future.done():
                future.set_exception(exc)
            return
        future = self._pending.pop(frame.request_id, None)
        if future is not None and not future.done():
            future.set_result(Reply(frame.header, bytes(frame.payload)))

    # --- requests ---------------------------------------------------------------------

    def request(
        self,
        frame_type: FrameType,
        header: Message | bytes = b"",
        payload: Buffer | Sequence[Buffer] = b"",
        *,
        one_way: bool = False,
    ) -> asyncio.Future[Reply]:
        """Queue a request; the future resolves with the answer (or raises BrokerError)."""
        raw = header if isinstance(header, bytes) else header.SerializeToString()
        request_id = next(self._ids) & 0xFFFFFFFF or next(self._ids)
        future: asyncio.Future[Reply] = self._loop.create_future()
        if self._transport is None:
            future.set_exception(ConnectionError("not connected"))
            return future
        self._out += encode_frame(
            frame_type, request_id, raw, payload, FLAG_ONE_WAY if one_way else 0
        )
        if one_way:
            future.set_result(Reply(b"", b""))
        else:
            self._pending[request_id] = future
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return future

    def write_raw(self, data: bytes) -> None:
        """Put arbitrary bytes on the wire (for tests of broken peers)."""
        assert self._transport is not None
        self._transport.write(data)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self._transport is not None:
            out, self._out = self._out, []
            self._transport.writelines(out)

    async def send(
        self,
        topic: str,
        queue_id: int,
        records: Sequence[Buffer],
        *,
        flags: int = 0,
    ) -> SendResponse:
        request = SendRequest(
            topic=topic, queue_id=queue_id, record_count=len(records), flags=flags
        )
        reply = await self.request(FrameType.SEND, request, records)
        return SendResponse.FromString(reply.header)

    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        group: str = "test-group",
        max_messages: int = 32,
        long_poll_timeout_ms: int = 0,
        commit_offset: int | None = None,
        tag_codes: Sequence[int] = (),
    ) -> tuple[PullResponse, bytes]:
        request = PullRequest(
            consumer_group=group,
            topic=topic,
            queue_id=queue_id,
            offset=offset,
            max_messages=max_messages,
            long_poll_timeout_ms=long_poll_timeout_ms,
            tag_codes=tag_codes,
        )
        if commit_offset is not None:
            request.commit_offset = commit_offset
        reply = await self.request(FrameType.PULL, request)
        return PullResponse.FromString(reply.header), reply.payload

    async def read_queue(self, topic: str, queue_id: int) -> list[Record]:
        """Every record of the queue, pulled from its first offset to its end."""
        records: list[Record] = []
        offset = 0
        while True:
            response, payload = await self.pull(topic, queue_id, offset, max_messages=256)
            if response.status != PullResponse.FOUND:
                return records
            records += iter_records(payload)
            offset = response.next_offset

    async def commit(self, group: str, offsets: Sequence[tuple[str, int, int]]) -> None:
        request = CommitOffsetRequest(
            consumer_group=group,
            offsets=[QueueOffset(topic=t, queue_id=q, offset=o) for t, q, o in offsets],
        )
        await self.request(FrameType.COMMIT_OFFSET, request)

    async def query_offset(
        self, topic: str, queue_id: int, *, group: str = "", timestamp_ms: int | None = None
    ) -> QueryOffsetResponse:
        request = QueryOffsetRequest(consumer_group=group, topic=topic, queue_id=queue_id)
        if timestamp_ms is not None:
            request.timestamp_ms = timestamp_ms
        reply = await self.request(FrameType.QUERY_OFFSET, request)
        return QueryOffsetResponse.FromString(reply.header)

    async def consumer_heartbeat(
        self,
        group: str,
        client_id: str,
        *,
        computer_room: str = "room-a",
        topics: Sequence[str] = (),
        leaving: bool = False,
    ) -> ConsumerHeartbeatResponse:
        request = ConsumerHeartbeatRequest(
            consumer_group=group,
            client_id=client_id,
            computer_room=computer_room,
            mode=ConsumerHeartbeatRequest.CLUSTERING,
            leaving=leaving,
        )
        for topic in topics:
            request.subscriptions.add(topic=topic, tag_expression="*")
        reply = await self.request(FrameType.CONSUMER_HEARTBEAT, request)
        return ConsumerHeartbeatResponse.FromString(reply.header)

    async def heartbeat(self) -> None:
        await self.request(FrameType.HEARTBEAT)

    async def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()
        await self.closed
