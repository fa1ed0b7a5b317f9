"""CONSUMER_IDS_CHANGED notices: who gets them, and how they are coalesced."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from metaq.broker.consumers import ConsumerGroups
from metaq.broker.member_notices import MemberChangeNotices
from metaq.common.framing import Buffer, FrameDecoder, FrameType
from metaq.common.v1.data_pb2 import ConsumerIdsChangedNotice
from metaq.testing.waiting import wait_until_async


class FakeResponder:
    def __init__(self, connection_id: int) -> None:
        self.connection_id = connection_id
        self.peer = "127.0.0.1:1"
        self.closed = False
        self.told: list[float] = []
        """Loop time of each notice."""

    def respond(self, parts: list[Buffer]) -> None:
        (frame,) = FrameDecoder(1 << 20).feed(b"".join(bytes(p) for p in parts))
        assert frame.type is FrameType.CONSUMER_IDS_CHANGED and frame.is_one_way
        assert ConsumerIdsChangedNotice.FromString(frame.header).consumer_group == "g"
        self.told.append(asyncio.get_running_loop().time())


async def until(predicate: Callable[[], bool], what: str) -> None:
    await wait_until_async(_now(predicate), 2, what)


def _now(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return predicate()

    return check


def test_members_that_asked_are_told_once_per_window_and_the_joiner_is_not() -> None:
    async def scenario() -> None:
        groups = ConsumerGroups(timeout_s=30)
        notices = MemberChangeNotices(groups, window_s=0.2)
        a, b, old, joiner = (FakeResponder(n) for n in (1, 2, 3, 4))
        for responder in (a, b, joiner):
            notices.listen(responder)
        groups.heartbeat("g", "a", connection_id=1)
        groups.heartbeat("g", "b", connection_id=2)
        groups.heartbeat("g", "old", connection_id=3)  # never asked for notices
        await until(lambda: len(a.told) == len(b.told) == 1, "a and b were told")

        groups.heartbeat("g", "joiner", connection_id=4)
        await until(lambda: len(a.told) == 2, "the change within the window was told")
        assert a.told[1] - a.told[0] >= 0.2 - 0.01, "two notices within one window"
        assert len(b.told) == 2
        assert joiner.told == [], "the member whose heartbeat changed the group knows"
        assert old.told == []

        groups.drop_connection(2)
        notices.connection_lost(2)
        await until(lambda: len(a.told) == 3, "a was told b's connection closed")
        assert (len(joiner.told), len(b.told), notices.sent) == (1, 2, 6)
        notices.close()

    asyncio.run(scenario())


def test_a_join_that_told_no_one_does_not_hold_back_the_next_notice() -> None:
    async def scenario() -> None:
        groups = ConsumerGroups(timeout_s=30)
        notices = MemberChangeNotices(groups, window_s=30)
        first = FakeResponder(1)
        notices.listen(first)
        groups.heartbeat("g", "first", connection_id=1)
        await until(lambda: "g" not in notices._scheduled, "the first join's turn passed")
        assert first.told == []

        groups.heartbeat("g", "second", connection_id=2)
        # Far within the 30 s window: no notice was written, so none was open.
        await until(lambda: len(first.told) == 1, "the first member was told at once")
        notices.close()

    asyncio.run(scenario())
