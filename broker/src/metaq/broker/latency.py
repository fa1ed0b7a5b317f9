"""Latency histograms cheap enough for the data plane's hot path.

prometheus_client's ``Histogram.observe`` takes a lock and walks its buckets, per
request frame. These keep plain bucket counts that one thread bumps (the event loop for
request latency, the flusher thread for fsyncs) at a fraction of that cost
(docs/benchmarks.md), and turn them into a Prometheus histogram at scrape time. A
scrape racing an observation may see the count and the sum one observation apart,
which a rate over a scrape interval does not notice.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from typing import Final

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics_core import Metric

RPC_BUCKETS_S: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
"""Request latency: from 100 µs (an async-flush send) to a minute (a parked long poll)."""

FSYNC_BUCKETS_S: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0,
)  # fmt: skip
"""fsync: a small write's lands in the lowest buckets on a healthy disk; seconds means a
failing device."""


class Latency:
    """One histogram: counts per bucket (the last one past every bound) and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bound's bucket (le).
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs, +Inf last, as the exposition format wants."""
        out: list[tuple[str, float]] = []
        total = 0
        counts = list(self.counts)  # one snapshot: the observing thread goes on
        for bound, count in zip(self.bounds, counts, strict=False):
            total += count
            out.append((repr(float(bound)), total))
        out.append(("+Inf", total + counts[-1]))
        return out


class LatencyFamily:
    """Histograms of one metric by the value of one label, made on first use."""

    def __init__(
        self, name: str, documentation: str, label: str, bounds: tuple[float, ...]
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.label = label
        self.bounds = bounds
        self.children: dict[str, Latency] = {}

    def child(self, value: str) -> Latency:
        latency = self.children.get(value)
        if latency is None:
            latency = self.children[value] = Latency(self.bounds)
        return latency

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, latency in list(self.children.items()):
            family.add_metric([value], latency.buckets(), latency.sum)
        yield family


class SingleLatency:
    """A histogram without labels, as a registry collector."""

    def __init__(self, name: str, documentation: str, bounds: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.latency = Latency(bounds)

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation)
        family.add_metric([], self.latency.buckets(), self.latency.sum)
        yield family
