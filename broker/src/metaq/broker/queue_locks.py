"""Queue locks for ordered consumption: at most one member of a group processes a queue.

Held in the master's memory with a time to live; the consumer renews well within it.
A broker that just became master (started, or promoted) grants nothing for one time to
live: whatever a previous master granted has lapsed by then, also on the consumer's
side, which stops processing when its own lease runs out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

Clock = Callable[[], float]
LockKey = tuple[str, str, int]
"""(group, topic, queue id)."""


class QueueLocks:
    def __init__(self, ttl_s: float, clock: Clock = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._held: dict[LockKey, tuple[str, float]] = {}
        self._closed_until = 0.0

    def hold_off(self) -> None:
        """This broker just became master: grant nothing for one time to live."""
        self._held.clear()
        self._closed_until = self._clock() + self.ttl_s

    def lock(
        self, group: str, client_id: str, queues: Iterable[tuple[str, int]]
    ) -> list[tuple[str, int]]:
        """Lock or renew; returns the queues ``client_id`` holds now."""
        now = self._clock()
        if now < self._closed_until:
            return []
        granted = []
        for topic, queue_id in queues:
            key = (group, topic, queue_id)
            holder = self._held.get(key)
            if holder is None or holder[0] == client_id or holder[1] <= now:
                self._held[key] = (client_id, now + self.ttl_s)
                granted.append((topic, queue_id))
        return granted

    def unlock(self, group: str, client_id: str, queues: Iterable[tuple[str, int]]) -> None:
        for topic, queue_id in queues:
            key = (group, topic, queue_id)
            holder = self._held.get(key)
            if holder is not None and holder[0] == client_id:
                del self._held[key]
