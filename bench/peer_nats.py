"""NATS JetStream driven by nats-py: a file-storage stream of one replica, or of three
on a three-server cluster; publishes wait for the PubAck (from the stream's leader, once
a majority of its replicas stored the message)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

import nats
from compare_harness import IN_FLIGHT, EndToEnd, OpenLoop
from metaq_load import Budget
from nats.errors import Error as NatsError
from nats.js.api import DeliverPolicy, StorageType

STREAM: Final = "BENCH"
ACK_WAIT_S: Final = 30.0
READY_S: Final = 60.0
"""How long a fresh cluster may take to elect the JetStream leader that creates streams."""


class NatsJetStream:
    key = "nats"
    label = "NATS JetStream"
    durability = (
        "file store, 1 replica: acked once the server wrote it to its file (page cache); "
        "no fsync before the ack"
    )
    in_flight_how = f"publish_async, ≤ {IN_FLIGHT:,} pending acks"

    def __init__(self, port: int) -> None:
        self.url = f"nats://127.0.0.1:{port}"
        self.replicas = 1
        self._nc: Any = None
        self._js: Any = None
        self._errors = 0

    async def open(self) -> None:
        self._nc = await nats.connect(self.url)
        self._js = self._nc.jetstream(publish_async_max_pending=IN_FLIGHT)
        deadline = time.monotonic() + READY_S
        while True:
            try:
                await self._js.add_stream(
                    name=STREAM, subjects=["bench.>"], storage=StorageType.FILE,
                    num_replicas=self.replicas,
                )  # fmt: skip
                return
            except NatsError:
                # A new cluster answers "JetStream system temporarily unavailable" (or
                # times out) until its servers have elected a meta leader.
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)  # retry interval of a deadline-bound wait

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()

    async def one_at_a_time(self, body: bytes, budget: Budget) -> list[float]:
        latencies: list[float] = []
        clock = time.perf_counter
        while budget.going():
            start = clock()
            await self._js.publish("bench.one", body)
            latencies.append(clock() - start)
            budget.sent += 1
        return latencies

    def _count_error(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            self._errors += 1

    async def in_flight(self, body: bytes, budget: Budget) -> None:
        # publish_async waits for a free slot once IN_FLIGHT acks are pending.
        while budget.going():
            future = await self._js.publish_async("bench.many", body)
            future.add_done_callback(self._count_error)
            budget.sent += 1
        async with asyncio.timeout(ACK_WAIT_S):
            await self._js.publish_async_completed()

    async def end_to_end(self, size: int, rate: float, seconds: float) -> EndToEnd:
        run = OpenLoop(rate, seconds, size)

        async def handle(msg: Any) -> None:
            run.on_message(msg.data)

        subscription = await self._js.subscribe(
            "bench.e2e", cb=handle, ordered_consumer=True, deliver_policy=DeliverPolicy.NEW
        )

        async def send(bodies: list[bytes]) -> None:
            for body in bodies:
                future = await self._js.publish_async("bench.e2e", body)
                future.add_done_callback(self._count_error)

        try:
            return await run.run(send)
        finally:
            await subscription.unsubscribe()


class NatsJetStreamR3(NatsJetStream):
    key = "nats_r3"
    label = "NATS JetStream, 3 replicas"
    durability = (
        "file store, 3 replicas on 3 servers: acked once a majority (2) wrote it to their "
        "files (page cache); no fsync before the ack"
    )

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.replicas = 3
