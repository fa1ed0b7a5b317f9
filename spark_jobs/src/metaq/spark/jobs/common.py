"""What every job shares: the command line's cluster flags and the SparkSession."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--nameservers",
        default=os.environ.get("METAQ_NAMESERVERS", "127.0.0.1:9876"),
        help="metaq nameservers, host:port comma list (default: $METAQ_NAMESERVERS)",
    )
    p.add_argument(
        "--master",
        default=None,
        help="Spark master (local[*], spark://host:7077, ...); under spark-submit its own "
        "--master wins; default local[*]",
    )
    return p


def session(app_name: str, master: str | None) -> Any:
    """The job's SparkSession with ``format("metaq")`` registered. Executors run this
    interpreter unless PYSPARK_PYTHON says otherwise (they must import metaq.spark)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from metaq.spark import register
    from metaq.spark.home import use_installed_pyspark

    use_installed_pyspark()

    builder = SparkSession.builder.appName(app_name)
    # spark-submit starts this driver through its own JVM (PYSPARK_GATEWAY_PORT) with the
    # master it was given; otherwise the flag, or local[*].
    if master or not os.environ.get("PYSPARK_GATEWAY_PORT"):
        builder = builder.master(master or "local[*]")
    spark = builder.getOrCreate()
    register(spark)
    return spark
