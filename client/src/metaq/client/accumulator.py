"""The producer's record accumulator: sends to the same queue coalesce into batches.

Pure bookkeeping, no I/O and no clock of its own (callers pass ``now``), so the batching
rules are tested without sockets or sleeps. Per queue it keeps the batch being filled
(*open*), batches closed because they were full, and how many batches are in flight.

When a batch goes out (:meth:`Accumulator.ready`):

- a full batch (``max_records`` records or ``max_bytes`` bytes) goes as soon as the queue
  has fewer than ``max_in_flight`` batches in flight;
- an open batch goes at once when nothing is in flight for its queue — a lone send is
  not held back, only the sends of the same loop turn ride along — and otherwise once it
  is ``linger_s`` old, or when the batch in flight is answered, whichever comes first.

So under light load a send costs one round trip, and under heavy load the batches grow
to what accumulates during one round trip, never waiting longer than the linger.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from metaq.common.framing import Buffer
from metaq.common.model import QueueRoute

QueueKey = tuple[str, str, int, bool]
"""(topic, broker name, queue id, one-way); one-way batches are kept apart: nobody answers
them."""


class Batch:
    """Records for one queue that travel as one SEND frame.

    Who hears the outcome: ``waiters`` run parallel to ``records`` — each coalesced send's
    own waiter (a future, or None for nobody) — and ``future``, when set, resolves with
    the list of all results (``send_batch``). ``coalesced`` batches were built from
    separate sends and may be split again when the broker refuses one of their records.
    """

    __slots__ = (
        "attempt",
        "coalesced",
        "count",
        "created_s",
        "first_id",
        "future",
        "nbytes",
        "one_way",
        "queue",
        "records",
        "retry",
        "sent_s",
        "topic",
        "waiters",
    )

    def __init__(
        self,
        topic: str,
        queue: QueueRoute,
        created_s: float,
        *,
        one_way: bool = False,
        coalesced: bool = True,
    ) -> None:
        self.topic = topic
        self.queue = queue
        self.records: list[Buffer] = []
        """Buffers of the SEND payload: one record each, or (send_batch) many in one."""
        self.count = 0
        """Records in the batch (``record_count``)."""
        self.first_id = -1
        """When the records' ids are consecutive (send_batch): the first id's number."""
        self.waiters: list[Any] = []
        self.nbytes = 0
        self.created_s = created_s
        self.sent_s = 0.0
        self.one_way = one_way
        self.retry = False
        """Sent before with an unknown outcome: the broker stores only what it lacks."""
        self.coalesced = coalesced
        self.attempt = 0
        self.future: asyncio.Future[Any] | None = None

    @classmethod
    def whole(
        cls,
        topic: str,
        queue: QueueRoute,
        records: Sequence[Buffer],
        count: int,
        created_s: float,
        *,
        retry: bool = False,
        first_id: int = -1,
    ) -> Batch:
        """A batch the caller built to go as it is (never coalesced with other sends):
        ``records`` are buffers of ``count`` encoded records in all."""
        batch = cls(topic, queue, created_s, coalesced=False)
        batch.records.extend(records)
        batch.count = count
        batch.nbytes = sum(len(r) for r in records)
        batch.retry = retry
        batch.first_id = first_id
        return batch

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"Batch({self.topic}@{self.queue}, {len(self.records)} records, {self.nbytes} B)"


class _QueueState:
    __slots__ = ("full", "in_flight", "open")

    def __init__(self) -> None:
        self.open: Batch | None = None
        self.full: deque[Batch] = deque()
        self.in_flight = 0


class Accumulator:
    """Builds batches per queue and says which may go out now."""

    def __init__(
        self,
        *,
        max_records: int = 256,
        max_bytes: int = 1024 * 1024,
        linger_s: float = 0.002,
        max_in_flight: int = 5,
    ) -> None:
        if max_records < 1 or max_bytes < 1 or linger_s < 0 or max_in_flight < 1:
            raise ValueError(
                "max_records, max_bytes and max_in_flight must be positive, linger_s >= 0"
            )
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.linger_s = linger_s
        self.max_in_flight = max_in_flight
        self._queues: dict[QueueKey, _QueueState] = {}
        # Queues with something to send; others are idle or waiting on answers only.
        self._dirty: set[QueueKey] = set()
        self.pending_records = 0

    def filling(self, topic: str, queue: QueueRoute) -> bool:
        """Is a batch of ``topic`` for ``queue`` open, taking more records now?"""
        state = self._queues.get((topic, queue.broker_name, queue.queue_id, False))
        return state is not None and state.open is not None

    @staticmethod
    def key(batch: Batch) -> QueueKey:
        return (batch.topic, batch.queue.broker_name, batch.queue.queue_id, batch.one_way)

    def _state(self, key: QueueKey) -> _QueueState:
        state = self._queues.get(key)
        if state is None:
            state = self._queues[key] = _QueueState()
        return state

    def append(
        self,
        topic: str,
        queue: QueueRoute,
        record: Buffer,
        now: float,
        *,
        one_way: bool = False,
        waiter: Any = None,
    ) -> tuple[Batch, int]:
        """Add one record (and who waits for it); return its batch and its index in it."""
        key = (topic, queue.broker_name, queue.queue_id, one_way)
        state = self._queues.get(key) or self._state(key)
        size = len(record)
        batch = state.open
        if batch is not None and (
            batch.nbytes + size > self.max_bytes or batch.queue.address != queue.address
        ):
            state.full.append(batch)
            batch = state.open = None
        if batch is None:
            batch = state.open = Batch(topic, queue, now, one_way=one_way)
        index = len(batch.records)
        batch.records.append(record)
        batch.waiters.append(waiter)
        batch.count += 1
        batch.nbytes += size
        if index + 1 >= self.max_records or batch.nbytes >= self.max_bytes:
            state.full.append(batch)
            state.open = None
        self._dirty.add(key)
        self.pending_records += 1
        return batch, index

    def add_batch(self, batch: Batch) -> None:
        """Queue a batch built elsewhere (``send_batch``, a retry) to go as it is."""
        key = self.key(batch)
        self._state(key).full.append(batch)
        self._dirty.add(key)
        self.pending_records += batch.count

    def ready(self, now: float, *, flush: bool = False) -> list[Batch]:
        """Batches that may go out now; each counts as in flight until :meth:`done`.

        ``flush`` ignores the linger (closing the producer).
        """
        out: list[Batch] = []
        linger = self.linger_s
        limit = self.max_in_flight
        still_dirty: list[QueueKey] = []
        for key in self._dirty:
            state = self._queues[key]
            while state.full and state.in_flight < limit:
                out.append(state.full.popleft())
                state.in_flight += 1
            batch = state.open
            if (
                batch is not None
                and state.in_flight < limit
                and (flush or state.in_flight == 0 or now - batch.created_s >= linger)
            ):
                out.append(batch)
                state.open = None
                state.in_flight += 1
            if state.full or state.open is not None:
                still_dirty.append(key)
        self._dirty = set(still_dirty)
        for batch in out:
            self.pending_records -= batch.count
            if batch.one_way:
                # Nobody answers a one-way batch: it is done once written.
                self._queues[self.key(batch)].in_flight -= 1
        return out

    def done(self, batch: Batch) -> None:
        """The batch was answered (or failed): its queue may send the next one."""
        key = self.key(batch)
        state = self._queues.get(key)
        if state is None or batch.one_way:
            return
        state.in_flight -= 1
        if state.full or state.open is not None:
            self._dirty.add(key)

    def next_deadline(self) -> float | None:
        """When the oldest batch held back by the linger may go, if one is held."""
        earliest: float | None = None
        for key in self._dirty:
            batch = self._queues[key].open
            if batch is not None:
                at = batch.created_s + self.linger_s
                if earliest is None or at < earliest:
                    earliest = at
        return earliest

    def in_flight(self) -> int:
        return sum(state.in_flight for state in self._queues.values())

    def drain_all(self) -> Iterator[Batch]:
        """Take every batch not yet sent (to fail them when the producer dies)."""
        for key in list(self._dirty):
            state = self._queues[key]
            while state.full:
                yield state.full.popleft()
            if state.open is not None:
                batch, state.open = state.open, None
                yield batch
        self._dirty.clear()
        self.pending_records = 0
