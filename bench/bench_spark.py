"""``make bench-spark``: the metaq data source against Parquet, the consumer and the producer.

On one broker (async flush) with ``--messages`` (1,000,000) messages of 1 KiB in 8 queues,
in one run: batch read rows/s through ``format("metaq")`` (``sum(length(body))`` forces the
body to be read), the same rows read by Spark from Parquet on local disk, the same
messages read by the project's consumer in one process; write rows/s through the data
source beside the producer's batched send; and the streaming latency from the producer's
send to the row reaching a ``foreachBatch`` sink at 5,000 msgs/s with a 1 s trigger. The
last line is one JSON object; docs/spark.md says what bounds each figure.

Both reads are timed once the JVM has compiled them: a JVM's first reads of a kind run
while the JIT compiles their code, for several reads (a 200,000-row Parquet read ran at
300,000-400,000 rows/s cold and about 900,000 warm), so each read is the median of three
after two warm-ups (``spark_read_first_rows_s`` keeps the metaq read after one). Beside
them, the same steady read of a stand-in Python source with metaq's schema whose reads
cost nothing (``python_source_ceiling_rows_s``): what Spark spends on any Python
source's rows, the ceiling of the metaq read on this machine. Both are read again given
the one-column schema ``body binary`` (the projection pattern of docs/spark.md):
``spark_read_body_only_rows_s`` against the stand-in's ceiling with the same schema,
``spark_read_body_only_vs_ceiling_ratio`` (and by CPU seconds,
``..._vs_ceiling_cpu_ratio``, which the machine's other load moves less). The write is
timed warm
too: the session's first write starts Python workers for the writer, seconds of imports
that a long-running job pays once. The producer's batched send it is compared with runs
right after it, into a topic of its own, with Spark's JVM alive beside it as during the
write; the producer's rate on the fresh broker before Spark started is kept as
``producer_fill_rows_s``. Each phase's CPU seconds by process (broker, JVM, Python
workers, this process) say what bounds it on a shared machine; the broker's CPU per
written row (``spark_write_broker_cpu_us_per_row``, beside the producer's) is what the
broker pays to tell a write's rows new or re-sent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from spark_cpu import cpu_by_role, spent

from metaq.client.message import OutgoingMessage
from metaq.client.producer import Producer
from metaq.client.pull_consumer import PullConsumer, PullStatus
from metaq.spark.schema import SCHEMA_DDL, Projection
from metaq.testing.cluster import ClusterBuilder

QUEUES = 8
BODY = 1024
WARM_UP_READS = 2
TIMED_READS = 3
CEILING_BATCH_ROWS = 8192
BODY_ONLY = "body binary"


async def fill(nameserver: str, topic: str, count: int) -> float:
    """Send ``count`` 1 KiB messages with send_batch, 8 batches in flight; rows/s."""
    body = os.urandom(BODY)
    chunk = 256
    async with Producer([nameserver], compress_over_bytes=1 << 30) as producer:
        start = time.perf_counter()
        sent = 0
        while sent < count:
            rounds = []
            for _ in range(8):
                n = min(chunk, count - sent)
                if n <= 0:
                    break
                rounds.append(producer.send_batch(topic, [OutgoingMessage(body)] * n))
                sent += n
            await asyncio.gather(*rounds)
        return count / (time.perf_counter() - start)


async def consume_all(nameserver: str, topic: str) -> tuple[int, float]:
    """Every message of the topic, pulled (and decoded) by one consumer process."""
    async with PullConsumer([nameserver], "bench-consumer") as consumer:
        queues = await consumer.queues(topic)
        start = time.perf_counter()
        total = 0
        for queue in queues:
            offset = 0
            while True:
                result = await consumer.pull(topic, queue, offset, max_messages=1024)
                if result.status is not PullStatus.FOUND:
                    break
                total += sum(len(m.body) > 0 for m in result.messages)
                offset = result.next_offset
        return total, time.perf_counter() - start


def spark_session(jars: Sequence[Path] = ()) -> Any:
    """A local[2] session with the metaq source registered, and ``jars`` on Spark's
    classpath (``spark.jars``)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from metaq.spark import register
    from metaq.spark.home import use_installed_pyspark

    # Workers compiling pyspark from its zip, or metaq.* (editable, so not compiled at
    # install), at every start would be measured instead.
    use_installed_pyspark()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("bench-spark")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
    )
    if jars:
        builder = builder.config("spark.jars", ",".join(str(jar) for jar in jars))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def write(df: Any, nameserver: str, topic: str) -> None:
    df.write.format("metaq").mode("append").option("nameservers", nameserver).option(
        "topic", topic
    ).save()


def timed_rows(df: Any, column: str = "body") -> tuple[int, float]:
    """Rows read and seconds taken; ``sum(length(column))`` forces the column's bytes."""
    start = time.perf_counter()
    row = df.selectExpr("count(*) AS n", f"sum(length({column})) AS bytes").first()
    return int(row.n), time.perf_counter() - start


