"""In and out rates per topic and per consumer group over the last minute (RocketMQ's
``statsAll``), from the broker's own message counters.

The counters behind ``/metrics`` only grow; a rate needs two readings. Every
``interval_s`` :class:`StatsWindow` keeps a reading of them, for ``window_s``; ``GET
/stats`` answers each count's total and its rate since the oldest reading kept (a broker
started a moment ago answers over the time it has, and says how long that is).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any, Final

from metaq.common.service import PeriodicService

Totals = dict[tuple[str, ...], float]
"""Counts by key: ``("in", topic)``, ``("out", topic)``, ``("pulled", group, topic)``,
``("acked", group, topic)``."""

_TOPIC_FIELDS: Final = ("in_total", "out_total", "in_tps", "out_tps")
_GROUP_FIELDS: Final = ("pulled_total", "acked_total", "pulled_tps", "acked_tps")
WINDOW_S: Final = 60.0
INTERVAL_S: Final = 5.0


class StatsWindow(PeriodicService):
    """Readings of ``totals()`` over the last ``window_s`` (see the module doc)."""

    name = "metaq-broker-stats"

    def __init__(
        self,
        totals: Callable[[], Totals],
        *,
        window_s: float = WINDOW_S,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(interval_s)
        self._totals = totals
        self._window_s = window_s
        self._clock = clock
        self._readings: collections.deque[tuple[float, Totals]] = collections.deque()
        self.read()

    def read(self) -> None:
        """Keep a reading now, and forget those older than the window needs."""
        now = self._clock()
        self._readings.append((now, self._totals()))
        # Keep the newest reading at least window_s old: it is the rates' start.
        while len(self._readings) > 1 and now - self._readings[1][0] >= self._window_s:
            self._readings.popleft()

    async def run_once(self) -> None:
        self.read()

    def report(self) -> dict[str, Any]:
        """Totals now and rates per second since the oldest reading kept."""
        now = self._clock()
        current = self._totals()
        since, then = self._readings[0]
        span = now - since

        def rate(key: tuple[str, ...]) -> float:
            if span <= 0:
                return 0.0
            return round(max(0.0, current.get(key, 0.0) - then.get(key, 0.0)) / span, 3)

        topics: dict[str, dict[str, float]] = {}
        groups: dict[tuple[str, str], dict[str, float]] = {}
        for key, total in sorted(current.items()):
            kind = key[0]
            if kind in ("in", "out"):
                row = topics.setdefault(key[1], dict.fromkeys(_TOPIC_FIELDS, 0))
            else:
                row = groups.setdefault((key[1], key[2]), dict.fromkeys(_GROUP_FIELDS, 0))
            row[f"{kind}_total"] = int(total)
            row[f"{kind}_tps"] = rate(key)
        return {
            "window_s": round(span, 3),
            "topics": [{"topic": t, **row} for t, row in sorted(topics.items())],
            "groups": [{"group": g, "topic": t, **row} for (g, t), row in sorted(groups.items())],
        }
