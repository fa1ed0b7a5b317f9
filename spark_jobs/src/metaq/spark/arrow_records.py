"""Pulled commitlog records straight into Arrow columns, without a Python object per row.

A pull's payload is records back to back (``docs/storage-format.md``). One pass in
Python finds where each record starts and checks its CRC; every fixed-offset header
field is then gathered for all rows at once with numpy, and the variable parts (tags,
body) are cut out as one binary array with offsets. Only the rare parts pay per row in
Python: keys and properties of the rows that have them, and bodies the producer
compressed. Reading is CPU-bound in Spark's Python workers, so this is the read path's
throughput (docs/spark.md, "Benchmark").
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from zlib_ng.zlib_ng import crc32

from metaq.common import record
from metaq.common.errors import InvalidRecord
from metaq.spark.schema import ARROW_SCHEMA

_PREFIX: Final = struct.Struct("<III")  # total size, magic, CRC
_HEX: Final = np.frombuffer(b"0123456789abcdef", np.uint8)
_KEYS_TYPE: Final = ARROW_SCHEMA.field("keys").type
_PROPS_TYPE: Final = ARROW_SCHEMA.field("properties").type
_TIME_TYPE: Final = ARROW_SCHEMA.field("store_timestamp").type
_INLINE: Final = np.arange(12)

Ints = npt.NDArray[np.int64]


def record_starts(payload: memoryview, *, verify: bool = True) -> list[int]:
    """Where each record of ``payload`` starts; InvalidRecord at a torn or damaged one."""
    starts: list[int] = []
    at = 0
    end = len(payload)
    unpack = _PREFIX.unpack_from
    while at < end:
        if end - at < record.HEADER_SIZE:
            raise InvalidRecord(f"{end - at} bytes cannot hold a {record.HEADER_SIZE}-byte header")
        total, magic, crc = unpack(payload, at)
        if magic != record.MAGIC:
            raise InvalidRecord(
                f"unknown record magic {magic:#010x} "
                f"(this build reads format {record.FORMAT_VERSION})"
            )
        if total < record.HEADER_SIZE or at + total > end:
            raise InvalidRecord(f"record size {total} runs past the pulled bytes")
        if verify and crc != crc32(payload[at + record.CRC_START : at + total]):
            raise InvalidRecord("record CRC mismatch")
        starts.append(at)
        at += total
    return starts


def to_arrow(
    broker: str, topic: str, payload: memoryview, *, tags: frozenset[str] | None = None,
    end_offset: int | None = None,
) -> pa.RecordBatch:  # fmt: skip
    """The records of ``payload`` (all of ``topic``) as one batch in
    :data:`~metaq.spark.schema.ARROW_SCHEMA`; rows whose tags are not in ``tags`` (None:
    keep all) or whose queue offset is ``end_offset`` or more are dropped."""
    starts = np.array(record_starts(payload), np.int64)
    n = len(starts)
    raw = np.frombuffer(payload, np.uint8)
    total = _field(raw, starts, 0, "<u4").astype(np.int64)
    topic_len = _field(raw, starts, 88, "<u2").astype(np.int64)
    tags_len = _field(raw, starts, 90, "<u2").astype(np.int64)
    keys_len = _field(raw, starts, 92, "<u2").astype(np.int64)
    props_len = _field(raw, starts, 94, "<u2").astype(np.int64)
    body_len = _field(raw, starts, 96, "<u4").astype(np.int64)
    if not np.array_equal(
        total, record.HEADER_SIZE + topic_len + tags_len + keys_len + props_len + body_len
    ):
        raise InvalidRecord("a record's size disagrees with its field lengths")
    topic_at = starts + record.HEADER_SIZE
    tags_at = topic_at + topic_len
    keys_at = tags_at + tags_len
    props_at = keys_at + keys_len
    body_at = props_at + props_len
    name = topic.encode()
    if n and not (
        np.all(topic_len == len(name))
        and np.array_equal(_gather_fixed(raw, topic_at, len(name)), np.tile(
            np.frombuffer(name, np.uint8), (n, 1)))
    ):  # fmt: skip
        raise InvalidRecord(f"a record pulled from {topic!r} belongs to another topic")
    tags_col = _strings(payload, tags_at, tags_len, pa.string())
    columns: list[Any] = [
        _constant(name, n),
        _constant(broker.encode(), n),
        pa.array(_field(raw, starts, 48, "<i4"), pa.int32()),
        pa.array(_field(raw, starts, 24, "<i8"), pa.int64()),
        _hex_ids(_gather_fixed(raw, starts + 64, 16)),
        _keys(payload, keys_at, keys_len),
        tags_col,
        _properties(payload, props_at, props_len),
        _bodies(payload, body_at, body_len, _field(raw, starts, 12, "<u4")),
        pa.array(_field(raw, starts, 56, "<i8") * 1000, _TIME_TYPE),
        pa.array(_field(raw, starts, 32, "<i8") * 1000, _TIME_TYPE),
    ]
    batch = pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
    keep = None
    if tags is not None:
        keep = pc.is_in(tags_col, value_set=pa.array(sorted(tags), pa.string()))
    if end_offset is not None:
        below = pc.less(batch.column(3), end_offset)
        keep = below if keep is None else pc.and_(keep, below)
    if keep is not None and not pc.all(keep).as_py():
        batch = batch.filter(keep)
    return batch


def _field(raw: npt.NDArray[np.uint8], starts: Ints, at: int, dtype: str) -> Any:
    """The header field at byte ``at`` of every record, as one numpy array."""
    width = np.dtype(dtype).itemsize
    return _gather_fixed(raw, starts + at, width).view(dtype).reshape(-1)


def _gather_fixed(raw: npt.NDArray[np.uint8], at: Ints, width: int) -> npt.NDArray[np.uint8]:
    gathered: npt.NDArray[np.uint8] = raw[at[:, None] + np.arange(width)]
    return gathered


def _constant(text: bytes, n: int) -> pa.Array:
    """A string column holding ``text`` in every row, built without a row loop."""
    offsets = np.arange(n + 1, dtype=np.int32) * len(text)
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(text * n)]
    )


def _hex_ids(ids: npt.NDArray[np.uint8]) -> pa.Array:
    """16-byte message ids as 32-hex-digit strings, as :class:`Message` shows them."""
    n = len(ids)
    digits = np.empty((n, 32), np.uint8)
    digits[:, 0::2] = _HEX[ids >> 4]
    digits[:, 1::2] = _HEX[ids & 0x0F]
    offsets = np.arange(0, 32 * (n + 1), 32, dtype=np.int32)
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(digits.tobytes())]
    )


def _strings(payload: memoryview, at: Ints, lengths: Ints, kind: pa.DataType) -> pa.Array:
    """The byte ranges ``[at, at + lengths)`` as one string (or binary) array.

    Built as a binary-view array over the payload itself (views are fixed-width, so
    numpy fills them for all rows at once) and cast to plain binary, which copies each
    range once in Arrow's C++ rather than slicing once per row in Python."""
    n = len(at)
    if not lengths.any():
        return pa.Array.from_buffers(
            kind, n, [None, pa.py_buffer(np.zeros(n + 1, np.int32)), pa.py_buffer(b"")]
        )
    raw = np.frombuffer(payload, np.uint8)
    views = np.zeros((n, 16), np.uint8)
    views[:, 0:4] = lengths.astype("<i4").view(np.uint8).reshape(n, 4)
    # Up to 12 bytes live inside the view itself, zero-padded; longer ones keep their
    # first 4 bytes there and point into buffer 0 at their offset.
    head = raw[np.minimum(at[:, None] + _INLINE, len(raw) - 1)]
    head[_INLINE[None, :] >= lengths[:, None]] = 0
    short = lengths <= len(_INLINE)
    views[short, 4:16] = head[short]
    long = ~short
    views[long, 4:8] = head[long, 0:4]
    views[long, 12:16] = at[long].astype("<i4").view(np.uint8).reshape(-1, 4)
    array = pa.Array.from_buffers(
        pa.binary_view(), n, [None, pa.py_buffer(views), pa.py_buffer(payload)]
    ).cast(pa.binary())
    if kind == pa.binary():
        return array
    try:
        return array.cast(kind)
    except pa.ArrowInvalid as exc:
        raise InvalidRecord(f"a text field of a record is not UTF-8: {exc}") from None


