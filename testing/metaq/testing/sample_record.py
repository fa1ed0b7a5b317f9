"""One stored record whose header fields all hold different values, for the tests that
check a partial view of the header (struct or numpy) against ``record.HEADER``: no two
fields can be confused."""

from __future__ import annotations

from typing import Any, Final

from metaq.common import record


def _stored() -> bytearray:
    raw = record.encode(
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
    record.STAMP.pack_into(raw, record.STAMP_AT, 4096, 41, 1_700_000_000_789, bytes(range(8)))
    record.seal(raw, 0, len(raw))
    return raw


SAMPLE: Final = _stored()
"""The record as the broker stores it: stamped with its offsets and store time, sealed."""
HEADER: Final[dict[str, Any]] = dict(
    zip(record.FIELDS, record.HEADER.unpack_from(SAMPLE), strict=True)
)
"""Its header, field name -> value, as ``record.HEADER`` reads it."""
