"""RabbitMQ two ways: a stream through the stream protocol (rstream, publish confirms)
and a quorum queue through AMQP 0-9-1 (aio-pika, publisher confirms); each of one replica
on one node, or of three on a three-node cluster (``*R3``), where a confirm comes once a
majority of the replicas hold the message."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from typing import Any, Final

import aio_pika
from compare_harness import IN_FLIGHT, EndToEnd, OpenLoop, windowed
from metaq_load import Budget
from rstream import Consumer as StreamConsumer
from rstream import ConsumerOffsetSpecification, OffsetType
from rstream import Producer as StreamProducer

USER: Final = "guest"
WINDOWS: Final = 4


async def send_confirmed(producer: StreamProducer, stream: str, body: bytes, count: int) -> None:
    """``count`` copies of ``body`` in one batch, returning once the stream confirmed all:
    ``send_batch`` itself returns as soon as the frame is written."""
    confirmed = asyncio.get_running_loop().create_future()
    left = count

    def on_confirm(_status: Any) -> None:
        nonlocal left
        left -= 1
        if left == 0 and not confirmed.done():
            confirmed.set_result(None)

    await producer.send_batch(stream, [body] * count, on_publish_confirm=on_confirm)
    await confirmed


class RabbitStream:
    key = "rabbitmq_stream"
    label = "RabbitMQ stream"
    durability = (
        "segment files, 1 replica: confirmed once written to the stream's file "
        "(page cache); no fsync before the confirm"
    )
    in_flight_how = f"{WINDOWS} callers × send_batch of {IN_FLIGHT // WINDOWS}, awaiting confirms"

    replicas = 1

    def __init__(self, port: int) -> None:
        self.port = port
        self._producer: Any = None
        self._names = (f"bench-{n}" for n in itertools.count())

    async def open(self) -> None:
        self._producer = StreamProducer("127.0.0.1", self.port, username=USER, password=USER)
        await self._producer.start()

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.close()

    @contextlib.asynccontextmanager
    async def _stream(self) -> Any:
        """A fresh stream per cell, deleted after it: the disk fills up otherwise."""
        name = next(self._names)
        await self._producer.create_stream(
            name, arguments={"x-initial-cluster-size": self.replicas}, exists_ok=True
        )
        try:
            yield name
        finally:
            await self._producer.delete_stream(name, missing_ok=True)

    async def one_at_a_time(self, body: bytes, budget: Budget) -> list[float]:
        latencies: list[float] = []
        clock = time.perf_counter
        async with self._stream() as stream:
            while budget.going():
                start = clock()
                await self._producer.send_wait(stream, body)
                latencies.append(clock() - start)
                budget.sent += 1
        return latencies

    async def in_flight(self, body: bytes, budget: Budget) -> None:
        async with self._stream() as stream:

            async def send(count: int) -> None:
                await send_confirmed(self._producer, stream, body, count)

            await windowed(budget, send, IN_FLIGHT // WINDOWS, WINDOWS)

    async def end_to_end(self, size: int, rate: float, seconds: float) -> EndToEnd:
        run = OpenLoop(rate, seconds, size)
        consumer = StreamConsumer("127.0.0.1", self.port, username=USER, password=USER)
        async with self._stream() as stream:

            def handle(message: Any, _context: Any) -> None:
                run.on_message(bytes(message))

            await consumer.start()
            try:
                await consumer.subscribe(
                    stream,
                    handle,
                    offset_specification=ConsumerOffsetSpecification(OffsetType.NEXT, None),
                )

                async def send(bodies: list[bytes]) -> None:
                    # send_batch returns once the frame is written; confirms come later.
                    await self._producer.send_batch(stream, bodies)

                return await run.run(send)
            finally:
                await consumer.close()


class RabbitQuorum:
    key = "rabbitmq_quorum"
    label = "RabbitMQ quorum queue"
    durability = (
        "quorum queue, 1 replica: confirmed once its write-ahead log is fsynced "
        "(persistent messages)"
    )
    in_flight_how = f"{IN_FLIGHT:,} concurrent publishes, each awaiting its confirm"

    replicas = 1

    def __init__(self, port: int) -> None:
        self.url = f"amqp://{USER}:{USER}@127.0.0.1:{port}/"
        self._connection: Any = None
        self._channel: Any = None
        self._names = (f"bench-{n}" for n in itertools.count())

    async def open(self) -> None:
        self._connection = await aio_pika.connect(self.url)
        self._channel = await self._connection.channel(publisher_confirms=True)

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()

    @contextlib.asynccontextmanager
    async def _queue(self) -> Any:
        name = next(self._names)
        queue = await self._channel.declare_queue(
            name,
            durable=True,
            arguments={"x-queue-type": "quorum", "x-quorum-initial-group-size": self.replicas},
        )
        try:
            yield queue
        finally:
            await queue.delete(if_unused=False, if_empty=False)

    async def _publish(self, routing_key: str, body: bytes) -> None:
        message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        await self._channel.default_exchange.publish(message, routing_key=routing_key)

    async def one_at_a_time(self, body: bytes, budget: Budget) -> list[float]:
        latencies: list[float] = []
        clock = time.perf_counter
        async with self._queue() as queue:
            while budget.going():
                start = clock()
                await self._publish(queue.name, body)
                latencies.append(clock() - start)
                budget.sent += 1
        return latencies

    async def in_flight(self, body: bytes, budget: Budget) -> None:
        async with self._queue() as queue:
            await windowed(budget, lambda _count: self._publish(queue.name, body), 1, IN_FLIGHT)

    async def end_to_end(self, size: int, rate: float, seconds: float) -> EndToEnd:
        run = OpenLoop(rate, seconds, size)
        pending: set[asyncio.Task[None]] = set()
        consuming = await self._connection.channel()
        await consuming.set_qos(prefetch_count=IN_FLIGHT)
        async with self._queue() as queue:

            async def handle(message: Any) -> None:
                run.on_message(message.body)

            await (await consuming.get_queue(queue.name)).consume(handle, no_ack=True)

            async def send(bodies: list[bytes]) -> None:
                for body in bodies:
                    # Not awaited here: the open loop must not wait for confirms.
                    task = asyncio.create_task(self._publish(queue.name, body))
                    pending.add(task)
                    task.add_done_callback(pending.discard)

            try:
                return await run.run(send)
            finally:
                if pending:
                    await asyncio.wait(pending, timeout=10)
                await consuming.close()


class RabbitStreamR3(RabbitStream):
    key = "rabbitmq_stream_r3"
    label = "RabbitMQ stream, 3 replicas"
    durability = (
        "segment files, 3 replicas on 3 nodes: confirmed once a majority (2) wrote it to "
        "the stream's file (page cache); no fsync before the confirm"
    )
    replicas = 3


class RabbitQuorumR3(RabbitQuorum):
    key = "rabbitmq_quorum_r3"
    label = "RabbitMQ quorum queue, 3 replicas"
    durability = (
        "quorum queue, 3 replicas on 3 nodes: confirmed once a majority (2) fsynced its "
        "write-ahead log (persistent messages)"
    )
    replicas = 3
