"""The end-to-end figures of ``make bench-compare`` (``bench/compare_report.py``): the
percentiles of a cell and metaq's p99 ÷ the best peer's of one durability class. Pure
logic on hand-made cells; no server starts."""

from __future__ import annotations

import math

from compare_harness import Latencies
from compare_report import Cell, e2e_p99_vs_best, ratios, targets_met
from metaq_load import percentile_ms


def _e2e(system: str, p99_ms: float, size: int = 1024, ran: bool = True) -> Cell:
    return Cell(system, "end_to_end", size, 2000.0 if ran else None,
                Latencies(p99_ms / 2, p99_ms, p99_ms * 2))  # fmt: skip


def test_percentiles_are_nearest_rank_in_milliseconds() -> None:
    seconds = [i / 1000 for i in range(1, 101)]  # 1 ms .. 100 ms
    lat = Latencies.of(list(reversed(seconds)))  # sorted by Latencies.of, not the caller
    assert lat.p50_ms == 51.0
    assert lat.p99_ms == 100.0
    assert math.isnan(percentile_ms([], 0.99))


def test_ratio_is_to_the_lowest_peer_p99_of_the_class() -> None:
    cells = [_e2e("metaq_sync_replicated", 6.0), _e2e("kafka_r3", 12.0),
             _e2e("rocketmq_sync_master", 4.0), _e2e("metaq", 1.0)]  # fmt: skip
    assert e2e_p99_vs_best(cells, "metaq_sync_replicated", ["kafka_r3"], 1024) == 0.5
    both = ["kafka_r3", "rocketmq_sync_master"]
    assert e2e_p99_vs_best(cells, "metaq_sync_replicated", both, 1024) == 1.5


def test_cells_that_did_not_run_are_not_the_best() -> None:
    cells = [_e2e("metaq", 3.0), _e2e("kafka", 1.0, ran=False), _e2e("rocketmq", math.nan),
             _e2e("kafka_aiokafka", 6.0), _e2e("redis", 0.5, size=128)]  # fmt: skip
    peers = ["kafka", "rocketmq", "kafka_aiokafka", "redis"]
    assert e2e_p99_vs_best(cells, "metaq", peers, 1024) == 0.5
    assert ratios(cells, peers, 1024)["e2e_p99_vs_best_peer_ratio"] == 0.5


def test_a_cell_that_lost_more_than_one_percent_has_no_p99() -> None:
    short = _e2e("rocketmq_sync_master", 1.0)
    short.sent, short.delivered = 22_000, 20_688
    nearly = _e2e("kafka_r3", 8.0)
    nearly.sent, nearly.delivered = 22_000, 21_900
    cells = [_e2e("metaq_sync_replicated", 4.0), short, nearly]
    peers = ["rocketmq_sync_master", "kafka_r3"]
    assert e2e_p99_vs_best(cells, "metaq_sync_replicated", peers, 1024) == 0.5


def test_no_figure_without_metaq_or_a_peer() -> None:
    cells = [_e2e("metaq", 3.0), _e2e("kafka", 2.0)]
    assert e2e_p99_vs_best(cells, "metaq", [], 1024) is None
    assert e2e_p99_vs_best(cells, "metaq_sync_replicated", ["kafka"], 1024) is None


def test_the_replicated_target_is_judged() -> None:
    met = targets_met({"sync_e2e_p99_vs_best_replicated_ratio": 0.8})
    assert met["sync_e2e_p99_vs_best_replicated_ratio"] is True
    assert (
        targets_met({"sync_e2e_p99_vs_best_replicated_ratio": 1.2})[
            "sync_e2e_p99_vs_best_replicated_ratio"
        ]
        is False
    )
