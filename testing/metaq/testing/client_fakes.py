"""In-process stand-ins for client unit tests: a scriptable broker on a real loopback
socket, and a fixed route table in place of the nameservers.

:class:`FakeBroker` speaks the real framing (``metaq.common.framing``) and answers SEND
requests as a broker would (offsets counted per queue), unless its ``script`` says
otherwise for a request: answer with an ERROR frame, stay silent, or drop the connection.
It records every request it got, so a test can check where sends went.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from metaq.client.errors import UnknownTopic
from metaq.common import record
from metaq.common.errors import ErrorCode, ProtocolError
from metaq.common.framing import Frame, FrameDecoder, FrameType, encode_error, encode_frame
from metaq.common.model import BrokerAddress, GroupRoute, Permission, Role, TopicRoute
from metaq.common.v1.data_pb2 import SendRequest, SendResponse


@dataclass(frozen=True)
class Fail:
    """Answer with an ERROR frame."""

    code: ErrorCode
    message: str = "scripted failure"
    retriable: bool = True


@dataclass(frozen=True)
class Silence:
    """Do not answer at all (the client's timeout fires)."""


@dataclass(frozen=True)
class Drop:
    """Close the connection without answering."""


Action = Fail | Silence | Drop | None
"""None: answer normally."""


@dataclass
class SendSeen:
    """One SEND request as the fake broker received it."""

    topic: str
    queue_id: int
    records: list[record.Record]
    one_way: bool
    retry: bool = False
    """Flagged as a retry: the broker stores only the message ids it lacks."""


@dataclass
class FakeBroker:
    """A broker group's master on 127.0.0.1; :meth:`start` binds it."""

    name: str
    script: Callable[[SendSeen], Action] = field(default=lambda _seen: None)
    sends: list[SendSeen] = field(default_factory=list)
    address: str = ""
    _server: asyncio.Server | None = None
    _transports: list[asyncio.Transport] = field(default_factory=list)
    _offsets: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    _commitlog: int = 0
    silenced: list[tuple[asyncio.Transport, Frame, SendSeen]] = field(default_factory=list)
    """Requests a :class:`Silence` left unanswered, for :meth:`answer_silenced`."""

    async def start(self) -> FakeBroker:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Protocol(self), "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        """Close the listener and every connection (as a killed broker would)."""
        if self._server is not None:
            self._server.close()
            for transport in self._transports:
                transport.abort()
            await self._server.wait_closed()
            self._server = None

    def answer_silenced(self) -> None:
        """Answer every request left silent so far, late (after the client gave up)."""
        held, self.silenced = self.silenced, []
        for transport, frame, seen in held:
            header = self.answer(seen).SerializeToString()
            transport.writelines(encode_frame(FrameType.SEND, frame.request_id, header, b"", 0x1))

    def records(self) -> list[record.Record]:
        return [r for seen in self.sends for r in seen.records]

    def answer(self, seen: SendSeen) -> SendResponse:
        response = SendResponse(status=SendResponse.OK, store_timestamp_ms=1)
        for rec in seen.records:
            key = (seen.topic, seen.queue_id)
            response.queue_offsets.append(self._offsets[key])
            self._offsets[key] += 1
            response.commitlog_offsets.append(self._commitlog)
            self._commitlog += rec.size
            response.msg_ids.append(rec.msg_id)
        return response


class _Protocol(asyncio.Protocol):
    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.decoder = FrameDecoder()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.broker._transports.append(self.transport)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data)
        except ProtocolError:
            # Bytes that are not frames (a client's TLS probe after a Drop, say): closed,
            # as a real broker closes such a connection.
            assert self.transport is not None
            self.transport.abort()
            return
        for frame in frames:
            self.handle(frame)

    def handle(self, frame: Frame) -> None:
        assert self.transport is not None
        if frame.type is not FrameType.SEND:
            self.transport.writelines(encode_frame(frame.type, frame.request_id, b"", b"", 0x1))
            return
        request = SendRequest.FromString(frame.header)
        records = list(record.iter_records(frame.payload, verify=False))
        retry = bool(request.flags & SendRequest.FLAG_RETRY)
        seen = SendSeen(request.topic, request.queue_id, records, frame.is_one_way, retry)
        self.broker.sends.append(seen)
        action = self.broker.script(seen)
        if frame.is_one_way:
            return
        if isinstance(action, Silence):
            self.broker.silenced.append((self.transport, frame, seen))
            return
        if isinstance(action, Drop):
            self.transport.abort()
            return
        if isinstance(action, Fail):
            self.transport.writelines(
                encode_error(
                    action.code,
                    action.message,
                    request_id=frame.request_id,
                    frame_type=FrameType.SEND,
                    retriable=action.retriable,
                )
            )
            return
        response = self.broker.answer(seen)
        self.transport.writelines(
            encode_frame(FrameType.SEND, frame.request_id, response.SerializeToString(), b"", 0x1)
        )


class StaticRoutes:
    """A RouteCache stand-in with fixed routes: topic → broker groups' write queues."""

    def __init__(self, routes: dict[str, Sequence[tuple[str, str, int]]]) -> None:
        """``routes``: topic → [(broker name, address, queue count), ...]."""
        self._routes = {topic: static_route(topic, groups) for topic, groups in routes.items()}
        self._stale: set[str] = set()
        self.fetches = 0
        self.expected: list[tuple[str, str, str]] = []
        self._cached_only: dict[str, TopicRoute] = {}

    def cached(self, topic: str) -> TopicRoute | None:
        if topic in self._cached_only:
            return self._cached_only[topic]
        return None if topic in self._stale else self._routes.get(topic)

    def cache_until_fetched(self, topic: str, groups: Sequence[tuple[str, str, int]]) -> None:
        """What ``cached`` answers until the next ``route`` call: a route cached in the
        past (mid-failover, say) while the nameservers already route another."""
        self._cached_only[topic] = static_route(topic, groups)

    async def route(
        self, topic: str, *, refresh: bool = False, max_age_s: float | None = None
    ) -> TopicRoute:
        self.fetches += 1
        self._stale.discard(topic)
        self._cached_only.pop(topic, None)
        found = self._routes.get(topic)
        if found is None:
            raise UnknownTopic(topic, "not in the static routes")
        return found

    def set(self, topic: str, groups: Sequence[tuple[str, str, int]]) -> None:
        self._routes[topic] = static_route(topic, groups)

    def invalidate(self, topic: str) -> None:
        """As RouteCache: the next send fetches the route (``fetches`` counts it)."""
        self._stale.add(topic)

    def expect_change(self, topic: str, broker_name: str, master_address: str) -> None:
        """As RouteCache would poll for a successor; noted in ``expected``."""
        self.expected.append((topic, broker_name, master_address))

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


def static_route(topic: str, groups: Sequence[tuple[str, str, int]]) -> TopicRoute:
    """A route of one broker per group; an empty address is a group without a master."""
    return TopicRoute(
        topic,
        tuple(
            GroupRoute(
                cluster="test",
                broker_name=name,
                epoch=0,
                computer_room="room",
                brokers=(
                    BrokerAddress(0, Role.MASTER if address else Role.SLAVE, address, "", "room"),
                ),
                read_queues=count,
                write_queues=count,
                permission=Permission.READ_WRITE,
                ordered=False,
            )
            for name, address, count in groups
        ),
    )


async def stop_all(brokers: Sequence[FakeBroker]) -> None:
    for broker in brokers:
        with contextlib.suppress(Exception):
            await broker.stop()
