"""``metaq stats`` with real processes: per topic and per group, totals and rates over
the last minute summed over the brokers, as a table, as JSON, and into a closed pipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from metaq.client import Admin, Producer
from metaq.client.consumer import FIRST, PushConsumer
from metaq.client.message import Message
from metaq.testing import Cluster, ClusterBuilder
from metaq.testing.waiting import deadline, run_async, wait_until_async

TOPIC = "metered"
SENT = 120


def _metaq(cluster: Cluster) -> list[str]:
    script = Path(sys.executable).with_name("metaq")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "metaq.client.cli"]
    return [*command, "-n", cluster.nameserver_addresses[0]]


def test_stats_show_each_topics_and_groups_traffic_over_every_broker(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    cluster = cluster_factory(ClusterBuilder(groups=("broker-a", "broker-b")))
    nameservers = cluster.nameserver_addresses
    run_async(cluster.create_topic(TOPIC, queues=2))
    handled: list[Message] = []

    async def handle(message: Message) -> None:
        handled.append(message)

    async def scenario() -> None:
        consumer = PushConsumer(nameservers, "meter-readers", consume_from=FIRST)
        consumer.subscribe(TOPIC, handle)
        async with consumer:
            async with Producer(nameservers) as producer:
                for n in range(SENT):
                    await producer.send(TOPIC, b"m%d" % n)

            async def acked() -> bool:
                stats = await admin.stats()
                rows = [g for g in stats.groups if g.group == "meter-readers"]
                return sum(g.acked_total for g in rows) == SENT

            async with Admin(nameservers, timeout_s=10) as admin:
                await wait_until_async(acked, 30, "the group's commits reach the stats")

    run_async(scenario(), timeout_s=90)
    assert len(handled) >= SENT

    done = subprocess.run(
        [*_metaq(cluster), "stats", "--json", "--topic", TOPIC],
        capture_output=True, text=True, timeout=deadline(60), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert 0 < stats["window_s"] <= 60.5
    [topic] = stats["topics"]
    assert (topic["topic"], topic["in_total"]) == (TOPIC, SENT)
    assert topic["out_total"] >= SENT
    # Every message came within the window: the rate is the count over the window.
    assert topic["in_tps"] >= SENT / 60.5
    [group] = stats["groups"]
    assert (group["group"], group["pulled_total"], group["acked_total"]) == (
        "meter-readers",
        topic["out_total"],
        SENT,
    )
    assert group["acked_tps"] > 0

    table = subprocess.run(
        [*_metaq(cluster), "stats", "--group", "meter-readers"],
        capture_output=True, text=True, timeout=deadline(60), check=True,
    )  # fmt: skip
    lines = table.stdout.splitlines()
    assert lines[0].startswith("rates over the last ")
    assert lines[1].split() == ["TOPIC", "IN/S", "OUT/S", "IN", "TOTAL", "OUT", "TOTAL"]
    assert lines[2].split()[0] == TOPIC and lines[2].split()[-2] == str(SENT)
    assert any(line.split()[:2] == ["meter-readers", TOPIC] for line in lines)

    # Into a pipe whose reader leaves after the first line: no traceback.
    piped = subprocess.run(
        f"{' '.join(_metaq(cluster))} stats --json | head -1",
        shell=True, capture_output=True, text=True, timeout=deadline(60), check=False,
        env={**os.environ},
    )  # fmt: skip
    assert piped.stdout.strip() == "{"
    assert "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr, piped.stderr
