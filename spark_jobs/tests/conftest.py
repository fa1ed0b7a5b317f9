"""One SparkSession and one metaq cluster for the Spark tests (starting either costs
seconds; each test uses topics of its own)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from metaq.testing import Cluster, ClusterBuilder


def local_spark(app_name: str = "metaq-tests") -> Any:
    """One local SparkSession for a test run: two cores, a failed task tried up to four
    times (``local[2,4]``; plain ``local`` never retries), loopback only, no UI, two shuffle
    partitions, executors' Python = this interpreter (so they import the installed
    ``metaq.spark``, and pyspark with its compiled bytecode: metaq.spark.home),
    ``format("metaq")`` registered."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # The workspace's own modules are not compiled at install (they are editable): let the
    # workers cache their bytecode instead of compiling metaq.* in each one.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    from pyspark.sql import SparkSession

    from metaq.spark import register
    from metaq.spark.home import use_installed_pyspark

    use_installed_pyspark()

    spark = (
        SparkSession.builder.master("local[2,4]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = local_spark()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = ClusterBuilder(groups=("broker-a", "broker-b")).start(
        tmp_path_factory.mktemp("spark-cluster")
    )
    yield started
    started.stop()
