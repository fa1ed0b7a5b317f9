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

Systems that can also be offered a fixed rate without a consumer (``paced``, with
:func:`offer`) and name their servers' process ids (``server_pids``) get a cost cell:
the servers' CPU seconds per million acknowledged messages (:func:`cpu_seconds`).
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import struct
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Final, Protocol, runtime_checkable

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


@runtime_checkable
class LoadTool(Protocol):
    """A system's own load generator in another language, in a process of its own: only
    the throughput cells, (b), each after ``warmup_s`` of the same load unmeasured."""

    key: str
    label: str
    durability: str
    in_flight_how: str

    def throughput(self, size: int, warmup_s: float, seconds: float) -> float: ...


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


async def offer(rate: float, seconds: float, send: Callable[[int], Awaitable[None]]) -> int:
    """``rate`` msgs/s for ``seconds``: on :class:`OpenLoop`'s grid, ``send(n)`` with the
    ``n`` messages that came due (it must not wait for their acknowledgements); returns
    how many were offered."""
    total = int(rate * seconds)
    start = time.perf_counter()
    sent = 0
    with Ticker(TICK_S, start) as ticker:
        while sent < total:
            due = min(total, int((time.perf_counter() - start) * rate) + 1)
            if due > sent:
                await send(due - sent)
                sent = due
            await ticker.wait()
    return sent


_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as children:
                for child in children.read().split():
                    found += [int(child), *_descendants(int(child))]
        except FileNotFoundError:
            continue
    return found


def cpu_seconds(pids: Iterable[int]) -> float:
    """User plus system CPU time of the processes ``pids`` and their live descendants
    (every thread of each), from ``/proc/<pid>/stat``."""
    ticks = 0
    for pid in pids:
        for one in (pid, *_descendants(pid)):
            try:
                with open(f"/proc/{one}/stat") as stat:
                    # Fields after the command name, which may hold spaces and ')'.
                    fields = stat.read().rpartition(")")[2].split()
            except FileNotFoundError:
                continue
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / _CLOCK_TICKS
