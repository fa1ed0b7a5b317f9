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

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
HIDE_TRACEBACK_CONF = "spark.sql.execution.pyspark.udf.hideTraceback.enabled"


def register(spark: Any) -> None:
    """Register ``format("metaq")`` on ``spark``; turn on Python filter push-down, which
    the data source relies on to apply tag, time and queue filters at the brokers; and,
    unless the session sets it, Spark's switch that reports a Python error by its message
    alone, so a bad option's error leads with what was wrong instead of ending a traceback
    (set ``spark.sql.execution.pyspark.udf.hideTraceback.enabled=false`` for tracebacks,
    of Python UDFs' errors too)."""
    from metaq.spark.source import MetaqDataSource

    spark.conf.set(PUSHDOWN_CONF, "true")
    if HIDE_TRACEBACK_CONF not in spark.conf.getAll:
        spark.conf.set(HIDE_TRACEBACK_CONF, "true")
    spark.dataSource.register(MetaqDataSource)
