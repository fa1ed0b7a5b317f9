"""Streaming reads through readStream.format("metaq") against a real cluster: triggers,
restart from a checkpoint into a file sink, read limits, and queues added mid-stream."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metaq.client.producer import Producer
from metaq.client.pull_consumer import PullConsumer
from metaq.testing import Cluster
from metaq.testing.waiting import run_async, wait_until


def send(cluster: Cluster, topic: str, bodies: list[str]) -> set[str]:
    """Send the bodies; the message ids acknowledged."""

    async def go() -> set[str]:
        async with Producer(cluster.nameserver_addresses) as producer:
            return {(await producer.send(topic, b.encode())).msg_id for b in bodies}

    return run_async(go())


def stream(spark: Any, cluster: Cluster, topic: str, **options: str) -> Any:
    reader = spark.readStream.format("metaq").option("nameservers", cluster.nameserver_list)
    if topic:
        reader = reader.option("topic", topic)
    return reader.options(**options).load()


def finished(query: Any) -> None:
    """Until an availableNow query has read everything there was; it must end cleanly."""
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()


def to_parquet(spark: Any, cluster: Cluster, topic: str, out: Path, **options: str) -> None:
    """Run the stream into Parquet once with availableNow (everything there now)."""
    finished(
        stream(spark, cluster, topic, **options)
        .writeStream.format("parquet")
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )


def to_memory(
    spark: Any, cluster: Cluster, topic: str, table: str, *, now: bool = False, **options: str
) -> Any:
    """Start the stream into the memory sink's ``table``: a batch every 200 ms, or with
    ``now`` everything there now (availableNow), then the query ends."""
    trigger = {"availableNow": True} if now else {"processingTime": "200 milliseconds"}
    return (
        stream(spark, cluster, topic, **options)
        .writeStream.format("memory")
        .queryName(table)
        .trigger(**trigger)
        .start()
    )


def table_ids(spark: Any, table: str) -> set[str]:
    """The message ids in the memory sink's ``table``."""
    return {r.msg_id for r in spark.sql(f"select msg_id from {table}").collect()}


def wait_for(query: Any, done: Callable[[], bool], timeout_s: float, message: str) -> None:
    """Until ``done`` holds; at once with the query's error should it die meanwhile."""
    wait_until(done, timeout_s, message, poll_s=0.2, failed=query.exception)


def wait_read(query: Any, rows: int, timeout_s: float, message: str) -> None:
    """Until the query's batches have read ``rows`` rows (see :func:`rows_read`)."""
    wait_for(query, lambda: rows_read(query) >= rows, timeout_s, message)


def rows_read(query: Any) -> int:
    """Rows the query's batches have read, from its progress reports: polling them costs
    no Spark job (a query of the memory sink's table would, every poll, on the cores the
    stream needs)."""
    return sum(p["numInputRows"] for p in query.recentProgress)


def parquet_ids(spark: Any, out: Path) -> list[str]:
    return [r.msg_id for r in spark.read.parquet(str(out / "data")).select("msg_id").collect()]


