"""Every partial view of the record header in the broker reads what ``record.HEADER`` reads."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from metaq.broker import delay, send, transactions
from metaq.broker.store import commitlog, dispatch, reads, store
from metaq.common import record
from metaq.testing.sample_record import HEADER, SAMPLE


@pytest.mark.parametrize(
    "view",
    [
        commitlog._CHECK,
        commitlog._BLANK,
        record.header_view(*commitlog._BATCH_FIELDS, topic_len=len("orders")),
        send._FIELDS,
        dispatch._SIZE_MAGIC,
        reads._LENGTH,
        reads._QUEUE_OFFSET,
    ],
    ids=["commitlog-check", "commitlog-blank", "commitlog-batch", "send", "dispatch",
         "reads-length", "reads-queue-offset"],
)  # fmt: skip
def test_a_header_view_agrees_with_the_header_field_by_field(view: struct.Struct) -> None:
    names = record.view_fields(view)

    got = dict(zip(names, view.unpack_from(SAMPLE), strict=True))

    want = {name: HEADER.get(name, b"orders") for name in names}
    assert len(set(HEADER.values())) == len(HEADER)  # no two fields could be confused
    assert got == want


@pytest.mark.parametrize(
    ("packer", "at", "name"),
    [
        (commitlog._CRC, record.CRC_AT, "crc"),
        (commitlog._OFFSET, commitlog._OFFSET_AT, "commitlog_offset"),
        (store._SIZE.packer, store._SIZE.offset, "size"),
        (store._STORE_TIMESTAMP.packer, store._STORE_TIMESTAMP.offset, "store_timestamp_ms"),
        (delay._FLAGS.packer, delay._FLAGS.offset, "flags"),
        (transactions._FLAGS.packer, transactions._FLAGS.offset, "flags"),
    ],
)
def test_a_single_field_is_read_where_the_header_keeps_it(
    packer: struct.Struct, at: int, name: str
) -> None:
    assert packer.unpack_from(SAMPLE, at)[0] == HEADER[name]


def test_message_ids_are_cut_where_the_header_keeps_them() -> None:
    assert bytes(SAMPLE[send._MSG_ID_AT : send._MSG_ID_END]) == HEADER["msg_id"]
    magic = record.FIELDS["magic"]
    assert SAMPLE[magic.offset : magic.end] == commitlog._MAGIC_BYTES


@pytest.mark.parametrize(
    "dtype", [dispatch._HEADER_DTYPE, dispatch._SIZE_MAGIC_DTYPE], ids=["header", "size-magic"]
)
def test_the_dispatchers_numpy_views_agree_with_the_header(dtype: np.dtype[Any]) -> None:
    row = np.frombuffer(bytes(SAMPLE[: dtype.itemsize]), dtype)[0]
    assert dtype.names is not None

    got = {n: bytes(row[n]) if isinstance(row[n], np.ndarray) else int(row[n]) for n in dtype.names}

    assert got == {name: HEADER[name] for name in dtype.names}
