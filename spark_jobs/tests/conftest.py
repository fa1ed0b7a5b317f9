"""One SparkSession and one metaq cluster for the Spark tests (starting either costs
seconds; each test uses topics of its own)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _register_sibling(name: str) -> None:
    """Make a module beside this file importable by name (tests import in
    importlib mode, so this folder is not on sys.path)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


_register_sibling("spark_testing")

from spark_testing import Cluster, local_spark, start_cluster  # noqa: E402


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
