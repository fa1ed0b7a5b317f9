"""Queue locks for ordered consumption: at most one member of a group processes a queue.

Held in the master's memory with a time to live; the consumer renews well within it.
A broker that just became master (started, or promoted) does not know what a previous
master granted, so for one time to live it grants only renewals: a member that says it
holds a queue under a lease it still counts valid (a lease runs from when the member
asked, less a margin, so it ends before the granting master's lock does) gets the queue,
the first such claim for each queue wins, and nobody else gets a queue until the time
to live has passed and every earlier lease has lapsed on the members' side too. So an
owner keeps its queues across a failover instead of pausing for a whole time to live.
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
        """This broker just became master: for one time to live, grant only renewals."""
        self._held.clear()
        self._closed_until = self._clock() + self.ttl_s

    def lock(
        self,
        group: str,
        client_id: str,
        queues: Iterable[tuple[str, int]],
        *,
        held: bool = False,
    ) -> list[tuple[str, int]]:
        """Lock or renew; returns the queues ``client_id`` holds now. ``held``: the
        client holds these queues under a lease it still counts valid (a renewal)."""
        now = self._clock()
        # Before the hold-off ends a free queue goes only to a member renewing its lease.
        takes_free = held or now >= self._closed_until
        granted = []
        for topic, queue_id in queues:
            key = (group, topic, queue_id)
            holder = self._held.get(key)
            free = holder is None or holder[1] <= now
            if (holder is not None and holder[0] == client_id) or (free and takes_free):
                self._held[key] = (client_id, now + self.ttl_s)
                granted.append((topic, queue_id))
        return granted

    def unlock(self, group: str, client_id: str, queues: Iterable[tuple[str, int]]) -> None:
        for topic, queue_id in queues:
            key = (group, topic, queue_id)
            holder = self._held.get(key)
            if holder is not None and holder[0] == client_id:
                del self._held[key]
