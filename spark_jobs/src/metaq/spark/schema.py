"""The fixed schema of a metaq topic as a Spark table, and its Arrow twin."""

from __future__ import annotations

from typing import Final

import pyarrow as pa

SCHEMA_DDL: Final = (
    "topic string, broker string, queue int, offset long, msg_id string, keys array<string>, "
    "tags string, properties map<string,string>, body binary, born_timestamp timestamp, "
    "store_timestamp timestamp"
)

# Spark hands Arrow timestamps over as microseconds in UTC; the broker stores milliseconds.
ARROW_SCHEMA: Final = pa.schema(
    [
        ("topic", pa.string()),
        ("broker", pa.string()),
        ("queue", pa.int32()),
        ("offset", pa.int64()),
        ("msg_id", pa.string()),
        ("keys", pa.list_(pa.string())),
        ("tags", pa.string()),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("body", pa.binary()),
        ("born_timestamp", pa.timestamp("us", tz="UTC")),
        ("store_timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
