"""Bodies to records all at once: byte for byte what the per-row encoder sends."""

from __future__ import annotations

import random
import zlib

import numpy as np
import pyarrow as pa

from metaq.common import record
from metaq.spark.arrow_encode import derived_ids, encode_bodies, id_hashes, payload


def test_records_equal_the_per_row_encoding() -> None:
    bodies = [b"", b"a", b"x" * 1500, bytes(range(256))]
    prefix = bytes.fromhex("0102030405060708")
    ids = derived_ids(prefix, 41, len(bodies))
    queue_ids = np.array([3, 0, 7, 3], np.int32)
    records = encode_bodies("orders", pa.array(bodies, pa.binary()), ids, queue_ids, 1_700_000)
    expected = [
        bytes(
            record.encode(
                "orders",
                body,
                queue_id=int(q),
                msg_id=prefix + (41 + i).to_bytes(8, "big"),
                born_timestamp_ms=1_700_000,
            )
        )
        for i, (body, q) in enumerate(zip(bodies, queue_ids, strict=True))
    ]
    assert records.to_pylist() == expected
    chosen = records.take(pa.array([3, 1]))
    assert bytes(payload(chosen)) == expected[3] + expected[1]
    decoded = list(record.iter_records(payload(records), verify=False))
    assert [r.body for r in decoded] == bodies
    assert [r.msg_id for r in decoded] == [bytes(row) for row in ids]


def test_id_hashes_are_zlib_crc32_of_each_id() -> None:
    """The queue of a row written in a batch must be shard_queue's, which hashes with zlib."""
    rng = random.Random(3)
    ids = np.frombuffer(rng.randbytes(16 * 500), np.uint8).reshape(-1, 16)
    ids = np.concatenate([ids, derived_ids(b"\xff" * 8, 2**63 - 10, 10)])
    assert id_hashes(ids).tolist() == [zlib.crc32(bytes(row)) for row in ids]
