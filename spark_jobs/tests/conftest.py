"""One SparkSession and one metaq cluster for the Spark tests (starting either costs
seconds; each test uses topics of its own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metaq.spark.testing import Cluster, local_spark, start_cluster


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = local_spark()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = start_cluster(Path(tmp_path_factory.mktemp("spark-cluster")))
    yield started
    started.stop()
