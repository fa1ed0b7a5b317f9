"""A small real cluster for the producer and CLI tests: nameservers plus broker masters
registered with every one of them through ``--nameserver``.

Brokers use the small test store (``max_message_bytes`` 256 KiB), ASYNC flush and no
automatic topic creation. Tests create their own topics and wait, on a deadline, until
the nameservers route them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from metaq.client.admin import Admin, TopicSettings
from metaq.client.errors import UnknownTopic
from metaq.client.message import Message, iter_messages
from metaq.client.routes import RouteCache
from metaq.common.model import TopicRoute
from metaq.testing import BrokerProcess, DataClient
from metaq.testing.nameserver_process import NameServerProcess, start_nameserver


@dataclass
class Cluster:
    nameservers: list[NameServerProcess]
    brokers: dict[str, BrokerProcess]

    @property
    def nameserver_addresses(self) -> list[str]:
        return [ns.grpc_address for ns in self.nameservers]

    def data_address(self, broker_name: str) -> str:
        broker = self.brokers[broker_name]
        return f"{broker.data_host}:{broker.data_port}"

    def stop(self) -> None:
        for broker in self.brokers.values():
            broker.kill()
        for nameserver in self.nameservers:
            nameserver.stop()


def start_cluster(
    work_dir: Path, broker_names: Sequence[str] = ("broker-a", "broker-b"), nameservers: int = 1
) -> Cluster:
    cluster = Cluster([], {})
    try:
        for n in range(nameservers):
            cluster.nameservers.append(start_nameserver(work_dir / f"ns{n}"))
        flags = [f for ns in cluster.nameservers for f in ("--nameserver", ns.grpc_address)]
        for name in broker_names:
            cluster.brokers[name] = BrokerProcess.start(
                work_dir / name, "--broker-name", name, *flags
            )
    except BaseException:
        cluster.stop()
        raise
    return cluster


async def create_topic(
    cluster: Cluster,
    topic: str,
    *,
    queues: int = 4,
    brokers: Sequence[str] | None = None,
    timeout_s: float = 10.0,
) -> TopicRoute:
    """Create the topic on the brokers and wait until every nameserver routes it there."""
    names = list(brokers or cluster.brokers)
    for name in names:
        await Admin().put_topic(
            cluster.brokers[name].http_url,
            topic,
            TopicSettings(read_queues=queues, write_queues=queues),
        )
    route: TopicRoute | None = None
    for address in cluster.nameserver_addresses:
        async with RouteCache([address]) as routes:
            deadline = time.monotonic() + timeout_s
            while True:
                with contextlib.suppress(UnknownTopic):
                    route = await routes.route(topic, refresh=True)
                    if {g.broker_name for g in route.groups} >= set(names):
                        break
                if time.monotonic() > deadline:
                    raise AssertionError(f"nameserver {address} did not route {topic} to {names}")
                await asyncio.sleep(0.02)  # poll interval of a deadline-bound wait
    assert route is not None
    return route


async def read_queue(broker: BrokerProcess, topic: str, queue_id: int) -> list[Message]:
    """Every message of one queue of one broker, in offset order."""
    client = await DataClient.connect(broker.data_host, broker.data_port)
    messages: list[Message] = []
    try:
        offset = 0
        while True:
            response, payload = await client.pull(topic, queue_id, offset, max_messages=1024)
            if not response.record_count:
                return messages
            messages += iter_messages(payload)
            offset = response.next_offset
    finally:
        await client.close()


async def read_until(
    broker: BrokerProcess, topic: str, queues: int, count: int, *, timeout_s: float = 10.0
) -> list[Message]:
    """Every message of the topic's first ``queues`` queues on the broker, once at least
    ``count`` are readable (the broker dispatches to its queues after acknowledging)."""
    deadline = time.monotonic() + timeout_s
    while True:
        messages = [m for q in range(queues) for m in await read_queue(broker, topic, q)]
        if len(messages) >= count:
            return messages
        if time.monotonic() > deadline:
            raise AssertionError(
                f"only {len(messages)} of {count} messages of {topic} became readable"
            )
        await asyncio.sleep(0.01)  # poll interval of a deadline-bound wait
