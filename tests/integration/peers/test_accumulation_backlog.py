"""The backlog phase of ``make bench-accumulation`` (``bench/accumulation_backlog.py``):
how a ``ConsumerPerformance`` run becomes a drain's figures, and the ratios of the JSON.
Pure logic on hand-made output; no server starts."""

from __future__ import annotations

import pytest
from accumulation_backlog import _consumer_perf, headline

HEADER = (
    "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
    "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec"
)


def _said(messages: int, rebalance_ms: int, fetch_ms: int) -> str:
    mb = messages * 1024 / 2**20
    return "\n".join([
        HEADER,
        f"2026-11-29 09:45:00:000, 2026-11-29 09:46:00:000, {mb:.4f}, 1.0, {messages}, 1.0, "
        f"{rebalance_ms}, {fetch_ms}, 1.0, 1.0",
    ])  # fmt: skip


def test_a_whole_drain_is_timed_over_the_join_and_the_fetches() -> None:
    figures = _consumer_perf(_said(1_000_000, 5_000, 15_000), 4.0, 2.0, 1_000_000)
    assert figures["messages"] == 1_000_000
    assert figures["seconds"] == 20.0
    assert figures["msgs_s"] == 50_000.0
    assert figures["mb_s"] == 51.2
    assert figures["server_cpu_us_per_msg"] == 2.0


def test_a_drain_that_stopped_short_of_the_backlog_fails_saying_where() -> None:
    # ConsumerPerformance exits after --timeout without a record and still prints its
    # summary: its rate would be of a tenth of the backlog, the minute's wait included.
    said = _said(104_518, 5_075, 68_318)
    with pytest.raises(RuntimeError, match=r"stopped at 104,518 of 9,765,625 messages"):
        _consumer_perf(said, 4.0, 17.0, 9_765_625)


def test_a_failed_drain_gives_no_ratio_and_leaves_the_others() -> None:
    rows = {
        "metaq": {"python_warm": {"msgs_s": 40_000.0}, "python_cold": {"msgs_s": 15_000.0}},
        "kafka": {
            "python_warm": {"msgs_s": 50_000.0},
            "python_cold": {"msgs_s": 60_000.0},
            "java_perf_warm": {"msgs_s": 80_000.0},
            "java_perf_cold": {"failed": "RuntimeError: ConsumerPerformance stopped at 1"},
        },
    }
    figures = headline(rows)
    assert figures["drain_warm_vs_kafka_ratio"] == 0.8
    assert figures["drain_cold_vs_kafka_ratio"] == 0.25
    assert figures["drain_warm_vs_kafka_java_ratio"] == 0.5
    assert figures["drain_cold_vs_kafka_java_ratio"] is None
    assert figures["drain_warm_vs_rocketmq_ratio"] is None
