"""``make bench-scale --quick``: the queues-per-broker benchmark runs, and what it shows
holds: a broker's descriptors do not grow with its queues; the nameserver dimension runs
three real nameservers under simulated brokers and clients, and a failover reaches every
client."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_scale.py"


@pytest.mark.timeout(600)
def test_quick_run_reports_every_count_with_descriptors_flat() -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--quick",
            "--dimension",
            "queues",
            "--mapped-queue-files",
            "500",
        ],
        capture_output=True,
        text=True,
        timeout=540,
        check=True,
    )
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    rows = figures["rows"]
    assert [row["queues"] for row in rows] == [16, 200, 2000], run.stderr[-2000:]
    for row in rows:
        assert "failed" not in row, row
        assert row["append_msgs_s"] > 0 and row["recovery_s"] > 0, row
    # No queue file holds a descriptor: 2,000 queues hold as many as 16 (mmap.mmap on
    # CPython 3.11 kept one per mapped file).
    fds = [row["open_fds"] for row in rows]
    assert max(fds) - min(fds) <= 8, fds
    # 200 queues all stay mapped; of 2,000, only what the pool keeps (and those in use).
    assert rows[1]["mapped_store_files"] >= 200, rows[1]
    assert rows[2]["mapped_store_files"] <= 500 + 16, rows[2]
    assert rows[2]["pool_unmapped"] >= 1500, rows[2]
    for key in ("queues_100k_vs_16_append_ratio", "fds_at_100k_queues", "recovery_100k_queues_s"):
        assert key in figures


@pytest.mark.timeout(600)
def test_quick_nameserver_run_answers_every_broker_and_client_and_fails_over() -> None:
    run = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--dimension", "nameserver"],
        capture_output=True,
        text=True,
        timeout=540,
        check=True,
    )
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    rows = figures["nameserver_rows"]
    assert [(r["groups"], r["clients"]) for r in rows] == [
        (3, 60), (6, 120), (12, 240), (24, 480)
    ], run.stderr[-2000:]  # fmt: skip
    for row in rows:
        assert "failed" not in row, row
        # Every nameserver answers heartbeats; the clients' route queries get answers.
        assert all(rate > 0 for rate in row["heartbeats_per_s_answered"]), row
        assert row["route_queries_per_s"] > 0 and row["route_query_p99_ms"] is not None, row
        assert row["raft_journal_bytes_after_bootstrap"] > 0 and row["snapshot_bytes"] > 0, row
    last = rows[-1]
    # The silenced master's slave is elected after the detection time (3 s) and every
    # client of the group's topics finds it in its route.
    assert 2.0 < last["failover_decision_s"] < 30, last
    assert last["failover_all_clients_learned_s"] >= last["failover_decision_s"], last
    assert last["failover_clients_watching"] > 0, last
    for key in ("nameserver_cpu_cores_at_1000_groups_20000_clients", "route_query_p99_ms_at_scale"):
        assert key in figures
