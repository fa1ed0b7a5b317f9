"""What every system in the side-by-side benchmark implements, and the open-loop
end-to-end run they share.

A system is driven in three modes, each bounded by a :class:`~metaq_load.Budget`:

- ``one_at_a_time`` — one send, wait for its acknowledgement, the next;
- ``in_flight`` — up to :data:`IN_FLIGHT` unacknowledged sends, batched or pipelined as
  the system's client does best;
- ``end_to_end`` — an :class:`OpenLoop`: messages offered at a fixed rate, each at its
  scheduled time whether or not earlier ones were answered, consumed back in the same
  process; latency is from the scheduled send to the consumer's callback, so a stall
  shows as latency instead of a lower rate (the schedule of ``bench_e2e_latency.py``).
"""

from __future__ import annotations

import asyncio
import gc
import math
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

from metaq_load import Budget, percentile_ms
from ticker import Ticker

IN_FLIGHT: Final = 1000
"""Unacknowledged sends a client may have outstanding in the ``in_flight`` mode."""
_INDEX: Final = struct.Struct("<Q")
TICK_S: Final = 0.001
"""How often the open loop wakes to send what came due, on a fixed grid (a
:class:`~ticker.Ticker`). A finer tick would cost the client more wake-ups than the
system under test's answers do; a message waits up to a tick to go out (0.5 ms on
average), which every system's latency carries alike."""


@dataclass(frozen=True)
class Latencies:
    """Percentiles of one cell, in milliseconds."""

    p50_ms: float
    p99_ms: float
    p999_ms: float

    @classmethod
    def of(cls, seconds: list[float]) -> Latencies:
        ordered = sorted(seconds)
        return cls(*(percentile_ms(ordered, f) for f in (0.5, 0.99, 0.999)))

    @classmethod
    def none(cls) -> Latencies:
        return cls(math.nan, math.nan, math.nan)


@dataclass(frozen=True)
class EndToEnd:
    """An open-loop run: what was offered and delivered, and the latencies."""

    offered_msgs_s: float
    sent: int
    delivered: int
    latency: Latencies


class System(Protocol):
    """One system under test, connected to its running server(s)."""

    key: str
    label: str
    durability: str
    in_flight_how: str

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def one_at_a_time(self, body: bytes, budget: Budget) -> list[float]:
        """Send until ``budget`` runs out, counting in it; each send's latency (s)."""
        ...

    async def in_flight(self, body: bytes, budget: Budget) -> None:
        """Send with up to :data:`IN_FLIGHT` unacknowledged until ``budget`` runs out,
        counting in it; returns once every send was acknowledged."""
        ...

    async def end_to_end(self, size: int, rate: float, seconds: float) -> EndToEnd: ...


@dataclass
class OpenLoop:
    """One open-loop run: ``rate`` msgs/s for ``warmup_s + seconds``; the first
    ``warmup_s`` are sent and consumed but left out of the latencies."""

    rate: float
    seconds: float
    size: int
    warmup_s: float = 1.0
    drain_timeout_s: float = 8.0
    gc_freeze: bool = True
    start: float = 0.0
    received: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.total = int(self.rate * (self.seconds + self.warmup_s))
        self.warmup = int(self.rate * self.warmup_s)
        self._padding = b"x" * max(self.size - _INDEX.size, 0)
        self._done = asyncio.Event()

    def body(self, index: int) -> bytes:
        return _INDEX.pack(index) + self._padding

    def on_message(self, body: bytes) -> None:
        """The consumer's callback: one delivered message."""
        now = time.perf_counter()
        (index,) = _INDEX.unpack_from(body)
        if index >= self.warmup:
            self.latencies.append(now - (self.start + index / self.rate))
        self.received += 1
        if self.received >= self.total:
            self._done.set()

    async def run(self, send: Callable[[list[bytes]], Awaitable[None]]) -> EndToEnd:
        """Offer every message on schedule through ``send`` (which must not wait for
        acknowledgements), then wait for the consumer to have them all, within bounds."""
        if self.gc_freeze:
            # What a latency-sensitive service does once set up: start-up's objects leave
            # the collector's view, so a full collection costs ~1 ms instead of tens.
            gc.freeze()
        self.start = time.perf_counter()
        with Ticker(TICK_S, self.start) as ticker:
            sent = 0
            while sent < self.total:
                due = min(self.total, int((time.perf_counter() - self.start) * self.rate) + 1)
                if due > sent:
                    await send([self.body(index) for index in range(sent, due)])
                    sent = due
                await ticker.wait()
        send_seconds = time.perf_counter() - self.start
        try:
            async with asyncio.timeout(self.drain_timeout_s):
                await self._done.wait()
        except TimeoutError:
            pass  # what did not arrive shows as delivered < sent
        return EndToEnd(
            offered_msgs_s=round(self.total / send_seconds, 1),
            sent=self.total,
            delivered=self.received,
            latency=Latencies.of(self.latencies),
        )


async def windowed(
    budget: Budget, send: Callable[[int], Awaitable[None]], batch: int, windows: int
) -> None:
    """``windows`` coroutines each sending ``batch`` messages and awaiting their
    acknowledgement before the next: at most ``batch × windows`` in flight."""

    async def worker() -> None:
        while budget.going():
            await send(batch)
            budget.sent += batch

    await asyncio.gather(*(worker() for _ in range(windows)))
