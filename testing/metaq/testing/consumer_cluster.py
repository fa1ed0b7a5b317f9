"""A small real cluster for the consumer tests, and the tools to feed and check it.

One nameserver and three brokers (:data:`BUILDER`), each in its own computer room
(``broker-a`` in r1, ``broker-b`` in r2, ``broker-c`` in r3). Tests create their own
topics on the brokers they want, so one cluster serves a whole module.
:class:`Deliveries` is the checker: it counts every delivery by message id and says
what was lost, duplicated or unexpected.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from metaq.client.message import Message
from metaq.common.record import encode
from metaq.testing.cluster import Cluster, ClusterBuilder
from metaq.testing.data_client import DataClient

ROOMS = {"broker-a": "r1", "broker-b": "r2", "broker-c": "r3"}


BUILDER = ClusterBuilder(
    groups=tuple(ROOMS),
    broker_args=("--flush-mode", "async"),
    group_args={name: ("--computer-room", room) for name, room in ROOMS.items()},
)
"""One nameserver and the three brokers, each in its room."""


def broker_of(cluster: Cluster, store_host: str) -> str:
    """The broker group whose data address stamped a message."""
    for name in cluster.builder.groups:
        if cluster.data_address(name) == store_host:
            return name
    raise AssertionError(f"no broker of the cluster has data address {store_host}")


async def wait_for(
    predicate: Callable[[], bool], timeout_s: float, message: str, poll_s: float = 0.01
) -> float:
    """Poll ``predicate`` on the loop until it holds; seconds taken. AssertionError (naming
    ``message``) at the deadline."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting until {message}")
        await asyncio.sleep(poll_s)
    return time.monotonic() - start


class Sender:
    """Sends test messages straight to the brokers' data ports (the test DataClient)."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._clients: dict[str, DataClient] = {}

    async def _client(self, broker_name: str) -> DataClient:
        client = self._clients.get(broker_name)
        if client is None:
            broker = self._cluster.broker(broker_name)
            client = await DataClient.connect(broker.data_host, broker.data_port)
            self._clients[broker_name] = client
        return client

    async def send(
        self,
        topic: str,
        queues: Sequence[tuple[str, int]],
        count: int,
        *,
        batch: int = 100,
        tags: str = "",
        prefix: str = "m",
    ) -> list[str]:
        """``count`` messages spread round-robin over ``queues`` ((broker, queue id)),
        ``batch`` per SEND; the ids of the messages sent, in hex."""
        ids: list[str] = []
        sends = []
        per_queue: dict[tuple[str, int], list[bytearray]] = {q: [] for q in queues}
        for n in range(count):
            broker, queue_id = queues[n % len(queues)]
            per_queue[(broker, queue_id)].append(
                encode(topic, f"{prefix}-{n}".encode(), queue_id=queue_id, tags=tags)
            )
        for (broker, queue_id), records in per_queue.items():
            client = await self._client(broker)
            for at in range(0, len(records), batch):
                sends.append(client.send(topic, queue_id, records[at : at + batch]))
        for response in await asyncio.gather(*sends):
            ids += (msg_id.hex() for msg_id in response.msg_ids)
        assert len(ids) == count
        return ids

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()


@dataclass
class Deliveries:
    """Every delivery by message id, and by which consumer; the test's checker."""

    by_id: Counter[str] = field(default_factory=Counter)
    consumers: dict[str, set[str]] = field(default_factory=dict)
    messages: dict[str, Message] = field(default_factory=dict)

    def handler(self, consumer: str) -> Callable[[Message], asyncio.Future[None]]:
        async def handle(message: Message) -> None:
            self.by_id[message.msg_id] += 1
            self.consumers.setdefault(message.msg_id, set()).add(consumer)
            self.messages[message.msg_id] = message

        return handle  # type: ignore[return-value]

    def received_all(self, ids: Iterable[str]) -> bool:
        return all(i in self.by_id for i in ids)

    def report(self, sent: Iterable[str]) -> dict[str, int]:
        sent_set = set(sent)
        return {
            "sent": len(sent_set),
            "received": sum(1 for i in sent_set if i in self.by_id),
            "lost": sum(1 for i in sent_set if i not in self.by_id),
            "duplicated": sum(1 for i in sent_set if self.by_id[i] > 1),
            "extra_deliveries": sum(self.by_id[i] - 1 for i in sent_set if self.by_id[i] > 1),
            "unexpected": sum(1 for i in self.by_id if i not in sent_set),
        }
