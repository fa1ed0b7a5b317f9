"""Pulled commitlog records straight into Arrow columns, without a Python object per row.

A pull's payload is records back to back (``docs/storage-format.md``). One pass in
Python finds where each record starts and checks its CRC; the fixed-size headers of all
rows are then gathered with one numpy index per payload, and the variable parts (tags,
body) become one binary array whose rows point into the payloads as they arrived, so
several pulls make one batch without being joined first. Only the rare parts pay per row
in Python: keys and properties of the rows that have them, and bodies the producer
compressed. Reading is CPU-bound in Spark's Python workers, so this is the read path's
throughput (docs/spark.md, "Benchmark").
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from zlib_ng.zlib_ng import crc32

from metaq.common import record
from metaq.common.errors import InvalidRecord
from metaq.common.record_dtype import header_dtype
from metaq.spark.schema import ARROW_SCHEMA, COLUMNS

_PREFIX: Final = record.header_view("size", "magic", "crc")
_HEX: Final = np.frombuffer(b"0123456789abcdef", np.uint8)
_KEYS_TYPE: Final = ARROW_SCHEMA.field("keys").type
_PROPS_TYPE: Final = ARROW_SCHEMA.field("properties").type
_TIME_TYPE: Final = ARROW_SCHEMA.field("store_timestamp").type
_INLINE: Final = np.arange(12)
_PARTS: Final = ("tags_len", "keys_len", "props_len", "body_len")
# The header fields the columns need.
_HEADER: Final = header_dtype(
    "size", "flags", "queue_offset", "store_timestamp_ms", "queue_id", "born_timestamp_ms",
    "msg_id", "topic_len", "tags_len", "keys_len", "props_len", "body_len",
)  # fmt: skip

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
    broker: str, topic: str, payloads: Sequence[memoryview], *,
    tags: frozenset[str] | None = None, end_offset: int | None = None,
    from_ms: int | None = None, until_ms: int | None = None,
    columns: Sequence[str] = COLUMNS,
) -> pa.RecordBatch:  # fmt: skip
    """The records of ``payloads`` (all of ``topic``, in order) as one batch of ``columns``
    (named and typed as in :data:`~metaq.spark.schema.ARROW_SCHEMA`), keeping the rows
    whose tags are in ``tags`` (None: all), whose queue offset is below ``end_offset`` and
    whose store time is in ``[from_ms, until_ms)``. Only the columns asked for are built:
    a body-only read neither decodes keys and properties nor formats ids."""
    name = topic.encode()
    runs = [_Run(payload, name) for payload in payloads]
    rows = _Rows.of(runs, len(name))
    head = rows.head
    keep = np.ones(len(head), bool)
    if end_offset is not None:
        keep &= head["queue_offset"] < end_offset
    if from_ms is not None:
        keep &= head["store_timestamp_ms"] >= from_ms
    if until_ms is not None:
        keep &= head["store_timestamp_ms"] < until_ms
    tags_col = None
    if tags is not None:
        tags_col = rows.tags()
        wanted = pa.array(sorted(tags), pa.string())
        keep &= pc.is_in(tags_col, value_set=wanted).to_numpy(zero_copy_only=False)
    if not keep.all():
        rows = rows.take(keep)
        if tags_col is not None:
            tags_col = tags_col.filter(pa.array(keep))
    head = rows.head
    n = len(head)
    build: dict[str, Callable[[], pa.Array]] = {
        "topic": lambda: _constant(name, n),
        "broker": lambda: _constant(broker.encode(), n),
        "queue": lambda: pa.array(np.ascontiguousarray(head["queue_id"]), pa.int32()),
        "offset": lambda: pa.array(np.ascontiguousarray(head["queue_offset"]), pa.int64()),
        "msg_id": lambda: _hex_ids(head["msg_id"]),
        "keys": rows.keys,
        "tags": lambda: rows.tags() if tags_col is None else tags_col,
        "properties": rows.properties,
        "body": rows.bodies,
        "born_timestamp": lambda: pa.array(head["born_timestamp_ms"] * 1000, _TIME_TYPE),
        "store_timestamp": lambda: pa.array(head["store_timestamp_ms"] * 1000, _TIME_TYPE),
    }
    return pa.RecordBatch.from_arrays(
        [build[c]() for c in columns], schema=pa.schema([ARROW_SCHEMA.field(c) for c in columns])
    )


class _Run:
    """One payload's records: where they start and their headers, checked."""

    def __init__(self, payload: memoryview, topic: bytes) -> None:
        self.payload = payload
        self.raw = np.frombuffer(payload, np.uint8)
        self.starts: Ints = np.array(record_starts(payload), np.int64)
        self.headers = _gather(self.raw, self.starts, _HEADER)
        head = self.headers
        sizes = (
            record.HEADER_SIZE + head["topic_len"].astype(np.int64) + head["tags_len"]
            + head["keys_len"] + head["props_len"] + head["body_len"].astype(np.int64)
        )  # fmt: skip
        if not np.array_equal(head["size"], sizes):
            raise InvalidRecord("a record's size disagrees with its field lengths")
        # Lengths first: a shorter record's name could not be read whole.
        name = np.dtype(f"S{len(topic)}")
        if not np.all(head["topic_len"] == len(topic)) or not np.all(
            _gather(self.raw, self.starts + record.HEADER_SIZE, name) == topic
        ):
            raise InvalidRecord(f"a record pulled from {topic.decode()!r} belongs to another topic")


