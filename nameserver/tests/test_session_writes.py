"""A Session stream's answers and unasked news go out one write at a time, in order, and
none is lost: gRPC allows one write in flight per stream, and a broker that never gets
the answer to a heartbeat gives up on the session (its master lease with it)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from metaq.broker.registration import BrokerDescription, FixedTopics, heartbeat
from metaq.common.model import BrokerKey, BrokerState, GroupControl, Role, TopicConfig
from metaq.common.server_names import ServerNames
from metaq.common.v1 import control_pb2 as pb
from metaq.nameserver.controller import Controller, ControllerSettings
from metaq.nameserver.registry import Registry
from metaq.nameserver.service import NameServerService
from metaq.nameserver.user_auth import UserCalls


class StreamContext:
    """A Session's server side: heartbeats read from a queue; writes recorded, each
    taking a turn of the loop as a real one does, and refused while another is in flight
    (grpc.aio's rule)."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue[Any] = asyncio.Queue()
        self.written: list[pb.SessionEvent] = []
        self.overlapped = 0
        self._in_flight = False

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    async def read(self) -> Any:
        return await self.incoming.get()

    async def write(self, message: pb.SessionEvent) -> None:
        if self._in_flight:
            self.overlapped += 1
            raise grpc.aio.UsageError("a write is already in flight on this stream")
        self._in_flight = True
        try:
            await asyncio.sleep(0)
            self.written.append(message)
        finally:
            self._in_flight = False

    async def abort(self, code: object, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


def test_news_pushed_as_a_heartbeat_arrives_goes_first_and_its_answer_is_not_lost() -> None:
    async def scenario() -> StreamContext:
        registry = Registry(10.0)
        service = NameServerService(
            registry, Controller(registry, ControllerSettings()), None,
            UserCalls(None, None, ServerNames(())),
        )  # fmt: skip
        context = StreamContext()
        state = BrokerState("c1", BrokerKey("broker-a", 1), Role.SLAVE, "127.0.0.1:9001",
                            controlled=True)  # fmt: skip
        description = BrokerDescription(state, FixedTopics((TopicConfig("orders", 4, 4),)))
        session = asyncio.create_task(service.Session(iter(()), context))  # type: ignore[arg-type]

        first = heartbeat(description, with_topics=True)
        first.sequence = 1
        await context.incoming.put(first)
        while len(context.written) < 1:
            await asyncio.sleep(0)

        # The second heartbeat arrives, and the controller's news for the group is
        # pushed before the session has run again: the session takes the heartbeat
        # first, while the news' flush has not started yet.
        second = heartbeat(description, with_topics=False)
        second.sequence = 2
        context.incoming.put_nowait(second)
        service._push(GroupControl("broker-a", 2, 1, (1,)))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while len(context.written) < 3 and not session.done() and loop.time() < deadline:
            await asyncio.sleep(0.001)
        context.incoming.put_nowait(None)  # the broker closes its side
        async with asyncio.timeout(10):
            await session
        return context

    context = asyncio.run(scenario())
    assert context.overlapped == 0
    assert [e.answers for e in context.written] == [1, 0, 2]
    assert context.written[1].registered.control.master_id == 1
