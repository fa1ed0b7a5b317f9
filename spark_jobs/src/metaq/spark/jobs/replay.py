"""Parquet (an archive) back to a topic: a backfill that keeps the messages' ids.

The archived ``msg_id`` goes with each message, so within the brokers' de-dup window
(``dedup_window_ms``) a replay run twice, or a replay into the topic the messages still
sit in, stores each message once.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from metaq.spark.jobs.common import parser, session

COLUMNS = ("body", "keys", "tags", "properties", "msg_id")


def run(spark: Any, nameservers: str, source: str, topic: str) -> int:
    """Send every archived message to ``topic``; returns how many rows were sent."""
    archived = spark.read.parquet(source)
    rows = archived.select(F.lit(topic).alias("topic"), *COLUMNS)
    rows.write.format("metaq").mode("append").option("nameservers", nameservers).save()
    return int(archived.count())


def main(argv: list[str] | None = None) -> int:
    p = parser("Send archived messages (Parquet) back to a metaq topic, ids preserved.")
    p.add_argument("--input", required=True, help="the archive's data directory")
    p.add_argument("--topic", required=True)
    args = p.parse_args(argv)
    sent = run(session("replay", args.master), args.nameservers, args.input, args.topic)
    print(f"replayed {sent} messages into {args.topic}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