def _gather(raw: npt.NDArray[np.uint8], at: Ints, dtype: np.dtype[Any]) -> Any:
    """A ``dtype`` value read at each byte position ``at`` of ``raw``, as one array.

    A view of ``raw`` with a stride of one byte has a value starting at every byte, so one
    fancy index copies out all of them; the caller has checked that each fits."""
    if len(raw) < dtype.itemsize:
        return np.empty(0, dtype)
    every = np.ndarray((len(raw) - dtype.itemsize + 1,), dtype, buffer=raw, strides=(1,))
    return every[at]


class _Rows:
    """The rows of ``runs``: each one's header, payload and record start; the variable
    parts (tags, keys, properties, body) are byte ranges of the payloads, read on demand."""

    def __init__(
        self, runs: list[_Run], head: Any, buffer: Ints, start: Ints, name_len: int
    ) -> None:
        self.runs = runs
        self.head = head
        self.buffer = buffer
        self.start = start
        self.name_len = name_len
        # Rows stay in payload order, so each payload's rows are one slice.
        bounds = np.searchsorted(buffer, np.arange(len(runs) + 1)).tolist()
        self.rows = [slice(a, b) for a, b in itertools.pairwise(bounds)]

    @classmethod
    def of(cls, runs: list[_Run], name_len: int) -> _Rows:
        if not runs:
            return cls(runs, np.empty(0, _HEADER), np.empty(0, np.int64), np.empty(0, np.int64), 0)
        buffer = np.repeat(np.arange(len(runs), dtype=np.int64), [len(r.starts) for r in runs])
        head = np.concatenate([run.headers for run in runs])
        return cls(runs, head, buffer, np.concatenate([run.starts for run in runs]), name_len)

    def take(self, keep: npt.NDArray[np.bool_]) -> _Rows:
        return _Rows(self.runs, self.head[keep], self.buffer[keep], self.start[keep], self.name_len)

    def _part(self, length: str) -> tuple[Ints, Ints]:
        """Where each row's variable part ``length`` names starts, and its length: the
        parts follow the topic name in the order of :data:`_PARTS`."""
        at = self.start + record.HEADER_SIZE + self.name_len
        for before in _PARTS[: _PARTS.index(length)]:
            at = at + self.head[before].astype(np.int64)
        return at, self.head[length].astype(np.int64)

    def tags(self) -> pa.Array:
        return self.strings(*self._part("tags_len"), pa.string())

    def keys(self) -> pa.Array:
        return self._keys(*self._part("keys_len"))

    def properties(self) -> pa.Array:
        return self._properties(*self._part("props_len"))

    def bodies(self) -> pa.Array:
        return self._bodies(*self._part("body_len"), self.head["flags"])

    def strings(self, at: Ints, lengths: Ints, kind: pa.DataType) -> pa.Array:
        """The byte ranges ``[at, at + lengths)`` as one string (or binary) array.

        Built as a binary-view array over the payloads themselves (views are fixed-width,
        so numpy fills them for all rows at once) and cast to plain binary, which copies
        each range once in Arrow's C++ rather than slicing once per row in Python."""
        n = len(at)
        if not lengths.any():
            return pa.Array.from_buffers(
                kind, n, [None, pa.py_buffer(np.zeros(n + 1, np.int32)), pa.py_buffer(b"")]
            )
        views = np.zeros((n, 16), np.uint8)
        views[:, 0:4] = lengths.astype("<i4").view(np.uint8).reshape(n, 4)
        # Up to 12 bytes live inside the view itself, zero-padded; longer ones keep their
        # first 4 bytes there and point at their payload and offset in it.
        head = np.empty((n, len(_INLINE)), np.uint8)
        for run, rows in zip(self.runs, self.rows, strict=True):
            head[rows] = run.raw[np.minimum(at[rows, None] + _INLINE, len(run.raw) - 1)]
        head[_INLINE[None, :] >= lengths[:, None]] = 0
        short = lengths <= len(_INLINE)
        views[short, 4:16] = head[short]
        long = ~short
        views[long, 4:8] = head[long, 0:4]
        views[long, 8:12] = self.buffer[long].astype("<i4").view(np.uint8).reshape(-1, 4)
        views[long, 12:16] = at[long].astype("<i4").view(np.uint8).reshape(-1, 4)
        buffers = [pa.py_buffer(run.payload) for run in self.runs]
        array = pa.Array.from_buffers(
            pa.binary_view(), n, [None, pa.py_buffer(views), *buffers]
        ).cast(pa.binary())
        if kind == pa.binary():
            return array
        try:
            return array.cast(kind)
        except pa.ArrowInvalid as exc:
            raise InvalidRecord(f"a text field of a record is not UTF-8: {exc}") from None

    def _bodies(self, at: Ints, lengths: Ints, flags: Any) -> pa.Array:
        compressed = (flags & record.FLAG_COMPRESSED) != 0
        if not compressed.any():
            return self.strings(at, lengths, pa.binary())
        bodies = [
            record.inflate(body, "a row's body") if c else body
            for body, c in zip(self._slices(at, lengths), compressed.tolist(), strict=True)
        ]
        return pa.array(bodies, pa.binary())

    def _keys(self, at: Ints, lengths: Ints) -> pa.Array:
        n = len(at)
        if not lengths.any():
            return pa.ListArray.from_arrays(
                pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()), type=_KEYS_TYPE
            )
        try:
            rows = [str(k, "utf-8").split(" ") if k else () for k in self._slices(at, lengths)]
        except UnicodeDecodeError as exc:
            raise InvalidRecord(f"a record's keys are not UTF-8: {exc}") from None
        return pa.array(rows, _KEYS_TYPE)

    def _properties(self, at: Ints, lengths: Ints) -> pa.Array:
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
                list(record.decode_properties(p).items()) if p else []
                for p in self._slices(at, lengths)
            ]
        except UnicodeDecodeError as exc:
            raise InvalidRecord(f"a record's properties are not UTF-8: {exc}") from None
        return pa.array(rows, _PROPS_TYPE)

    def _slices(self, at: Ints, lengths: Ints) -> list[bytes]:
        """Each row's range as bytes: for the rare parts that are decoded row by row."""
        payloads = [run.payload for run in self.runs]
        return [
            bytes(payloads[b][a : a + m])
            for b, a, m in zip(self.buffer.tolist(), at.tolist(), lengths.tolist(), strict=True)
        ]


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
