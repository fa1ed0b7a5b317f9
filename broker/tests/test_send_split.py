"""Splitting a SEND payload into records: sizes, topic and queue checked, nothing decoded."""

from __future__ import annotations

import pytest

from metaq.broker.send import split_records
from metaq.common.errors import InvalidMessage
from metaq.common.record import FLAG_DELAYED, encode


def payload(*records: bytes | bytearray) -> memoryview:
    return memoryview(b"".join(records))


def test_back_to_back_records_are_cut_as_views() -> None:
    records = [encode("t", b"x" * n, queue_id=2) for n in (0, 1, 500)]

    views, flags = split_records(payload(*records), b"t", 2, 3)

    assert [bytes(v) for v in views] == [bytes(r) for r in records]
    assert all(isinstance(v, memoryview) for v in views)
    assert flags == 0


def test_a_batch_with_a_delayed_record_says_so() -> None:
    records = [
        encode("t", b"now"),
        encode("t", b"later", properties={"DELAY": "1"}, flags=FLAG_DELAYED),
    ]

    _, flags = split_records(payload(*records), b"t", 0, 2)

    assert flags & FLAG_DELAYED


@pytest.mark.parametrize(
    ("data", "count", "words"),
    [
        (payload(), 0, "at least one record"),
        (payload(encode("t", b"x")), 2, "record_count says 2"),
        (payload(encode("t", b"x"))[:50], 1, "cut short"),
        (payload(encode("t", b"x" * 40))[:-1], 1, "claims"),
        (payload(encode("t", b"x", queue_id=1)), 1, "a batch goes to one queue"),
        (payload(encode("u", b"x")), 1, "a batch goes to one topic"),
        (payload(encode("tt", b"x")), 1, "a batch goes to one topic"),
        (payload(bytes(200)), 1, "claims 0 bytes"),
    ],
)
def test_disagreements_are_invalid_messages(data: memoryview, count: int, words: str) -> None:
    with pytest.raises(InvalidMessage, match=words):
        split_records(data, b"t", 0, count)
