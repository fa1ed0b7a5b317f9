"""Numpy views of the record header, derived from ``record.FIELDS`` like every other view.

For the broker's dispatcher and Spark's Arrow paths, which decode many headers at once;
it needs numpy (``metaq-common[numpy]``), which the client does not.
"""

from __future__ import annotations

import re
from typing import Any, Final

import numpy as np

from metaq.common import record

_NUMPY: Final = {"I": "<u4", "i": "<i4", "q": "<i8", "H": "<u2"}
_BYTES: Final = re.compile(r"(\d+)s")


def header_dtype(*names: str, itemsize: int = record.HEADER_SIZE) -> np.dtype[Any]:
    """A dtype of ``itemsize`` bytes (a header, or a header and what follows it) holding
    the header fields ``names`` (all when none are named) at their offsets; the bytes of
    other fields are left alone. Byte fields are uint8 arrays."""
    fields = [record.FIELDS[name] for name in names] if names else list(record.FIELDS.values())
    formats: list[Any] = []
    for field in fields:
        raw = _BYTES.fullmatch(field.code)
        formats.append(("u1", int(raw.group(1))) if raw else _NUMPY[field.code])
    return np.dtype(
        {
            "names": [field.name for field in fields],
            "formats": formats,
            "offsets": [field.offset for field in fields],
            "itemsize": itemsize,
        }
    )
