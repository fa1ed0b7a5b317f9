"""The RocketMQ peer of the benchmarks starts, takes a message and gives it back, and
leaves nothing behind: so that its harness (bench/peer_rocketmq.py) cannot rot between
benchmark runs. ``make test`` builds the peer first (``make peers-rocketmq``)."""

from __future__ import annotations

from pathlib import Path

import peer_rocketmq
import pytest


def test_single_broker_takes_a_message_and_gives_it_back(tmp_path: Path) -> None:
    why = peer_rocketmq.missing()
    if why is not None:
        pytest.skip(why)
    work = tmp_path / "rocketmq"
    # A setting of the broker's on top of the harness's (the backlog benchmark's disk
    # thresholds), in the properties file the broker starts from (``-c``), which sets
    # its store's settings as well as its own (the commitlog's size, flush type, path).
    settings = {"diskMaxUsedSpaceRatio": 93}
    with peer_rocketmq.single(
        work, proxy=False, jvm=peer_rocketmq.QUICK_JVM, broker=settings
    ) as cluster:
        servers = list(cluster.servers)
        assert len(cluster.pids()) == 2  # the nameserver and the broker, both running
        properties = (work / "home" / "conf" / "broker.properties").read_text().splitlines()
        assert "diskMaxUsedSpaceRatio=93" in properties
        assert "flushDiskType=ASYNC_FLUSH" in properties
        ready = peer_rocketmq.run_client(cluster, "topic", "Smoke", "1")
        assert ready["masters"] == [f"127.0.0.1:{cluster.brokers['broker'].ports['broker']}"]
        smoke = peer_rocketmq.run_client(cluster, "smoke", "Smoke")
    assert smoke["status"] == "SEND_OK"
    assert smoke["received_id"] == smoke["sent_id"]
    assert all(server.proc.poll() is not None for server in servers)
    assert not work.exists()
