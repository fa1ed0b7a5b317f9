"""``make run``'s local cluster (and ``make spark-demo``, which starts it) names a port
that something else holds, instead of a node dying with it in its own log."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

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
