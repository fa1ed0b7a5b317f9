"""live_orders submitted with spark-submit to a real Spark standalone cluster (a master
and a worker of their own): executors are separate JVMs and Python workers that import
the installed metaq.spark."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metaq.spark.jobs import live_orders
from metaq.spark.jobs.order_generator import generate
from metaq.spark.standalone import StandaloneCluster
from metaq.testing import Cluster
from metaq.testing.waiting import run_async

START_MS = 1_763_000_000_000 - 1_763_000_000_000 % 60_000


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster.start(tmp_path / "spark")
    yield cluster
    cluster.stop()


def test_live_orders_runs_on_a_standalone_cluster(
    spark: Any, cluster: Cluster, standalone: StandaloneCluster, tmp_path: Path
) -> None:
    run_async(cluster.create_topic("sa-orders", queues=2))
    run_async(cluster.create_topic("sa-stats", queues=1))
    sent = run_async(
        generate(cluster.nameserver_addresses, "sa-orders", 5000, count=800, start_ms=START_MS,
                 event_step_ms=150)
    )  # fmt: skip
    watermark_ms = max(o.event_time_ms for o in sent) - 10_000
    closed = [
        o for o in sent if o.event_time_ms - o.event_time_ms % 60_000 + 60_000 <= watermark_ms
    ]
    output = standalone.submit(
        Path(live_orders.__file__),
        "--nameservers", cluster.nameserver_list, "--topic", "sa-orders", "--stats-topic",
        "sa-stats", "--output", str(tmp_path / "out"), "--until-idle", "--trigger-seconds", "1",
    )  # fmt: skip
    assert "per-minute stats in" in output
    master_log = (tmp_path / "spark" / "master.log").read_text()
    assert "Registering app live_orders" in master_log, "the job did not run on the cluster"
    rows = spark.read.parquet(str(tmp_path / "out" / "stats")).collect()
    assert sum(r.orders for r in rows) == len(closed)
    assert abs(sum(r.gmv for r in rows) - sum(o.amount for o in closed)) < 0.05
