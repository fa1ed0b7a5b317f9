"""Writes through write.format("metaq") against a real cluster: a round trip, a task that
fails mid-write and is retried storing each row once, and rows that cannot be messages."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from metaq.common.record import id_sequence
from metaq.testing import Cluster
from metaq.testing.waiting import run_async

ROWS = 25_000


def read_back(spark: Any, cluster: Cluster, topic: str) -> list[Any]:
    reader = spark.read.format("metaq").option("nameservers", cluster.nameserver_list)
    return reader.option("topic", topic).load().collect()


def deduplicated(metrics: list[str]) -> float:
    total = 0.0
    for url in metrics:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        for found in re.finditer(r"^metaq_sends_deduplicated_total (\S+)$", text, re.M):
            total += float(found.group(1))
    return total


def writer(df: Any, cluster: Cluster) -> Any:
    return df.write.format("metaq").mode("append").option("nameservers", cluster.nameserver_list)


def test_written_rows_come_back_with_keys_tags_and_properties(spark: Any, cluster: Cluster) -> None:
    run_async(cluster.create_topic("write-round", queues=2))
    df = spark.range(100).select(
        F.lit("write-round").alias("topic"),
        F.concat(F.lit("order-"), F.col("id").cast("string")).alias("body"),
        F.array(F.concat(F.lit("k"), F.col("id").cast("string"))).alias("keys"),
        F.when(F.col("id") % 2 == 0, "even").otherwise("odd").alias("tags"),
        F.create_map(F.lit("n"), F.col("id").cast("string")).alias("properties"),
    )
    writer(df, cluster).save()
    rows = read_back(spark, cluster, "write-round")
    assert sorted(bytes(r.body).decode() for r in rows) == sorted(f"order-{i}" for i in range(100))
    for r in rows:
        n = int(bytes(r.body).decode().removeprefix("order-"))
        assert list(r.keys) == [f"k{n}"]
        assert r.tags == ("even" if n % 2 == 0 else "odd")
        assert r.properties == {"n": str(n)}


def test_a_task_failed_mid_write_stores_each_row_once(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    run_async(cluster.create_topic("write-retry", queues=2))
    marker = str(tmp_path / "failed-once")
    metrics = [f"{b.http_url}/metrics" for b in cluster.brokers.values()]

    def fail_once(n):  # type: ignore[no-untyped-def]  # hints would make Spark guess a pandas UDF
        # The first try dies late in the only partition, once the brokers hold some of its
        # rows: the retry sends those rows again.
        import os
        import re
        import urllib.request

        from metaq.testing.waiting import wait_until

        def stored() -> float:
            total = 0.0
            for url in metrics:
                text = urllib.request.urlopen(url, timeout=5).read().decode()
                for found in re.finditer(
                    r'^metaq_messages_in_total\{topic="write-retry"\} (\S+)$', text, re.M
                ):
                    total += float(found.group(1))
            return total

        if n == ROWS - 100 and not os.path.exists(marker):
            open(marker, "w").close()
            wait_until(lambda: stored() >= 5000, 60.0, "the first try stored rows", poll_s=0.05)
            raise RuntimeError("injected failure mid-write")
        return f"row-{n}"

    body = F.udf(fail_once, StringType())
    # Rows reach the writer in Arrow batches (10,000 rows by default): the failure comes
    # after the first batches were sent.
    df = spark.range(0, ROWS, 1, 1).select(body(F.col("id")).alias("body"))
    writer(df, cluster).option("topic", "write-retry").save()
    assert Path(marker).exists(), "the injected failure did not happen"
    rows = read_back(spark, cluster, "write-retry")
    bodies = [bytes(r.body).decode() for r in rows]
    assert len(bodies) == ROWS, f"{len(bodies) - len(set(bodies))} rows stored twice"
    assert set(bodies) == {f"row-{i}" for i in range(ROWS)}
    # The re-sent rows were told apart by their producer sequences: every queue holds one
    # task's sequences 0, 1, 2, ... once each, and the brokers dropped the re-sent ones.
    by_queue: dict[tuple[str, int], list[int]] = {}
    for row in rows:
        _, _, seq = id_sequence(bytes.fromhex(row.msg_id))
        by_queue.setdefault((row.broker, row.queue), []).append(seq)
    assert all(seqs == list(range(len(seqs))) for seqs in by_queue.values()), by_queue.keys()
    assert deduplicated(metrics) > 0


def test_rows_go_to_the_queue_their_queue_and_broker_columns_name(
    spark: Any, cluster: Cluster
) -> None:
    run_async(cluster.create_topic("write-queue", queues=3))
    df = spark.range(60).select(
        F.lit("write-queue").alias("topic"),
        F.col("id").cast("string").alias("body"),
        (F.col("id") % 3).cast("int").alias("queue"),
        F.when(F.col("id") % 2 == 0, "broker-b").otherwise("broker-a").alias("broker"),
        # The queue column wins over the sharding key, as Kafka's partition over its key.
        F.lit("same-key").alias("sharding_key"),
    )
    writer(df, cluster).save()
    rows = read_back(spark, cluster, "write-queue")
    assert len(rows) == 60
    for r in rows:
        n = int(bytes(r.body).decode())
        assert (r.broker, r.queue) == ("broker-b" if n % 2 == 0 else "broker-a", n % 3), n


@pytest.mark.parametrize(
    ("columns", "words"),
    [
        (["CAST(NULL AS STRING) AS body"], ["'body'", "null"]),
        (["id AS body"], ["'body'", "bigint"]),
        (["'x' AS body", "id AS tags"], ["'tags'", "bigint"]),
        (["'x' AS body", "'no-such-topic' AS topic"], ["no-such-topic", "does not exist"]),
        (["'x' AS body", "'1' AS queue"], ["'queue'", "string", "int"]),
        (["'x' AS body", "7 AS queue", "'broker-a' AS broker"], ["'queue'", "broker-a:7"]),
        (["'x' AS body", "0 AS queue"], ["'queue'", "broker-a, broker-b", "'broker' column"]),
    ],
)
def test_rows_that_cannot_be_messages_fail_naming_the_column(
    spark: Any, cluster: Cluster, columns: list[str], words: list[str]
) -> None:
    run_async(cluster.create_topic("write-bad", queues=1))
    df = spark.range(3).selectExpr(*columns)
    if "topic" not in df.columns:
        df = df.withColumn("topic", F.lit("write-bad"))
    with pytest.raises(Exception) as failure:
        writer(df, cluster).save()
    for word in words:
        assert word in str(failure.value)
    assert read_back(spark, cluster, "write-bad") == []


def test_a_write_to_a_topic_that_does_not_exist_fails_at_planning(
    spark: Any, cluster: Cluster
) -> None:
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS body")
    with pytest.raises(AnalysisException) as failure:
        writer(df, cluster).option("topic", "no-such-write-topic").save()
    first = str(failure.value).splitlines()[0]
    assert "'no-such-write-topic' does not exist" in first
