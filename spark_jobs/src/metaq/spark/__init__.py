"""metaq topics in Spark: ``format("metaq")`` for batch and streaming reads and writes.

A job calls :func:`register` once on its session, then uses the format like Spark's Kafka
source (``docs/spark.md`` lists the options, the schema and the guarantees)::

    from metaq.spark import register
    register(spark)
    df = (
        spark.read.format("metaq")
        .option("nameservers", "ns:9876")
        .option("topic", "orders")
        .load()
    )
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register ``format("metaq")`` on ``spark`` and turn on Python filter push-down, which
    the data source relies on to apply tag, time and queue filters at the brokers."""
    from metaq.spark.source import MetaqDataSource

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(MetaqDataSource)
