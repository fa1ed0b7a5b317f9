"""The Double-11 live room: per-minute GMV and order count per category, from ``orders``.

Reads the ``orders`` stream (JSON bodies from ``order_generator``), windows it by event
time (one minute, with a watermark for late orders), and writes each closed window once:
to Parquet (``<output>/stats``, exactly once through Spark's file sink) and back to the
``order-stats`` topic (JSON; exactly once through the brokers' idempotent-producer
sequences, the writer's producer ids being derived from the query id and batch id).
Checkpoints live under ``<output>/checkpoints``: a restart continues where it stopped.
"""

from __future__ import annotations

import time
from typing import Any

from pyspark.sql import functions as F

from metaq.spark.jobs.common import parser, session

ORDER_SCHEMA = "order_id string, item string, category string, amount double, event_time_ms long"


def aggregates(orders: Any, watermark: str) -> Any:
    """Closed one-minute windows per category: window_start, window_end, category, gmv,
    orders."""
    parsed = orders.select(F.from_json(F.col("body").cast("string"), ORDER_SCHEMA).alias("o"))
    events = parsed.select("o.*").withColumn(
        "event_time", F.timestamp_millis(F.col("event_time_ms"))
    )
    return (
        events.withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", "1 minute"), "category")
        .agg(F.round(F.sum("amount"), 2).alias("gmv"), F.count("*").alias("orders"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "category",
            "gmv",
            "orders",
        )
    )


def start(spark: Any, args: Any) -> list[Any]:
    """Start the two queries (Parquet, topic); returns them."""
    orders = (
        spark.readStream.format("metaq")
        .option("nameservers", args.nameservers)
        .option("topic", args.topic)
        .option("startingOffsets", args.starting_offsets)
        .option("consumerGroup", args.consumer_group)
        .load()
    )
    stats = aggregates(orders, args.watermark)
    trigger = {"processingTime": f"{args.trigger_seconds} seconds"}
    to_parquet = (
        stats.writeStream.format("parquet")
        .outputMode("append")
        .option("path", f"{args.output}/stats")
        .option("checkpointLocation", f"{args.output}/checkpoints/parquet")
        .trigger(**trigger)
        .start()
    )
    as_messages = stats.select(
        F.lit(args.stats_topic).alias("topic"),
        F.to_json(F.struct("window_start", "window_end", "category", "gmv", "orders")).alias(
            "body"
        ),
        F.col("category").alias("tags"),
    )
    to_topic = (
        as_messages.writeStream.format("metaq")
        .outputMode("append")
        .option("nameservers", args.nameservers)
        .option("checkpointLocation", f"{args.output}/checkpoints/topic")
        .trigger(**trigger)
        .start()
    )
    return [to_parquet, to_topic]


def _idle(query: Any) -> bool:
    """The last two batches read nothing and there is nothing more to read: the watermark
    batch, if one was due, has run."""
    progress = [p for p in query.recentProgress if p is not None]
    if len(progress) < 2:
        return False
    return (
        all(p["numInputRows"] == 0 for p in progress[-2:]) and not query.status["isDataAvailable"]
    )


def main(argv: list[str] | None = None) -> int:
    p = parser("Per-minute GMV and order count per category from the orders topic.")
    p.add_argument("--topic", default="orders")
    p.add_argument("--stats-topic", default="order-stats")
    p.add_argument("--output", required=True, help="directory for Parquet and checkpoints")
    p.add_argument("--watermark", default="10 seconds", help="how late an order may come")
    p.add_argument("--starting-offsets", default="earliest")
    p.add_argument("--consumer-group", default="live-orders")
    p.add_argument("--trigger-seconds", type=float, default=1.0)
    p.add_argument(
        "--shuffle-partitions",
        type=int,
        default=4,
        help="state partitions of the aggregation (Spark's 200 make each second's batch "
        "run 200 tiny tasks); fixed by the first run's checkpoint",
    )
    p.add_argument(
        "--until-idle",
        action="store_true",
        help="stop once every order there is has been aggregated and the windows the "
        "watermark closed were written (availableNow would not run the batch that closes them)",
    )
    p.add_argument("--run-seconds", type=float, default=0.0, help="stop after (0: run on)")
    args = p.parse_args(argv)
    spark = session("live_orders", args.master)
    spark.conf.set("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
    queries = start(spark, args)
    deadline = time.monotonic() + args.run_seconds if args.run_seconds else float("inf")
    while time.monotonic() < deadline:
        if any(q.exception() for q in queries):
            break
        if args.until_idle and all(_idle(q) for q in queries):
            break
        # Returns at once when the query stops or fails; else after half a second.
        queries[0].awaitTermination(0.5)
    for query in queries:
        query.stop()
        if query.exception() is not None:
            raise SystemExit(f"query {query.name or query.id} failed: {query.exception()}")
    print(f"per-minute stats in {args.output}/stats and topic {args.stats_topic}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