def _bodies(payload: memoryview, at: Ints, lengths: Ints, flags: Any) -> pa.Array:
    compressed = (flags & record.FLAG_COMPRESSED) != 0
    if not compressed.any():
        return _strings(payload, at, lengths, pa.binary())
    bodies: list[bytes] = []
    for a, m, c in zip(at.tolist(), lengths.tolist(), compressed.tolist(), strict=True):
        body = bytes(payload[a : a + m])
        if c:
            try:
                body = zlib.decompress(body)
            except zlib.error as exc:
                raise InvalidRecord(f"a body flagged compressed does not inflate: {exc}") from None
        bodies.append(body)
    return pa.array(bodies, pa.binary())


def _keys(payload: memoryview, at: Ints, lengths: Ints) -> pa.Array:
    n = len(at)
    if not lengths.any():
        return pa.ListArray.from_arrays(
            pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()), type=_KEYS_TYPE
        )
    try:
        rows = [_split(payload, a, m) for a, m in zip(at.tolist(), lengths.tolist(), strict=True)]
    except UnicodeDecodeError as exc:
        raise InvalidRecord(f"a record's keys are not UTF-8: {exc}") from None
    return pa.array(rows, _KEYS_TYPE)


def _split(payload: memoryview, at: int, length: int) -> Sequence[str]:
    return str(payload[at : at + length], "utf-8").split(" ") if length else ()


def _properties(payload: memoryview, at: Ints, lengths: Ints) -> pa.Array:
    n = len(at)
    if not lengths.any():
        return pa.MapArray.from_arrays(
            pa.array(np.zeros(n + 1, np.int32)),
            pa.array([], pa.string()),
            pa.array([], pa.string()),
            type=_PROPS_TYPE,
        )
    try:
        rows = [
            list(record.decode_properties(bytes(payload[a : a + m])).items()) if m else []
            for a, m in zip(at.tolist(), lengths.tolist(), strict=True)
        ]
    except UnicodeDecodeError as exc:
        raise InvalidRecord(f"a record's properties are not UTF-8: {exc}") from None
    return pa.array(rows, _PROPS_TYPE)
