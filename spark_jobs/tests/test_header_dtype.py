"""Spark's numpy views of the record header read what ``record.HEADER`` reads."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from metaq.common import record
from metaq.common.record_dtype import header_dtype
from metaq.spark import arrow_records
from metaq.testing.sample_record import HEADER, SAMPLE


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
