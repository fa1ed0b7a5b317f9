"""The live-room job on a generated order stream: its closed windows equal what the test
computes from the orders it sent, in Parquet and on the order-stats topic."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from metaq.spark.jobs import live_orders
from metaq.spark.jobs.order_generator import generate
from metaq.testing import Cluster
from metaq.testing.waiting import run_async

START_MS = 1_763_000_000_000 - 1_763_000_000_000 % 60_000  # a minute boundary


def test_live_orders_aggregates_closed_minutes_like_the_test_does(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    run_async(cluster.create_topic("live-orders", queues=2))
    run_async(cluster.create_topic("live-stats", queues=1))
    sent = run_async(
        generate(
            cluster.nameserver_addresses, "live-orders", 5000, count=1500, start_ms=START_MS,
            event_step_ms=100,
        )
    )  # fmt: skip
    watermark_ms = max(o.event_time_ms for o in sent) - 10_000
    expected: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for o in sent:
        window = o.event_time_ms - o.event_time_ms % 60_000
        if window + 60_000 <= watermark_ms:
            expected[(window, o.category)][0] += o.amount
            expected[(window, o.category)][1] += 1
    assert len({w for w, _ in expected}) == 2  # minutes 0 and 1 closed; minute 2 still open

    args = [
        "--nameservers", cluster.nameserver_list, "--topic", "live-orders",
        "--stats-topic", "live-stats", "--output", str(tmp_path), "--until-idle",
        "--trigger-seconds", "0.5",
    ]  # fmt: skip
    assert live_orders.main(args) == 0

    rows = spark.read.parquet(str(tmp_path / "stats")).collect()
    got = {(int(r.window_start.timestamp() * 1000), r.category): (r.gmv, r.orders) for r in rows}
    assert got.keys() == expected.keys()
    for key, (gmv, count) in expected.items():
        assert got[key][1] == count
        assert abs(got[key][0] - gmv) < 0.01

    messages = (
        spark.read.format("metaq")
        .option("nameservers", cluster.nameserver_list)
        .option("topic", "live-stats")
        .load()
        .collect()
    )
    on_topic = [json.loads(bytes(m.body)) for m in messages]
    assert len(on_topic) == len(expected)
    assert {(s["category"], s["orders"]) for s in on_topic} == {
        (c, n) for (_, c), (_, n) in expected.items()
    }
