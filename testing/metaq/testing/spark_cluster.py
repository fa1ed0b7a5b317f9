"""A small real metaq cluster for the Spark tests (a nameserver and broker masters as
processes) with topics created on a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from metaq.client.admin import Admin, TopicSettings
from metaq.client.errors import UnknownTopic
from metaq.client.routes import RouteCache
from metaq.common.model import TopicRoute
from metaq.testing import BrokerProcess
from metaq.testing.nameserver_process import NameServerProcess, start_nameserver


@dataclass
class Cluster:
    """Nameserver + broker masters, stopped by :meth:`stop`."""

    nameserver: NameServerProcess
    brokers: dict[str, BrokerProcess] = field(default_factory=dict)

    @property
    def nameservers(self) -> str:
        return self.nameserver.grpc_address

    def stop(self) -> None:
        for broker in self.brokers.values():
            broker.kill()
        self.nameserver.stop()

    async def create_topic(
        self,
        topic: str,
        *,
        queues: int = 2,
        brokers: Sequence[str] | None = None,
        timeout_s: float = 15.0,
    ) -> TopicRoute:
        """Create the topic on the brokers and wait until the nameserver routes it there
        with ``queues`` queues each."""
        names = list(brokers or self.brokers)
        for name in names:
            await Admin().put_topic(
                self.brokers[name].http_url,
                topic,
                TopicSettings(read_queues=queues, write_queues=queues),
            )
        deadline = time.monotonic() + timeout_s
        async with RouteCache([self.nameservers]) as routes:
            while True:
                with contextlib.suppress(UnknownTopic):
                    route = await routes.route(topic, refresh=True)
                    counts = {g.broker_name: g.read_queues for g in route.groups}
                    if all(counts.get(n) == queues for n in names):
                        return route
                if time.monotonic() > deadline:
                    raise AssertionError(f"the nameserver did not route {topic} to {names}")
                await asyncio.sleep(0.02)  # poll interval of a deadline-bound wait

    async def pulled(self, topic: str) -> int:
        """Messages of ``topic`` the brokers have returned to pulls (their metrics)."""
        total = 0.0
        for broker in self.brokers.values():
            for (name, labels), value in (await Admin().metrics(broker.http_url)).items():
                if name == "metaq_messages_out_total" and ("topic", topic) in labels:
                    total += value
        return int(total)


def start_cluster(
    work_dir: Path, broker_names: Sequence[str] = ("broker-a", "broker-b")
) -> Cluster:
    cluster = Cluster(start_nameserver(work_dir / "ns"))
    try:
        for name in broker_names:
            cluster.brokers[name] = BrokerProcess.start(
                work_dir / name, "--broker-name", name, "--nameserver", cluster.nameservers
            )
    except BaseException:
        cluster.stop()
        raise
    return cluster
