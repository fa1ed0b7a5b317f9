"""Spark's Python processes import the installed pyspark (compiled bytecode), not the
pyspark.zip Spark puts first on their path (compiled from source in every process)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from metaq.spark.home import INSTALLED, linked_home, use_installed_pyspark


def test_the_linked_home_has_the_installations_scripts_and_jars_and_no_zip() -> None:
    home = linked_home()
    assert (home / "bin").resolve() == INSTALLED / "bin"
    assert (home / "jars").resolve() == INSTALLED / "jars"
    assert (INSTALLED / "python" / "lib" / "pyspark.zip").exists()
    assert not (home / "python").exists()
    assert linked_home() == home


def test_a_spark_home_already_set_is_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    assert use_installed_pyspark() == tmp_path


def test_planning_and_reading_processes_import_the_installed_pyspark(spark: Any) -> None:
    class WhereFrom(DataSource):
        """Reports the pyspark its planning process and its executor process import."""

        @classmethod
        def name(cls) -> str:
            return "where_from"

        def schema(self) -> str:
            return "planner string, executor string"

        def reader(self, schema: Any) -> DataSourceReader:
            return WhereReader()

    class WhereReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            import pyspark

            return [InputPartition(pyspark.__file__)]

        def read(self, partition: InputPartition) -> Iterator[tuple[str, str]]:
            import pyspark

            yield partition.value, str(pyspark.__file__)

    spark.dataSource.register(WhereFrom)
    row = spark.read.format("where_from").load().first()
    assert row.planner == str(INSTALLED / "__init__.py")
    assert row.executor == str(INSTALLED / "__init__.py")
