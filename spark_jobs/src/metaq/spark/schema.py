"""The schema of a metaq topic as a Spark table, its Arrow twin, and the projections of it a
read may ask for.

A read given a schema (``spark.read.format("metaq").schema("body binary")``) yields only
those columns, in that order and spelling: Spark's Python Data Source API prunes no
columns itself (``select`` after ``load`` still moves every column through Spark), so a
user schema is how a job pays only for what it reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from metaq.common.config import ConfigError

SCHEMA: Final = StructType(
    [
        StructField("topic", StringType()),
        StructField("broker", StringType()),
        StructField("queue", IntegerType()),
        StructField("offset", LongType()),
        StructField("msg_id", StringType()),
        StructField("keys", ArrayType(StringType())),
        StructField("tags", StringType()),
        StructField("properties", MapType(StringType(), StringType())),
        StructField("body", BinaryType()),
        StructField("born_timestamp", TimestampType()),
        StructField("store_timestamp", TimestampType()),
    ]
)
# A DDL string for DataSource.schema(): Python workers have no SparkContext to hand a
# StructType over with.
SCHEMA_DDL: Final = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in SCHEMA.fields)
# Spark's own conversion, so batches match what it checks them against: timestamps are
# microseconds in UTC (the broker stores milliseconds).
ARROW_SCHEMA: Final = to_arrow_schema(SCHEMA, timezone="UTC")
COLUMNS: Final = tuple(SCHEMA.fieldNames())


class SchemaError(ConfigError):
    """A schema given to ``format("metaq")`` names a column it does not have, or a type it
    does not give."""


@dataclass(frozen=True)
class Projection:
    """The columns a read yields: ``columns`` are the source's names, ``arrow`` the batch
    schema Spark expects (the given schema's order, spelling and nullability)."""

    columns: tuple[str, ...]
    arrow: pa.Schema

    @classmethod
    def of(cls, schema: StructType) -> Projection:
        """The projection a user schema asks for; SchemaError naming the first column that
        is not the source's or not of its type. Names match case-insensitively, as Spark's
        columns do."""
        ours = {f.name: f.dataType for f in SCHEMA.fields}
        by_lower = {name.lower(): name for name in ours}
        if not schema.fields:
            raise SchemaError(
                "the schema given to format('metaq') names no column; name some of: " + SCHEMA_DDL
            )
        columns: list[str] = []
        for field in schema.fields:
            name = by_lower.get(field.name.lower())
            if name is None:
                raise SchemaError(
                    f"column {field.name!r} of the schema given to format('metaq') is not one "
                    f"of its columns: {SCHEMA_DDL} (leave the schema out to read them all)"
                )
            if name in columns:
                raise SchemaError(
                    f"column {field.name!r} is named twice in the schema given to "
                    "format('metaq'); name each column once"
                )
            given, wanted = field.dataType.simpleString(), ours[name].simpleString()
            if given != wanted:
                raise SchemaError(
                    f"column {field.name!r} is {given} in the schema given to format('metaq'), "
                    f"which gives it as {wanted}: ask for {field.name} {wanted} and cast after "
                    f"load, e.g. col({field.name!r}).cast({given!r})"
                )
            columns.append(name)
        return cls(tuple(columns), to_arrow_schema(schema, timezone="UTC"))

    def fit(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` (of :attr:`columns`, as the source names and types them) as Spark
        expects it: renamed to the given spelling, nested nullability as given."""
        if batch.schema.equals(self.arrow):
            return batch
        arrays = [
            array if array.type == field.type else array.cast(field.type)
            for array, field in zip(batch.columns, self.arrow, strict=True)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow)


FULL: Final = Projection(COLUMNS, ARROW_SCHEMA)
"""Every column, as :data:`SCHEMA` has them."""
