"""The stats window: totals as they are, rates over the last minute of readings."""

from __future__ import annotations

from metaq.broker.metrics import BrokerMetrics
from metaq.broker.stats import StatsWindow


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rates_are_over_the_oldest_reading_within_the_window() -> None:
    metrics, clock = BrokerMetrics(), _Clock()
    window = StatsWindow(metrics.totals, window_s=60, interval_s=5, clock=clock)
    metrics.appended("orders", 100, 1000)  # before the window's start: in the total only
    for _ in range(20):  # 100 s of readings, 5 s apart, 60 messages in each 5 s
        clock.now += 5
        metrics.appended("orders", 60, 600)
        metrics.pulled("orders", "FOUND", 60, 600, group="billing")
        metrics.acknowledged("billing", "orders", 30)
        window.read()
    report = window.report()
    assert report["window_s"] == 60.0
    [topic] = report["topics"]
    assert topic == {"topic": "orders", "in_total": 1300, "out_total": 1200,
                     "in_tps": 12.0, "out_tps": 12.0}  # fmt: skip
    [group] = report["groups"]
    assert group == {"group": "billing", "topic": "orders", "pulled_total": 1200,
                     "acked_total": 600, "pulled_tps": 12.0, "acked_tps": 6.0}  # fmt: skip


def test_a_young_broker_reports_over_the_time_it_has() -> None:
    metrics, clock = BrokerMetrics(), _Clock()
    window = StatsWindow(metrics.totals, clock=clock)
    assert window.report() == {"window_s": 0.0, "topics": [], "groups": []}
    metrics.appended("orders", 20, 200)
    clock.now += 2
    report = window.report()
    assert report["window_s"] == 2.0
    assert report["topics"][0]["in_tps"] == 10.0
