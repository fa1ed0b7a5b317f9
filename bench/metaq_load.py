"""metaq producer load shapes shared by the benchmarks: one send at a time, many sends
pipelined through one Producer, and ``send_batch`` callers; plus the set-up they need
(a topic routed, a warm producer) and the percentile they report.

Every shape runs until a :class:`Budget` says stop (a deadline or a message count,
whichever comes first), so every cell of every benchmark is bounded in both.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from metaq.client.errors import UnknownTopic
from metaq.client.producer import Producer
from metaq.client.routes import RouteCache
from metaq.common.tls import TlsConfig

UNBOUNDED = 1 << 62


def percentile_ms(ordered: list[float], fraction: float) -> float:
    """The ``fraction`` percentile of sorted seconds, in milliseconds (NaN when empty)."""
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] * 1000


def settle_disk() -> None:
    """Write back everything earlier cells left dirty, before a latency cell starts.

    A throughput cell leaves a gigabyte or more in the page cache; the kernel writes it
    back over the following seconds, and that I/O (and the CPU it takes) would land in
    the tail of whatever cell runs next, whichever system that is.
    """
    os.sync()


@dataclass
class Budget:
    """When a cell stops: at ``seconds`` from now or after ``max_messages``, whichever
    comes first. Workers add what they sent to ``sent``; sends already in flight when
    it runs out still finish and count."""

    seconds: float
    max_messages: int = UNBOUNDED
    sent: int = 0
    began: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.deadline = self.began + self.seconds

    def going(self) -> bool:
        return self.sent < self.max_messages and time.perf_counter() < self.deadline

    def rate(self) -> float:
        """Messages per second from the start until now."""
        return self.sent / (time.perf_counter() - self.began)


async def run_workers(budget: Budget, worker: Callable[[Budget], Awaitable[None]], n: int) -> float:
    """Run ``n`` copies of ``worker`` until ``budget`` runs out; messages per second."""
    budget.began = time.perf_counter()
    budget.deadline = budget.began + budget.seconds
    await asyncio.gather(*(worker(budget) for _ in range(n)))
    return budget.rate()


async def _send_loop(producer: Producer, topic: str, body: bytes, budget: Budget,
                     latencies: list[float]) -> None:  # fmt: skip
    clock = time.perf_counter
    while budget.going():
        start = clock()
        await producer.send(topic, body)
        latencies.append(clock() - start)
        budget.sent += 1


async def one_at_a_time(
    producer: Producer, topic: str, body: bytes, budget: Budget
) -> tuple[float, list[float]]:
    """One coroutine awaiting each send before the next: (msgs/s, sorted latencies s)."""
    latencies: list[float] = []
    rate = await run_workers(budget, lambda b: _send_loop(producer, topic, body, b, latencies), 1)
    return rate, sorted(latencies)


async def pipelined(
    producer: Producer, topic: str, body: bytes, budget: Budget, senders: int
) -> tuple[float, list[float]]:
    """``senders`` coroutines sending at once, so the accumulator coalesces their sends
    into batches per queue: (msgs/s, sorted latencies s)."""
    latencies: list[float] = []
    rate = await run_workers(
        budget, lambda b: _send_loop(producer, topic, body, b, latencies), senders
    )
    return rate, sorted(latencies)


async def batched(
    producer: Producer,
    topic: str,
    body: bytes,
    budget: Budget,
    callers: int,
    messages: int,
    latencies: list[float] | None = None,
) -> float:
    """``callers`` coroutines each sending lists of ``messages`` with ``send_batch`` (each
    list to the next queue round robin); each call's latency goes to ``latencies``."""
    batch = [body] * messages
    clock = time.perf_counter

    async def worker(b: Budget) -> None:
        while b.going():
            start = clock()
            # Awaited before the sum: "b.sent += len(await ...)" reads b.sent before the
            # await and loses the other callers' counts meanwhile.
            stored = len(await producer.send_batch(topic, batch))
            b.sent += stored
            if latencies is not None:
                latencies.append(clock() - start)

    return await run_workers(budget, worker, callers)


async def wait_routed(
    nameserver: str, topic: str, queues: int, timeout_s: float = 30.0, tls: TlsConfig | None = None
) -> None:
    """Until the nameserver routes ``queues`` writable queues of ``topic``."""
    async with RouteCache([nameserver], tls=tls) as routes:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(UnknownTopic):
                route = await routes.route(topic, refresh=True)
                if len(route.write_queues) == queues:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic} was not routed with {queues} queues in time")
            await asyncio.sleep(0.02)  # poll interval of a deadline-bound wait


async def ready_producer(
    nameserver: str,
    topic: str,
    *,
    linger_ms: float = 2.0,
    timeout_s: float = 30.0,
    tls: TlsConfig | None = None,
    trace: bool = False,
) -> Producer:
    """A started Producer whose first send to ``topic`` went through (route cached,
    connection open), retrying while a new master or topic settles."""
    producer = Producer([nameserver], linger_ms=linger_ms, tls=tls, trace=trace)
    await producer.start()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await producer.send(topic, b"warm-up")
            return producer
        except Exception:
            if time.monotonic() > deadline:
                await producer.close()
                raise
            await asyncio.sleep(0.05)
