"""Reads given a schema yield only its columns, in its order and spelling (batch and
stream), and a schema naming what the source lacks fails at planning, naming the column."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.errors import AnalysisException

from metaq.client.producer import Producer
from metaq.testing import Cluster
from metaq.testing.waiting import run_async


def send(cluster: Cluster, topic: str, count: int) -> dict[str, bytes]:
    """Create ``topic`` and send ``count`` messages with tags, keys and properties; the
    bodies by message id."""

    async def go() -> dict[str, bytes]:
        await cluster.create_topic(topic, queues=2)
        async with Producer(cluster.nameserver_addresses) as producer:
            sent = {}
            for i in range(count):
                body = f"body-{i}".encode()
                result = await producer.send(
                    topic, body, tags="red", keys=(f"k{i}",), properties={"n": str(i)}
                )
                sent[result.msg_id] = body
            return sent

    return run_async(go())


def read(spark: Any, cluster: Cluster, topic: str, schema: str) -> Any:
    reader = spark.read.format("metaq").option("nameservers", cluster.nameserver_list)
    return reader.schema(schema).option("topic", topic).load()


def test_a_batch_read_given_a_schema_yields_only_its_columns(spark: Any, cluster: Cluster) -> None:
    sent = send(cluster, "project-batch", 40)
    bodies = read(spark, cluster, "project-batch", "body binary")
    assert bodies.columns == ["body"]
    assert sorted(bytes(r.body) for r in bodies.collect()) == sorted(sent.values())
    assert bodies.selectExpr("sum(length(body))").first()[0] == sum(map(len, sent.values()))

    some = read(spark, cluster, "project-batch", "MSG_ID string, offset bigint, Tags string")
    assert some.columns == ["MSG_ID", "offset", "Tags"]
    rows = some.collect()
    assert {r.MSG_ID for r in rows} == set(sent)
    assert {r.Tags for r in rows} == {"red"}
    assert all(len(r) == 3 for r in rows)


def test_a_stream_given_a_schema_yields_only_its_columns(spark: Any, cluster: Cluster) -> None:
    sent = send(cluster, "project-stream", 20)
    query = (
        spark.readStream.format("metaq")
        .option("nameservers", cluster.nameserver_list)
        .option("topic", "project-stream")
        .schema("msg_id string, body binary")
        .load()
        .writeStream.format("memory")
        .queryName("project_stream")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    table = spark.table("project_stream")
    assert table.columns == ["msg_id", "body"]
    assert {r.msg_id: bytes(r.body) for r in table.collect()} == sent


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ("value binary", ["'value'", "not one of its columns"]),
        ("body string", ["'body'", "string", "binary", "cast"]),
    ],
)
def test_a_schema_the_source_cannot_give_fails_at_planning_naming_the_column_first(
    spark: Any, cluster: Cluster, schema: str, words: list[str]
) -> None:
    run_async(cluster.create_topic("project-bad", queues=1))
    with pytest.raises(AnalysisException) as failure:
        read(spark, cluster, "project-bad", schema).collect()
    first = str(failure.value).splitlines()[0]
    for word in words:
        assert word in first
