"""Reading back what the producer tests sent: every message of a broker's queues, once
the broker has dispatched them (their cluster is a :class:`metaq.testing.ClusterBuilder`'s)."""

from __future__ import annotations

import asyncio
import time

from metaq.client.message import Message, iter_messages
from metaq.testing.broker_process import BrokerProcess
from metaq.testing.data_client import DataClient
from metaq.testing.waiting import deadline


async def read_queue(broker: BrokerProcess, topic: str, queue_id: int) -> list[Message]:
    """Every message of one queue of one broker, in offset order."""
    client = await DataClient.connect(broker.data_host, broker.data_port)
    messages: list[Message] = []
    try:
        offset = 0
        while True:
            response, payload = await client.pull(topic, queue_id, offset, max_messages=1024)
            if not response.record_count:
                return messages
            messages += iter_messages(payload)
            offset = response.next_offset
    finally:
        await client.close()


async def read_until(
    broker: BrokerProcess, topic: str, queues: int, count: int, *, timeout_s: float = 10.0
) -> list[Message]:
    """Every message of the topic's first ``queues`` queues on the broker, once at least
    ``count`` are readable (the broker dispatches to its queues after acknowledging)."""
    give_up = time.monotonic() + deadline(timeout_s)
    while True:
        messages = [m for q in range(queues) for m in await read_queue(broker, topic, q)]
        if len(messages) >= count:
            return messages
        if time.monotonic() > give_up:
            raise AssertionError(
                f"only {len(messages)} of {count} messages of {topic} became readable"
            )
        await asyncio.sleep(0.01)  # poll interval of a deadline-bound wait
