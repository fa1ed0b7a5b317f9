"""``make bench-scale --quick``: the queues-per-broker benchmark runs, and what it shows
holds: a broker's descriptors do not grow with its queues; the nameserver dimension runs
three real nameservers under simulated brokers and clients, and a failover reaches every
client; consumer groups' commits share journal records and reach the slave, the default
assignment moves few queues when a member joins, and a client's route is one topic's
whatever the cluster holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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
        # Only the controller's leader asks the masters for their full beat; the others
        # get every broker's at the standby interval (the leader is offered twice what
        # each follower is; a starved one answers less than it is offered).
        answered = row["heartbeats_per_s_answered"]
        leader = row["leader"]
        assert leader is not None, row
        assert answered[leader] > max(a for i, a in enumerate(answered) if i != leader), row
    last = rows[-1]
    # The silenced master's slave is elected after the detection time (3 s) and every
    # client of the group's topics finds it in its route.
    assert 2.0 < last["failover_decision_s"] < 30, last
    assert last["failover_all_clients_learned_s"] >= last["failover_decision_s"], last
    assert last["failover_clients_watching"] > 0, last
    for key in ("nameserver_cpu_cores_at_1000_groups_20000_clients", "route_query_p99_ms_at_scale"):
        assert key in figures


@pytest.fixture(scope="module")
def figures() -> dict[str, Any]:
    """One quick run of the groups, assignment and topics dimensions."""
    run = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--dimension", "groups",
         "--dimension", "assignment", "--dimension", "topics"],
        capture_output=True,
        text=True,
        timeout=1140,
        check=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    result["stderr"] = run.stderr[-3000:]
    return result


@pytest.mark.timeout(1200)
def test_groups_commits_are_journaled_together_and_reach_the_slave(
    figures: dict[str, Any],
) -> None:
    rows = figures["groups_rows"]
    assert [row["groups"] for row in rows] == [1, 50, 200, 500], figures["stderr"]
    for row in rows:
        assert "failed" not in row, row
        assert row["rounds"] >= 1 and row["commits_s"] > 0, row
        # The slave answers the last group's last commit: replicated and applied.
        assert row["slave_caught_up_s"] is not None, row
        # Every group's four queues are in the master's snapshot.
        assert row["offsets_held"] == 4 * row["groups"], row
    # 500 groups' commits over 16 connections share records: a record per commit is
    # about 300 bytes, a shared one about 40 bytes a queue.
    assert rows[-1]["journal_bytes_per_commit"] < 250, rows[-1]
    assert "offsets_commit_cpu_us_at_100k_groups" in figures


@pytest.mark.timeout(1200)
def test_default_assignment_moves_the_newcomers_share_where_the_stateless_ones_move_more(
    figures: dict[str, Any],
) -> None:
    rows = figures["assignment_rows"]
    assert [row["members"] for row in rows] == [10, 50, 100, 200]
    for row in rows:
        for name in ("sticky", "balanced_hash", "average"):
            assert row[f"{name}_spread"] <= 1, row
        # Fed the running assignment, the sticky default moves the newcomer's share only.
        assert row["sticky_moved_on_join"] <= row["share"] + 1 / row["queues"], row
        assert row["balanced_hash_moved_on_join"] <= 12 * row["share"], row
    top = rows[-1]
    assert top["balanced_hash_moved_on_join"] > 2 * top["sticky_moved_on_join"], top
    assert top["average_moved_on_join"] > 3 * top["balanced_hash_moved_on_join"], top
    assert figures["assignment_moved_fraction_on_join"] == top["sticky_moved_on_join"]


@pytest.mark.timeout(1200)
def test_topics_are_created_and_a_route_is_one_topics_whatever_the_cluster_holds(
    figures: dict[str, Any],
) -> None:
    assert "topics_failed" not in figures, figures["topics_failed"]
    assert figures["topics_created"] == 400, figures["stderr"]
    rows = figures["topics_rows"]
    assert [row["topics"] for row in rows] == [1, 100, 200, 300, 400]
    assert len({row["route_bytes"] for row in rows}) == 1, rows
    assert figures["topic_create_ms_median_first"] > 0
    assert "topic_create_slowdown_last_vs_first" in figures
