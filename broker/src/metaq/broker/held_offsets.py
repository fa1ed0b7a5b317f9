"""Offsets consumers committed at a slave, kept on its disk until its master has them.

A slave cannot journal: its log is a copy of the master's. Consumers still commit there
when the master is down (they read from a slave until their next rebalance) or when
their route is stale. Such a commit is written to ``held_offsets.json`` before it is
answered, forwarded to the master when one is reachable (the old master back, or a new
one), and taken into the journal directly if this slave is promoted. Each held offset
remembers what the master's journal said before the consumer's first commit here, so the
master can tell a commit nobody overtook (taken, even if it moves backwards: a reset)
from one a consumer made at the master since (which stands unless the held one is
further on).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeAlias

from metaq.broker.files import load_json_state, write_json_atomically

FILE_NAME: Final = "held_offsets.json"
_FORMAT: Final = 1

OffsetKey: TypeAlias = tuple[str, str, int]
"""(consumer group, topic, queue id)."""


@dataclass(frozen=True, slots=True)
class Held:
    offset: int
    expected: int | None
    """The master's offset for the queue before the first commit held here (None: none)."""


def takes_forwarded(current: int | None, expected: int | None, forwarded: int) -> bool:
    """Whether a master replaces its offset ``current`` by one a slave held and forwarded.

    Yes when nobody committed at the master since the slave last heard from it
    (``current`` is still ``expected``; a reset made at the slave is carried too) or when
    it moves the offset forward; no when a consumer has already moved on at the master."""
    return current is None or current == expected or forwarded > current


class HeldOffsets:
    """The held commits by (group, topic, queue id); :meth:`persist` writes them."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE_NAME
        self._held: dict[OffsetKey, Held] = {}
        self._version = 0
        self._saved = 0
        self._lock = asyncio.Lock()
        self._writing = threading.Lock()
        self._load()

    def _load(self) -> None:
        load_json_state(
            self.path,
            _FORMAT,
            self._apply,
            "move it aside to drop the offsets consumers committed at this slave that its "
            "master has not taken yet",
        )

    def _apply(self, data: Any) -> None:
        for group, topic, queue_id, offset, expected in data["held"]:
            self._held[(str(group), str(topic), int(queue_id))] = Held(
                int(offset), None if expected is None else int(expected)
            )

    def __contains__(self, key: OffsetKey) -> bool:
        return key in self._held

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, key: OffsetKey, offset: int, master_offset: int | None) -> None:
        """Hold a consumer's commit; ``master_offset`` is the table's value before it,
        kept as the expected offset only for the first commit held for the queue."""
        previous = self._held.get(key)
        expected = master_offset if previous is None else previous.expected
        self._held[key] = Held(offset, expected)
        self._version += 1

    def items(self) -> list[tuple[OffsetKey, Held]]:
        return sorted(self._held.items())

    def settle(self, key: OffsetKey, sent: int) -> bool:
        """The master answered a forward of ``sent``: drop the held commit unless the
        consumer committed again since; return whether it was dropped."""
        held = self._held.get(key)
        if held is None or held.offset != sent:
            return False
        del self._held[key]
        self._version += 1
        return True

    def clear(self) -> None:
        if self._held:
            self._held = {}
            self._version += 1

    @property
    def dirty(self) -> bool:
        return self._version != self._saved

    async def persist(self) -> None:
        """Make every change made before the call durable (the write in a worker thread;
        concurrent callers share one write). The one way the file is written, shutdown
        included."""
        wanted = self._version
        async with self._lock:
            if self._saved >= wanted:
                return
            await asyncio.to_thread(self._write, self._version, self._data())

    def _write(self, version: int, data: dict[str, object]) -> None:
        # A caller cancelled while its thread writes releases the asyncio lock but not
        # the thread: this lock keeps the next write from running beside it, and the
        # version check from putting an older state over a newer one.
        with self._writing:
            if version > self._saved:
                write_json_atomically(self.path, data)
                self._saved = version

    def _data(self) -> dict[str, object]:
        rows = [[g, t, q, h.offset, h.expected] for (g, t, q), h in sorted(self._held.items())]
        return {"format": _FORMAT, "held": rows}
