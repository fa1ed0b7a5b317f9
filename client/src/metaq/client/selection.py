"""Which queue a message goes to, and which brokers to keep away from for a while.

- :class:`RoundRobinSelector` spreads messages over a topic's writable queues in turn,
  passing over queues of brokers the :class:`BrokerHealth` tracker has isolated (unless
  every broker is isolated: a send then still goes somewhere).
- :func:`shard_queue` maps a sharding key to a queue with a stable hash (CRC-32, not
  Python's salted ``hash``), so every message with the key goes to the same queue and
  stays in order — for as long as the topic's writable queues do not change.
- :class:`BrokerHealth` is the producer's memory of trouble (RocketMQ's latency fault
  tolerance, simplified): a broker whose send failed is isolated for ``failure_isolation_s``;
  one that answered slowly for a time that grows with the latency.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Collection
from typing import Final, Protocol

from metaq.client.errors import NoWritableQueue
from metaq.common.model import QueueRoute, TopicRoute

# (latency at least, isolation) — slower answers keep a broker away for longer.
SLOW_ISOLATION: Final = ((3.0, 60.0), (1.0, 10.0), (0.55, 3.0))


class BrokerHealth:
    """Recent failures and slow answers per broker group, against an injectable clock."""

    def __init__(
        self,
        *,
        failure_isolation_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failure_isolation_s = failure_isolation_s
        self._clock = clock
        self._until: dict[str, float] = {}
        self._failed_master: dict[str, str] = {}
        """Isolated after a failure: the group's master address that failed ("" once a
        route showed the group without a master: whoever is routed next is new)."""

    def failed(self, broker: str, master_address: str = "") -> None:
        """A request to ``broker`` (its master at ``master_address``) failed in a way
        another broker might not."""
        self._isolate(broker, self.failure_isolation_s)
        self._failed_master[broker] = master_address

    def answered(self, broker: str, latency_s: float) -> None:
        """A request succeeded: a fast answer ends any isolation, a slow one starts one."""
        for threshold, isolation in SLOW_ISOLATION:
            if latency_s >= threshold:
                self._isolate(broker, isolation)
                return
        if self._until:
            self._until.pop(broker, None)
            self._failed_master.pop(broker, None)

    def _isolate(self, broker: str, seconds: float) -> None:
        until = self._clock() + seconds
        if until > self._until.get(broker, 0.0):
            self._until[broker] = until

    def isolated(self, route: TopicRoute | None = None) -> frozenset[str]:
        """Brokers to avoid now. A group isolated for a failure is not avoided once
        ``route`` shows it with another master than the one that failed, or with a master
        again after showing none: a failover replaced the broker that failed."""
        if not self._until:
            return frozenset()
        now = self._clock()
        expired = [b for b, until in self._until.items() if until <= now]
        for broker in expired:
            del self._until[broker]
            self._failed_master.pop(broker, None)
        if route is not None and self._failed_master:
            for group in route.groups:
                failed = self._failed_master.get(group.broker_name)
                if failed is None:
                    continue
                if not group.master_address:
                    self._failed_master[group.broker_name] = ""
                elif group.master_address != failed:
                    del self._failed_master[group.broker_name]
                    self._until.pop(group.broker_name, None)
        return frozenset(self._until)

    def available(self, broker: str) -> bool:
        return broker not in self.isolated()


class QueueSelector(Protocol):
    """Chooses the queue for a message without a sharding key."""

    def select(self, route: TopicRoute, avoid: Collection[str] = ()) -> QueueRoute:
        """A writable queue of ``route``, preferably of a broker not in ``avoid``."""
        ...


class RoundRobinSelector:
    """Each topic's writable queues in turn, skipping queues of brokers in ``avoid``."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def select(self, route: TopicRoute, avoid: Collection[str] = ()) -> QueueRoute:
        queues = route.write_queues
        count = len(queues)
        if not count:
            raise NoWritableQueue(route.topic)
        start = self._next.get(route.topic, 0)
        if avoid:
            for step in range(count):
                queue = queues[(start + step) % count]
                if queue.broker_name not in avoid:
                    self._next[route.topic] = start + step + 1
                    return queue
        self._next[route.topic] = start + 1
        return queues[start % count]


def shard_queue(route: TopicRoute, sharding_key: str | bytes) -> QueueRoute:
    """The queue for ``sharding_key``: stable for as long as the writable queues are."""
    queues = route.write_queues
    if not queues:
        raise NoWritableQueue(route.topic)
    raw = sharding_key.encode() if isinstance(sharding_key, str) else sharding_key
    return queues[zlib.crc32(raw) % len(queues)]
