"""Spark's numpy views of the record header read what ``record.HEADER`` reads."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from metaq.common import record
from metaq.common.record_dtype import header_dtype
from metaq.spark import arrow_records

SAMPLE = record.encode(
    "orders",
    b"body",
    queue_id=7,
    tags="tag-abcd",
    keys=("key-1", "key-2"),
    properties={"p": "v", "DELAY": "2"},
    flags=record.FLAG_DELAYED,
    msg_id=bytes(range(16)),
    born_timestamp_ms=1_700_000_000_456,
    born_host=bytes([10, 0, 0, 1, 0x90, 0x1F, 0, 0]),
    reconsume_times=3,
)
record.STAMP.pack_into(SAMPLE, record.STAMP_AT, 4096, 41, 1_700_000_000_789, bytes(range(8)))
record.seal(SAMPLE, 0, len(SAMPLE))
HEADER = dict(zip(record.FIELDS, record.HEADER.unpack_from(SAMPLE), strict=True))


def _value(raw: Any) -> int | bytes:
    return bytes(raw) if isinstance(raw, np.ndarray) else int(raw)


@pytest.mark.parametrize(
    "dtype", [header_dtype(), arrow_records._HEADER], ids=["whole-header", "arrow-records"]
)
def test_a_header_dtype_agrees_with_the_header_field_by_field(dtype: np.dtype[Any]) -> None:
    row = np.frombuffer(bytes(SAMPLE[: dtype.itemsize]), dtype)[0]
    assert dtype.names is not None

    got = {name: _value(row[name]) for name in dtype.names}

    assert len(set(HEADER.values())) == len(HEADER)  # no two fields could be confused
    assert got == {name: HEADER[name] for name in dtype.names}


def test_the_prefix_arrow_records_checks_is_the_headers() -> None:
    view = arrow_records._PREFIX
    names = record.view_fields(view)

    assert dict(zip(names, view.unpack_from(SAMPLE), strict=True)) == {
        name: HEADER[name] for name in names
    }
