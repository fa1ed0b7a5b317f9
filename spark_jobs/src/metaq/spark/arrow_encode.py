"""Arrow rows that carry only a body into commitlog records, without a Python object per row.

The common write (a ``body`` column, the topic from the option or one value of the
``topic`` column, ids derived from the row numbers) builds every record's fixed part --
header, id, topic -- as one numpy structured array, and Arrow's C++ joins each with its
body; the records of one queue are then one take of that array. Rows with keys, tags,
properties, a sharding key or a given message id go through the per-row encoder of
:mod:`metaq.spark.sink` instead.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metaq.common import record
from metaq.common.record_dtype import header_dtype


def derived_ids(prefix: bytes, first_row: int, count: int) -> np.ndarray:
    """``count`` 16-byte ids: ``prefix`` (8 bytes) and the big-endian row number, as
    :class:`~metaq.spark.sink.RowSender` derives one per row."""
    ids = np.empty((count, 16), np.uint8)
    ids[:, :8] = np.frombuffer(prefix, np.uint8)
    ids[:, 8:] = np.arange(first_row, first_row + count, dtype=">u8").view(np.uint8).reshape(-1, 8)
    return ids


def _crc_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0xEDB88320), table >> 1)
    return table.astype(np.uint32)


_CRC_TABLE: Final = _crc_table()
"""zlib's CRC-32 (reflected polynomial 0xEDB88320), a byte at a time."""


def id_hashes(ids: np.ndarray) -> np.ndarray:
    """``zlib.crc32`` of every 16-byte id (``ids`` shaped (n, 16), uint8), as
    :func:`metaq.client.selection.shard_queue` hashes a key: one numpy step per byte
    over all rows rather than a Python call per row."""
    crc = np.full(len(ids), 0xFFFFFFFF, np.uint32)
    for column in range(ids.shape[1]):
        crc = _CRC_TABLE[(crc ^ ids[:, column]) & 0xFF] ^ (crc >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)


def sequenced_ids(producer_ids: np.ndarray, queue_ids: np.ndarray, seqs: np.ndarray) -> np.ndarray:
    """``record.sequenced_id`` (epoch 0) of every row, shaped (n, 16) uint8."""
    words = np.empty((len(seqs), 2), ">u8")
    words[:, 0] = producer_ids.astype(np.uint64) << np.uint64(16)
    words[:, 1] = (queue_ids.astype(np.uint64) << np.uint64(48)) | seqs.astype(np.uint64)
    return words.view(np.uint8).reshape(-1, 16)


def encode_bodies(
    topic: str,
    bodies: pa.Array,
    ids: np.ndarray,
    queue_ids: np.ndarray,
    born_timestamp_ms: int,
    flags: int = 0,
) -> pa.Array:
    """One record per body, as a producer sends it (broker fields zero, CRC unset): a
    binary array whose values are the records, so a take of it gathers a queue's batch.
    ``topic`` must have passed :func:`record.check_topic`; ``bodies`` has no nulls."""
    n = len(bodies)
    # Each row's header and topic are the encoder's record of an empty body, with the
    # fields that differ by row set after.
    empty = record.encode(
        topic, b"", msg_id=bytes(16), born_timestamp_ms=born_timestamp_ms, flags=flags
    )
    width = len(empty)
    lengths = pc.binary_length(bodies).to_numpy(zero_copy_only=False).astype(np.int64)
    fixed = np.tile(np.frombuffer(empty, np.uint8), n)
    header = fixed.view(header_dtype("size", "queue_id", "msg_id", "body_len", itemsize=width))
    header["size"] = width + lengths
    header["queue_id"] = queue_ids
    header["msg_id"] = ids
    header["body_len"] = lengths
    heads = pa.Array.from_buffers(
        pa.binary(),
        n,
        [None, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * width), pa.py_buffer(fixed)],
    )
    joined: pa.Array = pc.binary_join_element_wise(heads, bodies, b"")
    return joined


def payload(records: pa.Array) -> memoryview:
    """The values of a binary array back to back: the records of one SEND."""
    offsets = records.buffers()[1]
    data = records.buffers()[2]
    first, last = np.frombuffer(offsets, np.int32)[[records.offset, records.offset + len(records)]]
    if data is None:
        return memoryview(b"")
    # Arrow exports its buffers as signed chars ('b'); a signed SEND's MAC (cryptography's
    # Poly1305) takes only unsigned bytes, so the view is cast to 'B' (no copy).
    return memoryview(data).cast("B")[first:last]
