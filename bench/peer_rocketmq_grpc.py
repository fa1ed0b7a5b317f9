"""RocketMQ 5 from Python: the project's own ``rocketmq-python-client`` (gRPC to the proxy,
which runs in the broker's JVM in local mode: :func:`peer_rocketmq.single`), what a
Python team using RocketMQ 5 publishes with. Its API is synchronous, with
``concurrent.futures`` for asynchronous sends and a thread pool behind the push
consumer; their answers come back to the event loop with ``call_soon_threadsafe``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any, Final

from compare_harness import IN_FLIGHT, EndToEnd, OpenLoop
from metaq_load import Budget
from peer_rocketmq import ASYNC_DURABILITY, QUEUES, RocketmqCluster, run_client
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
)

TOPIC: Final = "BenchPython"
DRAIN_S: Final = 60.0
INDEX_BYTES: Final = 8
"""The open loop's index at the head of every body it sends."""


def _message(topic: str, body: bytes) -> Any:
    message = Message()
    message.topic = topic
    message.body = body
    return message


class _Listener(MessageListener):  # type: ignore[misc]
    """Hands each delivered body to the event loop's open-loop run."""

    def __init__(self, loop: asyncio.AbstractEventLoop, run: OpenLoop) -> None:
        self._loop = loop
        self._run = run

    def consume(self, message: Any) -> Any:
        if len(message.body) >= INDEX_BYTES:  # not the one-byte message that proved the topic
            self._loop.call_soon_threadsafe(self._run.on_message, message.body)
        return ConsumeResult.SUCCESS


class RocketmqPython:
    key = "rocketmq_python"
    label = "RocketMQ 5, Python client (gRPC)"
    durability = ASYNC_DURABILITY
    in_flight_how = f"send_async, ≤ {IN_FLIGHT:,} unanswered, through the gRPC proxy"

    def __init__(self, cluster: RocketmqCluster) -> None:
        assert cluster.grpc_endpoint is not None, "the cluster runs no proxy"
        self.cluster = cluster
        self._config = ClientConfiguration(cluster.grpc_endpoint, Credentials())
        self._producer: Any = None
        self._errors = 0

    async def open(self) -> None:
        await asyncio.to_thread(run_client, self.cluster, "topic", TOPIC, str(QUEUES))
        self._producer = Producer(self._config, (TOPIC,))
        await asyncio.to_thread(self._producer.startup)

    async def close(self) -> None:
        if self._producer is not None:
            await asyncio.to_thread(self._producer.shutdown)

    async def one_at_a_time(self, body: bytes, budget: Budget) -> list[float]:
        # The client's blocking send, as a Python program publishing one at a time calls it.
        latencies: list[float] = []
        clock = time.perf_counter
        while budget.going():
            start = clock()
            self._producer.send(_message(TOPIC, body))
            latencies.append(clock() - start)
            budget.sent += 1
        return latencies

    def _sender(self, window: asyncio.Semaphore) -> Any:
        loop = asyncio.get_running_loop()

        def answered(future: concurrent.futures.Future[Any]) -> None:
            if future.cancelled() or future.exception() is not None:
                self._errors += 1
            loop.call_soon_threadsafe(window.release)

        return answered

    async def in_flight(self, body: bytes, budget: Budget) -> None:
        window = asyncio.Semaphore(IN_FLIGHT)
        answered = self._sender(window)
        while budget.going():
            await window.acquire()
            self._producer.send_async(_message(TOPIC, body)).add_done_callback(answered)
            budget.sent += 1
        async with asyncio.timeout(DRAIN_S):
            for _ in range(IN_FLIGHT):
                await window.acquire()

    async def end_to_end(self, size: int, rate: float, seconds: float) -> EndToEnd:
        # A topic and a consumer group of the cell's own: nothing older to skip first.
        topic, group = f"{TOPIC}E2e{size}", f"bench_e2e_{size}"
        await asyncio.to_thread(run_client, self.cluster, "topic", topic, str(QUEUES))
        await asyncio.to_thread(run_client, self.cluster, "group", group)
        run = OpenLoop(rate, seconds, size)
        consumer = PushConsumer(
            self._config, group, _Listener(asyncio.get_running_loop(), run),
            {topic: FilterExpression()},
        )  # fmt: skip
        await asyncio.to_thread(consumer.startup)
        producer = Producer(self._config, (topic,))
        await asyncio.to_thread(producer.startup)
        window = asyncio.Semaphore(IN_FLIGHT * 10)
        answered = self._sender(window)

        async def send(bodies: list[bytes]) -> None:
            for body in bodies:
                await window.acquire()
                producer.send_async(_message(topic, body)).add_done_callback(answered)

        try:
            return await run.run(send)
        finally:
            await asyncio.to_thread(producer.shutdown)
            await asyncio.to_thread(consumer.shutdown)
