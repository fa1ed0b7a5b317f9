"""A frame the connection cannot write fails its batch's send instead of hanging it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from metaq.client.accumulator import Accumulator, Batch
from metaq.client.selection import BrokerHealth
from metaq.client.sender import Sender
from metaq.common.model import QueueRoute

QUEUE = QueueRoute("broker-a", "127.0.0.1:1", 0, "r1")


class UnwritableConnection:
    """Stands in for a broker connection whose frame encoding raises (as signing a
    buffer of the wrong type did)."""

    closed = False

    def request_callback(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a bytes-like object of unsigned bytes is required")

    def send_oneway(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a bytes-like object of unsigned bytes is required")

    def flush(self) -> None:
        pass


class Pool:
    """Hands out the connection at once (``peek``) or only after a connect (``get``)."""

    def __init__(self, *, connected: bool) -> None:
        self.connected = connected

    def peek(self, address: str) -> UnwritableConnection | None:
        return UnwritableConnection() if self.connected else None

    async def get(self, address: str) -> UnwritableConnection:
        return UnwritableConnection()

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("connected", [True, False], ids=["open-connection", "after-connect"])
def test_an_unwritable_frame_fails_the_send(connected: bool) -> None:
    async def scenario() -> BaseException | None:
        pool: Any = Pool(connected=connected)
        sender = Sender(Accumulator(), pool, BrokerHealth(), producer_group="g", timeout_s=5.0)
        future = sender.submit(Batch.whole("orders", QUEUE, [b"record"], 1, 0.0))
        async with asyncio.timeout(10):
            done = await asyncio.wait((future,))
        return next(iter(done[0])).exception()

    error = asyncio.run(scenario())

    assert isinstance(error, TypeError)