def test_restart_from_checkpoint_reads_only_what_was_not_processed(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    run_async(cluster.create_topic("stream-restart", queues=2))
    first = send(cluster, "stream-restart", [f"a{i}" for i in range(30)])
    to_parquet(spark, cluster, "stream-restart", tmp_path)
    assert sorted(parquet_ids(spark, tmp_path)) == sorted(first)
    second = send(cluster, "stream-restart", [f"b{i}" for i in range(25)])
    to_parquet(spark, cluster, "stream-restart", tmp_path)
    ids = parquet_ids(spark, tmp_path)
    assert len(ids) == len(set(ids)), "a message was written twice"
    assert set(ids) == first | second


def test_processing_time_trigger_honours_max_messages_per_trigger(
    spark: Any, cluster: Cluster
) -> None:
    run_async(cluster.create_topic("stream-limit", queues=2))
    sent = send(cluster, "stream-limit", [f"m{i}" for i in range(50)])
    query = to_memory(spark, cluster, "stream-limit", "stream_limit", maxMessagesPerTrigger="12")
    try:
        wait_read(query, 50, 90.0, "the stream has read the 50 messages")
    finally:
        query.stop()
    assert table_ids(spark, "stream_limit") == sent
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert max(sizes) <= 12
    assert sum(sizes) == 50


def test_queues_added_mid_stream_are_picked_up(spark: Any, cluster: Cluster) -> None:
    run_async(cluster.create_topic("stream-grow", queues=1, groups=["broker-a"]))
    before = send(cluster, "stream-grow", [f"x{i}" for i in range(10)])
    query = to_memory(spark, cluster, "stream-grow", "stream_grow")
    try:
        wait_read(query, 10, 60.0, "the first queue is read")
        run_async(cluster.create_topic("stream-grow", queues=3))
        after = send(cluster, "stream-grow", [f"y{i}" for i in range(40)])
        wait_read(query, 50, 60.0, "the new queues are read")
    finally:
        query.stop()
    rows = spark.sql("select broker, queue, msg_id from stream_grow").collect()
    assert {r.msg_id for r in rows} == before | after
    assert len(rows) == 50
    assert len({(r.broker, r.queue) for r in rows}) > 1


def test_topic_pattern_picks_up_new_topics_and_commits_the_groups_offsets(
    spark: Any, cluster: Cluster
) -> None:
    run_async(cluster.create_topic("pat-one", queues=1, groups=["broker-a"]))
    first = send(cluster, "pat-one", [f"p{i}" for i in range(5)])
    query = to_memory(spark, cluster, "", "stream_pattern",
                      topicPattern="pat-.*", consumerGroup="pattern-pipeline")  # fmt: skip

    def seen() -> set[str]:
        return table_ids(spark, "stream_pattern")

    try:
        wait_for(query, lambda: seen() >= first, 60.0, "the first topic is read")
        run_async(cluster.create_topic("pat-two", queues=1, groups=["broker-b"]))
        second = send(cluster, "pat-two", [f"q{i}" for i in range(7)])
        wait_for(query, lambda: seen() >= first | second, 60.0, "the new topic is read")
        # Spark commits a batch's end offsets to the source when it starts the next batch.
        third = send(cluster, "pat-one", ["one more"])
        wait_for(query, lambda: seen() >= third, 60.0, "a further batch ran")

        async def committed() -> bool:
            async with PullConsumer(cluster.nameserver_addresses, "pattern-pipeline") as consumer:
                (queue,) = await consumer.queues("pat-two")
                return (await consumer.committed("pat-two", queue) or 0) >= 7

        wait_until(
            lambda: run_async(committed()), 30.0, "the group's offset covers pat-two", poll_s=0.2
        )
    finally:
        query.stop()


def test_available_now_reads_what_was_there_in_batches_of_max_messages_per_trigger(
    spark: Any, cluster: Cluster
) -> None:
    run_async(cluster.create_topic("stream-now", queues=2))
    sent = send(cluster, "stream-now", [f"n{i}" for i in range(50)])
    query = to_memory(
        spark, cluster, "stream-now", "stream_now", now=True, maxMessagesPerTrigger="12"
    )
    finished(query)
    assert table_ids(spark, "stream_now") == sent
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    assert [p["numInputRows"] for p in progress] == [12, 12, 12, 12, 2]
    # The progress shows every queue's end beside where each batch stopped.
    (source,) = progress[0]["sources"]
    ends = json.loads(source["latestOffset"])["stream-now"]
    assert sum(ends.values()) == 50
    assert sum(json.loads(source["endOffset"])["stream-now"].values()) == 12


def test_min_messages_per_trigger_waits_for_enough_messages_or_the_delay(
    spark: Any, cluster: Cluster
) -> None:
    run_async(cluster.create_topic("stream-min", queues=2))
    sent = send(cluster, "stream-min", [f"a{i}" for i in range(5)])
    query = to_memory(spark, cluster, "stream-min", "stream_min",
                      minMessagesPerTrigger="20", maxTriggerDelay="30s")  # fmt: skip
    try:
        # The first batch runs at once, with the 5 there (Kafka's rule).
        wait_read(query, 5, 90.0, "the first batch")
        sent |= send(cluster, "stream-min", [f"b{i}" for i in range(25)])
        enough_at = time.time()
        wait_read(query, 25, 90.0, "20 or more waiting make a batch")
        # Too few to make a batch: they wait for maxTriggerDelay after the last one.
        sent |= send(cluster, "stream-min", [f"c{i}" for i in range(3)])
        wait_read(query, 33, 120.0, "the delay lets the rest through")
    finally:
        query.stop()
    assert table_ids(spark, "stream_min") == sent
    batches = [
        (p["numInputRows"], dt.datetime.fromisoformat(p["timestamp"]).timestamp())
        for p in query.recentProgress
        if p["numInputRows"]
    ]
    assert len(batches) == 3, batches
    assert batches[0][0] == 5 and batches[1][0] >= 20, batches
    assert batches[1][1] - enough_at < 30, "the batch waited although 20 were waiting"
    assert batches[2][1] - batches[1][1] >= 29.5, batches
