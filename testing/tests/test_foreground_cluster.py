"""A cluster run in the foreground (``make run``): every process's lines reach the
caller with the node's name, the processes are out of reach of the terminal's Ctrl-C,
and stopping them lets each leave cleanly."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from metaq.testing.cluster import ClusterBuilder
from metaq.testing.waiting import wait_until


def test_a_foreground_cluster_echoes_every_process_and_stops_each_with_sigterm(
    tmp_path: Path,
) -> None:
    lines: list[tuple[str, str]] = []
    cluster = ClusterBuilder(echo=lambda node, line: lines.append((node, line))).start(tmp_path)
    try:

        def said(node: str, text: str) -> bool:
            return any(n == node and text in line for n, line in list(lines))

        wait_until(lambda: said("ns0", "metaq-nameserver ready"), 10, "the nameserver's line")
        assert said("broker-a-0", "metaq-broker ready")
        broker, nameserver = cluster.broker("broker-a"), cluster.nameservers[0]
        for pid in (broker.proc.pid, nameserver.process.pid):
            assert os.getsid(pid) != os.getsid(0), "a terminal's Ctrl-C would reach it"
        assert cluster.exited() == []
    finally:
        codes = cluster.terminate(30)
    assert set(codes) == {"broker-a-0", "ns0"}
    assert all(code in (0, -signal.SIGTERM) for code in codes.values()), codes
    assert cluster.exited() == ["ns0", "broker-a-0"]
