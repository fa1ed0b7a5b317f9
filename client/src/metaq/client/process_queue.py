"""One assigned queue inside a push consumer: its offsets in flight and its budget.

The pull loop of a queue adds each pull's messages here before handing them to the
handlers, and stops pulling while the queue holds ``max_messages`` unfinished messages
or ``max_bytes`` of their records (back-pressure: a slow handler makes its queue wait,
not the process's memory grow). The limits are per queue, like RocketMQ's
``pullThresholdForQueue`` / ``pullThresholdSizeForQueue``: one queue running behind
never holds back the others. The commit point is :class:`InflightOffsets`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Generic, TypeVar

from metaq.client.inflight import InflightOffsets

R = TypeVar("R")


class ProcessQueue(Generic[R]):
    """State of one queue this consumer runs; ``route`` says where the queue is served."""

    def __init__(
        self, topic: str, route: R, start_offset: int, *, max_messages: int, max_bytes: int
    ) -> None:
        self.topic = topic
        self.route = route
        self.offsets = InflightOffsets(start_offset)
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.committed: int | None = None
        """The offset last stored for the queue (broker or local file); None: not yet."""
        self.reset_generation: int | None = None
        """The generation of the group's offsets the position comes from (clustering),
        carried on pulls and commits: after an operator's reset the broker refuses the
        commits and answers the pulls OFFSET_RESET."""
        self.started = False
        """Set once the start offset is known: from then on the queue's offset is real."""
        self.dropped = False
        """Set when the queue was taken away: its loop stops, its handlers' results no
        longer count."""
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def full(self) -> bool:
        return self.offsets.count >= self.max_messages or self.offsets.bytes >= self.max_bytes

    def deliver(self, messages: Iterable[tuple[int, int]], next_offset: int) -> None:
        """Record a pull's (offset, size) messages as in flight; pull next at ``next_offset``."""
        self.offsets.add(messages, next_offset)
        if self.full:
            self._room.clear()
        if self.offsets.count:
            self._idle.clear()

    def finish(self, offset: int) -> None:
        """A handler is done with the message at ``offset`` (successfully or given up)."""
        # Called once per message consumed: the checks are spelled out rather than
        # going through ``full`` and setting events that are already set.
        offsets = self.offsets
        offsets.finish(offset)
        count = offsets.count
        if not count:
            self._idle.set()
            self._room.set()
        elif (
            not self._room.is_set() and count < self.max_messages and offsets.bytes < self.max_bytes
        ):
            self._room.set()

    def reposition(self, offset: int) -> None:
        self.offsets.reposition(offset)
        if not self.full:
            self._room.set()
        if not self.offsets.count:
            self._idle.set()

    async def wait_for_room(self) -> None:
        """Return once the queue is under both of its in-flight limits."""
        while self.full:
            self._room.clear()
            await self._room.wait()

    def commit_due(self) -> int | None:
        """The offset to store now, or None when the stored one is already current."""
        offset = self.offsets.commit_offset
        return None if offset == self.committed else offset

    @property
    def idle(self) -> bool:
        """No message of the queue is being handled."""
        return self.offsets.count == 0

    async def wait_idle(self) -> None:
        """Return once no message of the queue is being handled."""
        await self._idle.wait()
