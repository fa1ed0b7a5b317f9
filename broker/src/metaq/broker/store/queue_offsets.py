"""The appender's next queue offset for every (topic, queue id)."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Mapping


class QueueOffsets(Mapping[tuple[bytes, int], int]):
    """Per topic an array of next offsets indexed by queue id.

    With ten thousand queues every lookup of a dict keyed by (topic, queue id) touches a
    cold entry, key tuple and int; here it reads one word of a contiguous array. Queues
    that never took a record are not listed (their next offset is 0).
    """

    __slots__ = ("_rows",)

    def __init__(self, offsets: Iterable[tuple[tuple[bytes, int], int]] = ()) -> None:
        self._rows: dict[bytes, array[int]] = {}
        for (topic, queue_id), offset in offsets:
            self.set(topic, queue_id, offset)

    def take(self, topic: bytes, queue_id: int) -> int:
        """The queue's next offset, which is then taken."""
        row = self._rows.get(topic)
        if row is None or queue_id >= len(row):
            row = self._widen(topic, queue_id)
        offset = row[queue_id]
        row[queue_id] = offset + 1
        return offset

    def set(self, topic: bytes, queue_id: int, offset: int) -> None:
        row = self._rows.get(topic)
        if row is None or queue_id >= len(row):
            row = self._widen(topic, queue_id)
        row[queue_id] = offset

    def _widen(self, topic: bytes, queue_id: int) -> array[int]:
        row = self._rows.setdefault(topic, array("q"))
        row.extend([0] * (queue_id + 1 - len(row)))
        return row

    def __getitem__(self, key: tuple[bytes, int]) -> int:
        topic, queue_id = key
        row = self._rows.get(topic)
        if row is None or not 0 <= queue_id < len(row) or row[queue_id] == 0:
            raise KeyError(key)
        return row[queue_id]

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        for topic, row in self._rows.items():
            for queue_id, offset in enumerate(row):
                if offset:
                    yield topic, queue_id

    def __len__(self) -> int:
        return sum(1 for _ in self)
