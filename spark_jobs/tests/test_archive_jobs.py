"""The archive, replay and lag-report jobs against a real cluster."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from metaq.client.producer import Producer
from metaq.client.pull_consumer import PullConsumer
from metaq.spark.jobs import archive, lag_report, replay
from metaq.testing import Cluster
from metaq.testing.waiting import run_async


def send(cluster: Cluster, topic: str, count: int, prefix: str) -> set[str]:
    async def go() -> set[str]:
        async with Producer(cluster.nameserver_addresses) as producer:
            return {
                (
                    await producer.send(topic, f"{prefix}{i}".encode(), tags="t", keys=(f"k{i}",))
                ).msg_id
                for i in range(count)
            }

    return run_async(go())


def read_ids(spark: Any, cluster: Cluster, topic: str) -> list[str]:
    df = spark.read.format("metaq").option("nameservers", cluster.nameserver_list)
    return [r.msg_id for r in df.option("topic", topic).load().collect()]


def test_archive_resumes_and_a_replay_twice_stores_once(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    run_async(cluster.create_topic("arch-src", queues=2))
    run_async(cluster.create_topic("arch-dst", queues=2))
    first = send(cluster, "arch-src", 20, "a")
    assert archive.run(spark, cluster.nameserver_list, "arch-src", str(tmp_path)) == 20
    second = send(cluster, "arch-src", 15, "b")
    assert archive.run(spark, cluster.nameserver_list, "arch-src", str(tmp_path)) == 15
    archived = spark.read.parquet(str(tmp_path / "data"))
    assert {"date", "hour"} <= set(archived.columns)
    assert {r.msg_id for r in archived.collect()} == first | second

    for _ in range(2):
        replay.run(spark, cluster.nameserver_list, str(tmp_path / "data"), "arch-dst")
    ids = read_ids(spark, cluster, "arch-dst")
    assert sorted(ids) == sorted(first | second), "a replayed message was stored twice"


def test_lag_report_writes_a_table_and_a_png(cluster: Cluster, tmp_path: Path) -> None:
    run_async(cluster.create_topic("lag-topic", queues=1, groups=["broker-a"]))
    send(cluster, "lag-topic", 12, "m")

    async def commit_some() -> None:
        async with PullConsumer(cluster.nameserver_addresses, "lag-group") as consumer:
            (queue,) = await consumer.queues("lag-topic")
            await consumer.commit("lag-topic", queue, 5)

    run_async(commit_some())
    args = [
        "--nameservers", cluster.nameserver_list, "--group", "lag-group", "--topics", "lag-topic",
        "--samples", "2", "--interval-s", "0", "--output", str(tmp_path),
    ]  # fmt: skip
    assert lag_report.main(args) == 0
    png = (tmp_path / "lag.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width > 100 and height > 100
    (csv,) = (tmp_path / "lag.csv").glob("part-*.csv")
    lines = csv.read_text().splitlines()
    assert lines[0].split(",")[-1] == "lag"
    assert [line.split(",")[-1] for line in lines[1:]] == ["7", "7"]
