"""Batch reads through format("metaq") against a real cluster: what was sent comes back,
ranges by offsets and by time, partition splitting, and filters applied at the brokers."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from pyspark.errors import AnalysisException

from metaq.client.producer import Producer
from metaq.client.results import SendResult
from metaq.testing import Cluster
from metaq.testing.waiting import run_async, wait_until


def send_all(cluster: Cluster, topic: str, count: int, *, queues: int = 2) -> list[SendResult]:
    """Create ``topic`` on both brokers and send ``count`` messages with keys, tags and
    properties; returns the send results in send order."""

    async def go() -> list[SendResult]:
        await cluster.create_topic(topic, queues=queues)
        async with Producer(cluster.nameserver_addresses) as producer:
            return [
                await producer.send(
                    topic,
                    f"body-{i}".encode(),
                    tags=("red", "green", "blue")[i % 3],
                    keys=(f"k{i}", f"order-{i // 2}"),
                    properties={"n": str(i), "even": str(i % 2 == 0)},
                )
                for i in range(count)
            ]

    return run_async(go())


def read(spark: Any, cluster: Cluster, topic: str, **options: str) -> Any:
    reader = spark.read.format("metaq").option("nameservers", cluster.nameserver_list)
    return reader.option("topic", topic).options(**options).load()


def explained(df: Any) -> str:
    """``df.explain("formatted")``'s text: each scan with its PushedFilters."""
    return str(df._sc._jvm.PythonSQLUtils.explainString(df._jdf.queryExecution(), "formatted"))


def test_batch_read_returns_every_message_as_sent(spark: Any, cluster: Cluster) -> None:
    sent = send_all(cluster, "spark-batch", 60)
    rows = read(spark, cluster, "spark-batch").collect()
    assert len(rows) == 60
    assert {r.broker for r in rows} == {"broker-a", "broker-b"}
    by_id = {r.msg_id: r for r in rows}
    for i, result in enumerate(sent):
        row = by_id[result.msg_id]
        assert row.topic == "spark-batch"
        assert (row.broker, row.queue, row.offset) == (
            result.broker,
            result.queue_id,
            result.queue_offset,
        )
        assert bytes(row.body) == f"body-{i}".encode()
        assert row.tags == ("red", "green", "blue")[i % 3]
        assert list(row.keys) == [f"k{i}", f"order-{i // 2}"]
        assert row.properties == {"n": str(i), "even": str(i % 2 == 0)}
        assert abs(row.store_timestamp.timestamp() - time.time()) < 600
        assert row.born_timestamp <= row.store_timestamp


def test_starting_and_ending_offsets_by_json_bound_each_queue(spark: Any, cluster: Cluster) -> None:
    sent = send_all(cluster, "spark-offsets", 40)
    queue = sent[0]
    key = f"{queue.broker}:{queue.queue_id}"
    in_queue = sorted(
        r.queue_offset for r in sent if (r.broker, r.queue_id) == (queue.broker, queue.queue_id)
    )
    assert len(in_queue) >= 4
    starting = json.dumps({"spark-offsets": {key: in_queue[1]}})
    ending = json.dumps({"spark-offsets": {key: in_queue[3]}})
    rows = read(
        spark, cluster, "spark-offsets", startingOffsets=starting, endingOffsets=ending
    ).collect()
    mine = sorted(r.offset for r in rows if f"{r.broker}:{r.queue}" == key)
    assert mine == [in_queue[1], in_queue[2]]
    # Queues the JSON leaves out: earliest to latest, as the Kafka source does.
    assert len(rows) == 40 - len(in_queue) + 2


def test_starting_and_ending_timestamps_select_by_store_time(spark: Any, cluster: Cluster) -> None:
    early = send_all(cluster, "spark-times", 10)
    cut_ms = max(r.store_timestamp_ms for r in early) + 1
    wait_until(lambda: time.time() * 1000 > cut_ms, 5.0, "the wall clock passes the cut")
    late = send_all(cluster, "spark-times", 10)
    later = read(spark, cluster, "spark-times", startingTimestamp=str(cut_ms)).collect()
    assert {r.msg_id for r in later} == {r.msg_id for r in late}
    earlier = read(spark, cluster, "spark-times", endingTimestamp=str(cut_ms)).collect()
    assert {r.msg_id for r in earlier} == {r.msg_id for r in early}


def test_offsets_by_timestamp_set_each_named_queue_by_store_time(
    spark: Any, cluster: Cluster
) -> None:
    early = send_all(cluster, "spark-queue-times", 20)
    cut_ms = max(r.store_timestamp_ms for r in early) + 1
    wait_until(lambda: time.time() * 1000 > cut_ms, 5.0, "the wall clock passes the cut")
    late = send_all(cluster, "spark-queue-times", 20)
    one = (late[0].broker, late[0].queue_id)
    key = f"{one[0]}:{one[1]}"
    in_one = {r.msg_id for r in early + late if (r.broker, r.queue_id) == one}
    late_in_one = {r.msg_id for r in late if (r.broker, r.queue_id) == one}
    others = {r.msg_id for r in early + late} - in_one

    by_time = json.dumps({"spark-queue-times": {key: cut_ms}})
    rows = read(spark, cluster, "spark-queue-times", startingOffsetsByTimestamp=by_time).collect()
    # The named queue from the cut on; the others from their earliest (startingOffsets).
    assert {r.msg_id for r in rows} == late_in_one | others
    rows = read(spark, cluster, "spark-queue-times", endingOffsetsByTimestamp=by_time).collect()
    assert {r.msg_id for r in rows} == (in_one - late_in_one) | others