def steady_rows_s(df: Any, expected: int, column: str = "body") -> float:
    """Rows/s of reading ``df`` once the JVM has compiled the read: the median of
    ``TIMED_READS`` reads after ``WARM_UP_READS`` untimed ones."""
    for _ in range(WARM_UP_READS):
        timed_rows(df, column)
    rates = []
    for _ in range(TIMED_READS):
        rows, took = timed_rows(df, column)
        assert rows == expected, f"read {rows} of {expected}"
        rates.append(rows / took)
    return statistics.median(rates)


class CeilingSource(DataSource):
    """A Python source with metaq's schema whose read costs nothing: every partition
    yields one prepared Arrow batch over and over. What Spark itself spends on a Python
    source's rows bounds any such source's read; this measures that bound. Given a
    schema, it yields those columns, as the metaq source does."""

    @classmethod
    def name(cls) -> str:
        return "bench_ceiling"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return CeilingReader(int(self.options["rows"]), Projection.of(schema))


class CeilingReader(DataSourceReader):
    def __init__(self, rows: int, projection: Projection) -> None:
        self.rows = rows
        self.projection = projection

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(i) for i in range(QUEUES)]

    def read(self, partition: InputPartition) -> Any:
        from metaq.common import record
        from metaq.spark.arrow_records import to_arrow

        # One record over and over: its offsets repeat, which costs Spark nothing more.
        one = record.encode("bench-read", bytes(BODY), born_timestamp_ms=0)
        record.STAMP.pack_into(one, record.STAMP_AT, 0, 0, 0, bytes(8))
        record.seal(one, 0, len(one))
        batch = self.projection.fit(
            to_arrow(
                "broker-a",
                "bench-read",
                [memoryview(bytes(one) * CEILING_BATCH_ROWS)],
                columns=self.projection.columns,
            )
        )
        mine = self.rows // QUEUES + (partition.value < self.rows % QUEUES)
        for _ in range(mine // CEILING_BATCH_ROWS):
            yield batch
        if mine % CEILING_BATCH_ROWS:
            yield batch.slice(0, mine % CEILING_BATCH_ROWS)


def stream_latency(spark: Any, nameserver: str, topic: str, seconds: float) -> list[float]:
    latencies: list[float] = []

    def sink(batch: Any, _batch_id: int) -> None:
        now_ms = time.time() * 1000
        for row in batch.selectExpr("unix_millis(born_timestamp) AS born").collect():
            latencies.append(now_ms - row.born)

    query = (
        spark.readStream.format("metaq")
        .option("nameservers", nameserver)
        .option("topic", topic)
        .option("startingOffsets", "latest")
        .load()
        .writeStream.foreachBatch(sink)
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        while not query.recentProgress:  # the first (empty) batch has planned the offsets
            query.awaitTermination(0.2)
        asyncio.run(paced(nameserver, topic, 5000, seconds))
        deadline = time.monotonic() + 30
        while len(latencies) < int(5000 * seconds * 0.99) and time.monotonic() < deadline:
            query.awaitTermination(0.2)
    finally:
        query.stop()
    return latencies


async def paced(nameserver: str, topic: str, rate: float, seconds: float) -> None:
    body = os.urandom(BODY)
    async with Producer([nameserver]) as producer:
        start = time.monotonic()
        sent = 0
        pending: list[asyncio.Future[Any]] = []
        while (elapsed := time.monotonic() - start) < seconds:
            due = int(elapsed * rate) - sent
            for _ in range(due):
                pending.append(producer.send_async(topic, body))
            sent += max(due, 0)
            await asyncio.sleep(0.001)  # pacing: the next messages are not due yet
        await asyncio.gather(*pending)


def busy(cpu: dict[str, float]) -> float:
    """CPU seconds of the processes a read keeps busy: the JVM, its Python workers and the
    broker."""
    return sum(cpu.get(role, 0.0) for role in ("jvm", "python_workers", "broker"))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--stream-seconds", type=float, default=20.0)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    figures: dict[str, Any] = {"messages": args.messages, "body_bytes": BODY}
    builder = ClusterBuilder(
        broker_args=("--flush-mode", "async", "--set", "store.commitlog_segment_bytes=268435456"),
        small_store=False,
        ready_timeout_s=60,
    )
    try:
        with builder.start(work) as cluster:
            ns = cluster.nameserver_addresses[0]
            for topic in (
                "bench-read",
                "bench-warm",
                "bench-write",
                "bench-produce",
                "bench-stream",
            ):
                asyncio.run(cluster.create_topic(topic, queues=QUEUES))
            producer_rate = asyncio.run(fill(ns, "bench-read", args.messages))
            figures["producer_fill_rows_s"] = round(producer_rate)
            spark = spark_session()
            source_read = (
                spark.read.format("metaq").option("nameservers", ns).option("topic", "bench-read")
            )
            source = source_read.load()
            timed_rows(source)  # warm: JVM code paths and the Python workers, as for Parquet
            cpu = cpu_by_role()
            rows, took = timed_rows(source)
            assert rows == args.messages, f"read {rows} of {args.messages}"
            figures["spark_read_first_rows_s"] = round(rows / took)
            figures["spark_read_cpu_s"] = spent(cpu, cpu_by_role())
            figures["spark_read_rows_s"] = round(steady_rows_s(source, args.messages))
            spark.dataSource.register(CeilingSource)
            ceiling_read = spark.read.format("bench_ceiling").option("rows", args.messages)
            ceiling = ceiling_read.load()
            cpu = cpu_by_role()
            timed_rows(ceiling)
            figures["ceiling_read_cpu_s"] = spent(cpu, cpu_by_role())
            figures["python_source_ceiling_rows_s"] = round(steady_rows_s(ceiling, args.messages))
            # The projection pattern: only the body, through the source and the stand-in.
            body_only = source_read.schema(BODY_ONLY).load()
            ceiling_body = ceiling_read.schema(BODY_ONLY).load()
            for name, df in (
                ("spark_read_body_only", body_only),
                ("ceiling_body_only", ceiling_body),
            ):
                timed_rows(df)
                cpu = cpu_by_role()
                timed_rows(df)
                figures[f"{name}_cpu_s"] = spent(cpu, cpu_by_role())
            figures["spark_read_body_only_rows_s"] = round(steady_rows_s(body_only, args.messages))
            figures["python_source_ceiling_body_only_rows_s"] = round(
                steady_rows_s(ceiling_body, args.messages)
            )
            parquet = str(work / "parquet")
            source.select("topic", "queue", "offset", "msg_id", "body").write.parquet(parquet)
            figures["parquet_read_rows_s"] = round(
                steady_rows_s(spark.read.parquet(parquet), args.messages)
            )
            cpu = cpu_by_role()
            count, took = asyncio.run(consume_all(ns, "bench-read"))
            assert count == args.messages
            figures["consumer_rows_s"] = round(count / took)
            figures["consumer_cpu_s"] = spent(cpu, cpu_by_role())
            bodies = spark.read.parquet(parquet).select("body")
            start = time.perf_counter()
            write(bodies.sample(fraction=0.02, seed=1), ns, "bench-warm")  # both tasks' workers
            figures["spark_write_warm_up_s"] = round(time.perf_counter() - start, 1)
            cpu, start = cpu_by_role(), time.perf_counter()
            write(bodies, ns, "bench-write")
            figures["spark_write_rows_s"] = round(args.messages / (time.perf_counter() - start))
            figures["spark_write_cpu_s"] = spent(cpu, cpu_by_role())
            figures["spark_write_broker_cpu_us_per_row"] = round(
                figures["spark_write_cpu_s"].get("broker", 0.0) / args.messages * 1e6, 2
            )
            cpu = cpu_by_role()
            producer_rate = asyncio.run(fill(ns, "bench-produce", args.messages))
            figures["producer_batched_rows_s"] = round(producer_rate)
            figures["producer_batched_cpu_s"] = spent(cpu, cpu_by_role())
            figures["producer_batched_broker_cpu_us_per_row"] = round(
                figures["producer_batched_cpu_s"].get("broker", 0.0) / args.messages * 1e6, 2
            )
            written = {k: v for k, v in figures.items() if "write" in k or "batched" in k}
            print("write:", json.dumps(written), flush=True)  # kept should the stream fail
            latencies = stream_latency(spark, ns, "bench-stream", args.stream_seconds)
            figures["spark_stream_rows"] = len(latencies)
            figures["spark_stream_p50_ms"] = round(statistics.median(latencies), 1)
            figures["spark_stream_p99_ms"] = round(percentile(latencies, 0.99), 1)
            spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures["spark_read_vs_parquet_ratio"] = round(
        figures["spark_read_rows_s"] / figures["parquet_read_rows_s"], 3
    )
    figures["spark_read_vs_ceiling_ratio"] = round(
        figures["spark_read_rows_s"] / figures["python_source_ceiling_rows_s"], 3
    )
    figures["spark_read_body_only_vs_ceiling_ratio"] = round(
        figures["spark_read_body_only_rows_s"] / figures["python_source_ceiling_body_only_rows_s"],
        3,
    )
    # By CPU seconds, which a shared machine's load moves far less than rows/s: what the
    # stand-in's read cost Spark, the broker and the workers against what the source's did.
    figures["spark_read_body_only_vs_ceiling_cpu_ratio"] = round(
        busy(figures["ceiling_body_only_cpu_s"]) / busy(figures["spark_read_body_only_cpu_s"]), 3
    )
    figures["ceiling_vs_parquet_ratio"] = round(
        figures["python_source_ceiling_rows_s"] / figures["parquet_read_rows_s"], 3
    )
    figures["spark_read_vs_consumer_ratio"] = round(
        figures["spark_read_rows_s"] / figures["consumer_rows_s"], 3
    )
    figures["spark_write_vs_producer_ratio"] = round(
        figures["spark_write_rows_s"] / figures["producer_batched_rows_s"], 3
    )
    for name, value in figures.items():
        print(f"{name:32} {value:>14,}" if isinstance(value, int) else f"{name:32} {value!s:>14}")
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
