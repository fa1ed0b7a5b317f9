"""``make run``'s local cluster (and ``make spark-demo``, which starts it) names a port
that something else holds, instead of a node dying with it in its own log."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from metaq.testing.waiting import wait_until

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "local_cluster.py"


def test_a_taken_port_is_named_before_any_node_starts(tmp_path: Path) -> None:
    with socket.socket() as holder:
        try:
            holder.bind(("127.0.0.1", 9880))
            holder.listen()
        except OSError:
            pass  # another local cluster holds it: taken all the same
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--data-dir", str(tmp_path / "cluster")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    assert "127.0.0.1:9880 (nameserver HTTP)" in done.stderr
    assert "is in use" in done.stderr
    assert not (tmp_path / "cluster").exists(), "nothing starts while a port is taken"


def test_replicas_start_a_sync_pair_per_group_that_elects_a_master(tmp_path: Path) -> None:
    """``make run RUN_ARGS="--replicas 2"``: four brokers come up, two per group, and the
    controller names a master of each group (the recipe in docs/spark.md for trying
    failover)."""
    node = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--data-dir", str(tmp_path / "cluster"), "--replicas", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = []
    try:
        assert node.stdout is not None
        for line in node.stdout:
            seen.append(line)
            if line.startswith("replicated:") or node.poll() is not None:
                break
        assert any(line.startswith("replicated:") for line in seen), "".join(seen[-20:])
        assert "broker-a-1 10931" in seen[-1]
        assert "broker-b-1 11031" in seen[-1]
        masters: dict[str, int] = {}

        def elected() -> bool:
            listed = subprocess.run(
                [str(Path(sys.executable).parent / "metaq"), "cluster", "list", "--json",
                 "-n", "127.0.0.1:9876"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            if listed.returncode:
                return False
            brokers = json.loads(listed.stdout)["brokers"]
            masters.clear()
            masters.update(
                (b["broker_name"], b["broker_id"]) for b in brokers if "master" in b["role"].lower()
            )
            return len(brokers) == 4 and set(masters) == {"broker-a", "broker-b"}

        wait_until(elected, 60.0, "a master of each group")
    finally:
        node.terminate()
        node.communicate(timeout=120)  # drains and closes its output while it stops