def test_an_offsets_by_timestamp_queue_the_read_lacks_fails_naming_it(
    spark: Any, cluster: Cluster
) -> None:
    send_all(cluster, "spark-queue-times-bad", 2)
    by_time = json.dumps({"spark-queue-times-bad": {"broker-z:0": 1}})
    df = read(spark, cluster, "spark-queue-times-bad", startingOffsetsByTimestamp=by_time)
    with pytest.raises(AnalysisException) as failure:
        df.collect()
    first = str(failure.value).splitlines()[0]
    assert "'startingOffsetsByTimestamp' names queue broker-z:0" in first, first


def test_max_messages_per_partition_cuts_each_queue_range(spark: Any, cluster: Cluster) -> None:
    send_all(cluster, "spark-split-max", 80)
    whole = read(spark, cluster, "spark-split-max").collect()
    sizes = {}
    for r in whole:
        sizes[(r.broker, r.queue)] = sizes.get((r.broker, r.queue), 0) + 1
    df = read(spark, cluster, "spark-split-max", maxMessagesPerPartition="7")
    assert df.rdd.getNumPartitions() == sum(-(-n // 7) for n in sizes.values())
    per_partition = df.rdd.glom().map(len).collect()
    assert max(per_partition) <= 7
    rows = df.collect()
    assert sorted((r.broker, r.queue, r.offset) for r in rows) == sorted(
        (r.broker, r.queue, r.offset) for r in whole
    )


def test_min_partitions_splits_large_queue_ranges(spark: Any, cluster: Cluster) -> None:
    send_all(cluster, "spark-split", 80)
    df = read(spark, cluster, "spark-split", minPartitions="10")
    assert df.rdd.getNumPartitions() >= 10
    rows = df.collect()
    assert len(rows) == 80
    assert len({(r.broker, r.queue, r.offset) for r in rows}) == 80
    assert read(spark, cluster, "spark-split").rdd.getNumPartitions() == 4


def test_tag_time_and_queue_filters_are_applied_at_the_brokers(
    spark: Any, cluster: Cluster
) -> None:
    send_all(cluster, "spark-push", 90)
    before = run_async(cluster.pulled("spark-push"))
    df = read(spark, cluster, "spark-push").where("tags = 'red'")
    plan = explained(df)
    assert "PushedFilters: [IsNotNull(tags), EqualTo(tags,red)]" in plan, plan
    assert "Filter " not in plan, plan  # nothing left for Spark to check
    assert df.count() == 30
    assert run_async(cluster.pulled("spark-push")) - before == 30

    before = run_async(cluster.pulled("spark-push"))
    only = read(spark, cluster, "spark-push").where("broker = 'broker-a' AND queue = 1")
    rows = only.collect()
    assert rows and {(r.broker, r.queue) for r in rows} == {("broker-a", 1)}
    assert run_async(cluster.pulled("spark-push")) - before == len(rows)

    everything = read(spark, cluster, "spark-push").collect()
    newest = max(r.store_timestamp for r in everything)
    before = run_async(cluster.pulled("spark-push"))
    recent = read(spark, cluster, "spark-push").where(
        f"store_timestamp >= timestamp'{newest.isoformat()}'"
    )
    plan = explained(recent)
    assert "GreaterThanOrEqual(store_timestamp," in plan, plan
    assert "Filter " not in plan, plan
    assert recent.count() == sum(1 for r in everything if r.store_timestamp >= newest)
    assert run_async(cluster.pulled("spark-push")) - before < 90


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (
            {"topic": "spark-batch", "startingOffset": "earliest"},
            ["unknown option", "startingoffset"],
        ),
        ({"topic": "spark-batch", "startingOffsets": "{bad"}, ["startingOffsets", "JSON"]),
        ({"topic": "no-such-topic"}, ["no-such-topic", "does not exist"]),
        ({"topic": "spark-batch", "nameservers": "127.0.0.1:1"}, ["nameservers", "127.0.0.1:1"]),
        ({"topic": "spark-batch", "maxMessagesPerTrigger": "lots"}, ["maxMessagesPerTrigger"]),
    ],
)
def test_bad_options_fail_at_planning_naming_the_option_in_the_first_line(
    spark: Any, cluster: Cluster, options: dict[str, str], words: list[str]
) -> None:
    reader = spark.read.format("metaq").option("nameservers", cluster.nameserver_list)
    with pytest.raises(AnalysisException) as failure:
        reader.options(**options).load().collect()
    first = str(failure.value).splitlines()[0]
    for word in words:
        assert word in first


def test_an_offset_range_the_queue_cannot_hold_fails_naming_the_queue_and_offsets(
    spark: Any, cluster: Cluster
) -> None:
    sent = send_all(cluster, "spark-bad-range", 20)
    queue = sent[0]
    key = f"{queue.broker}:{queue.queue_id}"
    mine = [
        r.queue_offset for r in sent if (r.broker, r.queue_id) == (queue.broker, queue.queue_id)
    ]
    end = max(mine) + 1
    past = json.dumps({"spark-bad-range": {key: end + 5}})
    with pytest.raises(Exception) as failure:
        read(spark, cluster, "spark-bad-range", startingOffsets=past).collect()
    for word in ("'startingOffsets'", key, str(end + 5), f"past the queue's end {end}"):
        assert word in str(failure.value)

    starting, ending = (json.dumps({"spark-bad-range": {key: n}}) for n in (2, 1))
    with pytest.raises(Exception) as failure:
        read(
            spark, cluster, "spark-bad-range", startingOffsets=starting, endingOffsets=ending
        ).collect()
    for word in (key, "starts at 2, after its ending offset 1"):
        assert word in str(failure.value)
