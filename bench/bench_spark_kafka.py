"""``make bench-spark-kafka``: ``format("metaq")`` beside Spark's own Kafka source.

The same ``--messages`` (1,000,000) messages of 1 KiB, sent to one metaq broker (async
flush, 8 queues) and to one Kafka broker (KRaft, acks=1, 8 partitions: the one-broker
setup of ``bench/peer_kafka.py``), read in one Spark session (``local[2]``) through
``format("metaq")`` and through ``format("kafka")`` (``spark-sql-kafka-0-10``, the jars
``make peers-spark-kafka`` resolves from ``bench/peers/spark-kafka/pom.xml``, passed with
``spark.jars``). Each read counts its rows and ``sum(length(body))`` /
``sum(length(value))``, which forces every message's bytes through. As in
``bench/bench_spark.py`` each rate is the median of three reads after two warm-ups; the
metaq source is read with its full schema and with the one-column ``body binary``
schema (the projection pattern of docs/spark.md). Beside the rates, the CPU seconds one
of those three reads cost on average, by process: Spark's JVM, its Python workers, the metaq
broker, the Kafka broker (read from /proc). The last line is one JSON object;
``spark_read_vs_kafka_source_ratio`` is metaq's rows/s over the Kafka source's.

Spark's Kafka source must be the version of the Spark it runs in; the Makefile runs this
with the pyspark of that version (docs/benchmarks.md says which).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

import pyspark
from bench_spark import (
    BODY,
    BODY_ONLY,
    QUEUES,
    TIMED_READS,
    WARM_UP_READS,
    fill,
    spark_session,
    timed_rows,
)
from confluent_kafka import Producer
from peer_kafka import PARTITIONS, TOPIC, kafka_running
from spark_cpu import cpu_by_role, spent

from metaq.testing.cluster import ClusterBuilder

SOURCE_DIR: Final = Path(__file__).parent / "peers" / "spark-kafka"
LIB: Final = SOURCE_DIR / "lib"
STAMP: Final = LIB / ".stamp"
"""Written by ``make peers-spark-kafka`` once every jar is in ``LIB``."""
METAQ_TOPIC: Final = "bench-read"
READ_ROLES: Final = ("jvm", "python_workers", "broker", "kafka_broker")
"""The processes a read keeps busy."""


def kafka_source_jars() -> list[Path]:
    """The Kafka source's jars, checked to be of the running Spark's version."""
    if not STAMP.exists():
        raise SystemExit(
            f"Spark's Kafka source is not in {LIB}: run `make peers-spark-kafka` "
            f"(Maven resolves it from {SOURCE_DIR / 'pom.xml'})"
        )
    jars = sorted(LIB.glob("*.jar"))
    versions = {
        m.group(1)
        for jar in jars
        if (m := re.match(r"spark-sql-kafka-0-10_2\.13-(.+)\.jar$", jar.name))
    }
    if versions != {pyspark.__version__}:
        raise SystemExit(
            f"{LIB} holds spark-sql-kafka {sorted(versions)} but this is pyspark "
            f"{pyspark.__version__}: run with the pyspark of the pom's spark.version "
            "(make bench-spark-kafka does)"
        )
    return jars


def fill_kafka(bootstrap: str, count: int) -> None:
    """``count`` 1 KiB messages into :data:`TOPIC`, acks=1, batched by the producer."""
    body = os.urandom(BODY)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "1",
            "linger.ms": 5,
            "batch.size": 1 << 20,
            "queue.buffering.max.messages": 200_000,
        }
    )
    failed: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(str(error))

    for i in range(count):
        while True:
            try:
                producer.produce(TOPIC, body, partition=i % PARTITIONS, on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(120)
    if left or failed:
        raise RuntimeError(f"Kafka fill: {left} unsent, {len(failed)} failed ({failed[:3]})")


def measured(df: Any, expected: int, column: str) -> tuple[float, dict[str, float]]:
    """Steady rows/s of reading ``df`` (the median of ``TIMED_READS`` reads after
    ``WARM_UP_READS``), and the CPU seconds by role of one of those reads (their mean):
    taken after the warm-ups, so the JIT's compiling of the read's code, most of a
    side's CPU in its first reads, is left out for both sides alike."""
    for _ in range(WARM_UP_READS):
        timed_rows(df, column)
    before = cpu_by_role()
    rates = []
    for _ in range(TIMED_READS):
        rows, took = timed_rows(df, column)
        assert rows == expected, f"read {rows} of {expected}"
        rates.append(rows / took)
    cpu = spent(before, cpu_by_role())
    return statistics.median(rates), {role: round(s / TIMED_READS, 2) for role, s in cpu.items()}


def busy(cpu: dict[str, float]) -> float:
    return round(sum(cpu.get(role, 0.0) for role in READ_ROLES), 2)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=1_000_000)
    args = p.parse_args(argv)
    jars = kafka_source_jars()
    work = Path(tempfile.mkdtemp(prefix="bench-spark-kafka-"))
    figures: dict[str, Any] = {
        "messages": args.messages,
        "body_bytes": BODY,
        "spark_version": pyspark.__version__,
    }
    builder = ClusterBuilder(
        broker_args=("--flush-mode", "async", "--set", "store.commitlog_segment_bytes=268435456"),
        small_store=False,
        ready_timeout_s=60,
    )
    try:
        with builder.start(work / "metaq") as cluster, kafka_running(work / "kafka") as kafka:
            ns = cluster.nameserver_addresses[0]
            asyncio.run(cluster.create_topic(METAQ_TOPIC, queues=QUEUES))
            asyncio.run(fill(ns, METAQ_TOPIC, args.messages))
            fill_kafka(kafka.bootstrap, args.messages)
            spark = spark_session(jars)
            metaq_read = spark.read.format("metaq").option("nameservers", ns)
            metaq_read = metaq_read.option("topic", METAQ_TOPIC)
            kafka_source = (
                spark.read.format("kafka")
                .option("kafka.bootstrap.servers", kafka.bootstrap)
                .option("subscribe", TOPIC)
                .option("startingOffsets", "earliest")
                .option("endingOffsets", "latest")
                .load()
            )
            for name, df, column in (
                ("kafka_source", kafka_source, "value"),
                ("spark_read", metaq_read.load(), "body"),
                ("spark_read_body_only", metaq_read.schema(BODY_ONLY).load(), "body"),
            ):
                rate, cpu = measured(df, args.messages, column)
                figures[f"{name}_rows_s"] = round(rate)
                figures[f"{name}_cpu_s"] = cpu
                figures[f"{name}_busy_cpu_s"] = busy(cpu)
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    kafka_rate = figures["kafka_source_rows_s"]
    kafka_cpu = figures["kafka_source_busy_cpu_s"]
    for name in ("spark_read", "spark_read_body_only"):
        suffix = "" if name == "spark_read" else "_body_only"
        figures[f"spark_read{suffix}_vs_kafka_source_ratio"] = round(
            figures[f"{name}_rows_s"] / kafka_rate, 3
        )
        # By CPU seconds, which the machine's other load moves less than rows/s: what
        # the Kafka source's read cost against what metaq's did (above 1: metaq's cost more).
        figures[f"spark_read{suffix}_vs_kafka_source_cpu_ratio"] = round(
            figures[f"{name}_busy_cpu_s"] / kafka_cpu, 3
        )
    for name, value in figures.items():
        print(f"{name:40} {value:>14,}" if isinstance(value, int) else f"{name:40} {value!s:>14}")
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
