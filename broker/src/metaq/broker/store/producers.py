"""Idempotent producers' sequences: what each (producer, queue) stored last, and where.

A producer that sends sequenced records (``metaq.common.record.FLAG_SEQUENCED``) numbers
the records of each queue 0, 1, 2, ... and re-sends a batch it has no answer for with the
same numbers. For each (producer id, topic, queue) the table keeps the epoch and the last
few *runs*: sequences stored at consecutive queue offsets (a batch, or several batches in
a row that no other producer's records came between). A sequence in a run is located by
arithmetic, so telling a re-sent batch from a new one costs the same with a window of a
minute or of a day, unlike probing the id index file by file.

The table is fed from the log by the dispatcher, on masters, slaves and during recovery
alike, so every replica holds the same table for the records it holds; a checkpoint
saves it with the offset it was dispatched to, and recovery loads that and dispatches
the rest. Feeding a run twice changes nothing, so re-dispatching a stretch is safe.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from metaq.common.errors import InvalidMessage, MetaqError

BATCHES: Final = 5
"""Runs kept per producer and queue, as Kafka keeps five batches per producer."""
SNAPSHOT_VERSION: Final = 1

Key = tuple[int, bytes, int]
"""(producer id, topic, queue id)."""


class SequenceGap(MetaqError):
    """A batch starts past the next expected sequence: an earlier batch of the producer is
    missing. Retriable: the producer re-sends the missing batch, then this one."""

    retriable = True
    code = InvalidMessage.code


class ProducerFenced(InvalidMessage):
    """A batch of an epoch older than one the broker stored for the producer id."""


@dataclass(slots=True)
class Run:
    first_seq: int
    last_seq: int
    first_queue_offset: int


@dataclass(slots=True)
class ProducerState:
    epoch: int
    runs: deque[Run]
    last_store_ms: int

    @property
    def last_seq(self) -> int:
        return self.runs[-1].last_seq

    def locate(self, seq: int) -> int | None:
        """The queue offset of ``seq``, when a kept run holds it."""
        for run in reversed(self.runs):
            if run.first_seq <= seq <= run.last_seq:
                return run.first_queue_offset + seq - run.first_seq
        return None


@dataclass(frozen=True, slots=True)
class Verdict:
    """How to take a sequenced batch: its first ``duplicates`` records were stored before
    (at ``places``, None where no kept run remembers it); the rest are new."""

    duplicates: int = 0
    places: tuple[int | None, ...] = field(default=())


NEW: Final = Verdict()


class ProducerTable:
    def __init__(self, batches: int = BATCHES) -> None:
        self.batches = batches
        self._states: dict[Key, ProducerState] = {}

    def __len__(self) -> int:
        return len(self._states)

    def get(self, key: Key) -> ProducerState | None:
        return self._states.get(key)

    def check(self, key: Key, epoch: int, first_seq: int, count: int) -> Verdict:
        """What to store of a batch of ``count`` records of ``key`` at ``epoch`` whose
        first sequence is ``first_seq``; raise ProducerFenced or SequenceGap to refuse it.

        A producer the table does not know (new, or idle past expiry) starts anywhere.
        """
        state = self._states.get(key)
        if state is None or epoch > state.epoch:
            return NEW
        if epoch < state.epoch:
            raise ProducerFenced(
                f"producer {key[0]:#x} sends with epoch {epoch}, but this broker stored "
                f"epoch {state.epoch} of it: a newer instance of the producer took over; "
                "stop this one"
            )
        last = state.last_seq
        if first_seq > last + 1:
            raise SequenceGap(
                f"producer {key[0]:#x} sent sequence {first_seq} to {_queue(key)}, but the "
                f"last stored is {last}: sequences {last + 1}-{first_seq - 1} are missing. "
                "Resend the missing batch first (a producer's retry does so)"
            )
        duplicates = min(count, last - first_seq + 1)
        if duplicates <= 0:
            return NEW
        places = tuple(state.locate(first_seq + n) for n in range(duplicates))
        return Verdict(duplicates, places)

    def record(
        self, key: Key, epoch: int, first_seq: int, last_seq: int, first_queue_offset: int,
        store_ms: int,
    ) -> None:  # fmt: skip
        """Records ``first_seq``..``last_seq`` of ``key`` were stored at consecutive queue
        offsets from ``first_queue_offset``. Sequences already recorded are ignored."""
        state = self._states.get(key)
        if state is None or epoch > state.epoch:
            self._states[key] = ProducerState(
                epoch,
                deque([Run(first_seq, last_seq, first_queue_offset)], self.batches),
                store_ms,
            )
            return
        if epoch < state.epoch or last_seq <= state.last_seq:
            return
        if first_seq <= state.last_seq:  # a run re-fed from its middle
            first_queue_offset += state.last_seq + 1 - first_seq
            first_seq = state.last_seq + 1
        state.last_store_ms = max(state.last_store_ms, store_ms)
        tail = state.runs[-1]
        if (
            first_seq == tail.last_seq + 1
            and first_queue_offset == tail.first_queue_offset + first_seq - tail.first_seq
        ):
            tail.last_seq = last_seq
        else:
            state.runs.append(Run(first_seq, last_seq, first_queue_offset))

    def truncate(self, queue_ends: Mapping[tuple[bytes, int], int]) -> None:
        """Forget what lies at or past each queue's end (``(topic, queue id)`` -> next
        queue offset), after the log was cut; queues not named lose nothing."""
        for key in list(self._states):
            end = queue_ends.get((key[1], key[2]))
            if end is None:
                continue
            runs = self._states[key].runs
            while runs and runs[-1].first_queue_offset >= end:
                runs.pop()
            if not runs:
                del self._states[key]
                continue
            tail = runs[-1]
            tail.last_seq = min(tail.last_seq, tail.first_seq + end - 1 - tail.first_queue_offset)

    def expire(self, older_than_ms: int) -> int:
        """Forget producers whose last record was stored before ``older_than_ms``."""
        gone = [k for k, s in self._states.items() if s.last_store_ms < older_than_ms]
        for key in gone:
            del self._states[key]
        return len(gone)

    # --- snapshot ----------------------------------------------------------------------

    def dump(self, dispatched: int) -> str:
        """The table as of commitlog offset ``dispatched``, for :func:`write_snapshot`."""
        rows = [
            [k[0], k[1].decode(), k[2], s.epoch, s.last_store_ms,
             [[r.first_seq, r.last_seq, r.first_queue_offset] for r in s.runs]]
            for k, s in self._states.items()
        ]  # fmt: skip
        body = {"version": SNAPSHOT_VERSION, "dispatched": dispatched, "producers": rows}
        return json.dumps(body, separators=(",", ":"))

    def load(self, path: Path) -> int | None:
        """Replace the table by the snapshot at ``path``; the commitlog offset it was taken
        at, or None (table left empty) when there is none or it cannot be read."""
        self._states.clear()
        try:
            body = json.loads(path.read_text())
            if body["version"] != SNAPSHOT_VERSION:
                return None
            for pid, topic, queue, epoch, store_ms, runs in body["producers"]:
                self._states[(pid, topic.encode(), queue)] = ProducerState(
                    epoch, deque((Run(*r) for r in runs), self.batches), store_ms
                )
            return int(body["dispatched"])
        except (OSError, ValueError, KeyError, TypeError):
            self._states.clear()
            return None

    def keys(self) -> Iterable[Key]:
        return self._states.keys()


def _queue(key: Key) -> str:
    return f"{key[1].decode(errors='replace')}:{key[2]}"


def write_snapshot(path: Path, text: str) -> None:
    """Replace the file at ``path`` by ``text``, durably and atomically."""
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
