"""The samples behind the overview's sparklines: a small ring per series, filled by a
service that asks each group's master for its counts every ``console_sample_interval_ms``.

A series is a growing count (messages stored in a topic, messages its groups consumed)
or a level (a consumer group's lag). A tick that did not hear from every master records
nothing, so a broker that did not answer leaves a gap rather than a false dip and spike.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Final

from metaq.client.admin import Admin
from metaq.common.model import BrokerView
from metaq.common.service import PeriodicService

if TYPE_CHECKING:  # the context holds the samples
    from metaq.nameserver.console.context import Brokers

WINDOW_S: Final = 900.0
"""What a sparkline spans: the last 15 minutes."""
MAX_POINTS: Final = 240
"""Each ring's bound, whatever the interval: memory stays small with many topics."""
TOTAL: Final = "*"
"""The series key of the whole cluster's count."""


class Samples:
    """Rings of (monotonic time, value) by series, each holding :data:`WINDOW_S`."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.capacity = min(MAX_POINTS, max(2, round(WINDOW_S / interval_s) + 1))
        self._series: dict[str, deque[tuple[float, float]]] = {}

    def add(self, key: str, value: float, at: float) -> None:
        ring = self._series.get(key)
        if ring is None:
            ring = self._series[key] = deque(maxlen=self.capacity)
        ring.append((at, value))

    def forget_older_than(self, at: float) -> None:
        """Drop the series whose last sample is older than ``at`` (a deleted topic)."""
        self._series = {k: r for k, r in self._series.items() if r and r[-1][0] >= at}

    def levels(self, key: str) -> list[float]:
        return [value for _, value in self._series.get(key, ())]

    def rates(self, key: str) -> list[float | None]:
        """Per second between consecutive samples of a growing count; None where it fell
        (a count read from a master that lost messages, or a topic made anew)."""
        ring = self._series.get(key, ())
        out: list[float | None] = []
        for (t0, v0), (t1, v1) in pairwise(ring):
            out.append(None if v1 < v0 or t1 <= t0 else (v1 - v0) / (t1 - t0))
        return out

    def keys(self, prefix: str) -> list[str]:
        return [k[len(prefix) :] for k in self._series if k.startswith(prefix)]


class Sampler(PeriodicService):
    """Asks every master for its stored counts and committed offsets each interval."""

    name = "console-sampler"

    def __init__(
        self,
        samples: Samples,
        brokers: Brokers,
        masters: Callable[[], Sequence[BrokerView]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(samples.interval_s)
        self.samples = samples
        self._brokers = brokers
        self._masters = masters
        self._clock = clock

    async def run_once(self) -> None:
        masters = list(self._masters())
        ask = self._brokers.ask
        stored, offsets = await asyncio.gather(
            asyncio.gather(*(ask(b, Admin.stored_counts) for b in masters)),
            asyncio.gather(*(ask(b, Admin.consumer_offsets) for b in masters)),
        )
        now = self._clock()
        samples = self.samples
        if masters and all(a.ok for a in stored):
            counts: dict[str, int] = {}
            for counted in stored:
                for topic, count in counted.get({}).items():
                    counts[topic] = counts.get(topic, 0) + count
            for topic, count in counts.items():
                samples.add("in:" + topic, count, now)
            samples.add("in:" + TOTAL, sum(counts.values()), now)
        if masters and all(a.ok for a in offsets):
            consumed: dict[str, int] = {}
            lag: dict[str, int] = {}
            for committed in offsets:
                for row in committed.get([]):
                    consumed[row.topic] = consumed.get(row.topic, 0) + row.offset
                    lag[row.group] = lag.get(row.group, 0) + row.lag
            for topic, count in consumed.items():
                samples.add("out:" + topic, count, now)
            samples.add("out:" + TOTAL, sum(consumed.values()), now)
            for group, behind in lag.items():
                samples.add("lag:" + group, behind, now)
        samples.forget_older_than(now - WINDOW_S)
