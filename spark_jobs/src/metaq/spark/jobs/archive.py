"""A topic to Parquet, partitioned by store date and hour, resumable from its checkpoint.

``python -m metaq.spark.jobs.archive --topic orders --output /data/archive/orders`` reads
what is new since the last run (Spark's availableNow trigger: everything there now, then
stop) into ``<output>/data/date=YYYY-MM-DD/hour=HH``; run it again (from cron, say) and it
continues from ``<output>/checkpoint``. Every column of the source is kept, message ids
included, so :mod:`~metaq.spark.jobs.replay` can send the messages back as they were.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from metaq.spark.jobs.common import parser, session


def run(spark: Any, nameservers: str, topic: str, output: str) -> int:
    """Archive what is new; returns the rows written by this run."""
    source = (
        spark.readStream.format("metaq")
        .option("nameservers", nameservers)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    dated = source.withColumn("date", F.date_format("store_timestamp", "yyyy-MM-dd")).withColumn(
        "hour", F.date_format("store_timestamp", "HH")
    )
    query = (
        dated.writeStream.format("parquet")
        .partitionBy("date", "hour")
        .option("path", f"{output}/data")
        .option("checkpointLocation", f"{output}/checkpoint")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"archive of {topic} failed: {query.exception()}")
    return sum(p["numInputRows"] for p in query.recentProgress)


def main(argv: list[str] | None = None) -> int:
    p = parser("Archive a metaq topic to Parquet partitioned by date and hour.")
    p.add_argument("--topic", required=True)
    p.add_argument("--output", required=True)
    args = p.parse_args(argv)
    rows = run(session("archive", args.master), args.nameservers, args.topic, args.output)
    print(f"archived {rows} messages of {args.topic} to {args.output}/data")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
