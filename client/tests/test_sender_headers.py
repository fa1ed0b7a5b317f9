"""The SEND headers the sender writes: reused for a repeated batch shape, never for
another queue, count or retry."""

from __future__ import annotations

import asyncio
from typing import Any

from metaq.client.accumulator import Batch
from metaq.client.selection import BrokerHealth
from metaq.client.sender import Sender
from metaq.common.model import QueueRoute
from metaq.common.v1.data_pb2 import SendRequest

Q0 = QueueRoute("broker-a", "127.0.0.1:1", 0, "r1")
Q1 = QueueRoute("broker-a", "127.0.0.1:1", 1, "r1")


def batch(queue: QueueRoute, count: int, *, retry: bool = False) -> Batch:
    made = Batch("orders", queue, 0.0)
    made.count = count
    made.retry = retry
    return made


def test_each_batch_shape_gets_its_own_header() -> None:
    async def scenario() -> list[Any]:
        pool: Any = None
        sender = Sender(None, pool, BrokerHealth(), producer_group="g", timeout_s=1.0)  # type: ignore[arg-type]
        shapes = [batch(Q0, 1), batch(Q0, 1), batch(Q0, 3), batch(Q1, 1), batch(Q0, 1, retry=True)]
        return [SendRequest.FromString(sender._header(b)) for b in shapes]

    first, again, three, other_queue, retried = asyncio.run(scenario())

    assert first == again
    assert (first.topic, first.queue_id, first.record_count, first.producer_group) == (
        "orders",
        0,
        1,
        "g",
    )
    assert three.record_count == 3
    assert other_queue.queue_id == 1
    assert retried.flags & SendRequest.FLAG_RETRY and not first.flags & SendRequest.FLAG_RETRY
