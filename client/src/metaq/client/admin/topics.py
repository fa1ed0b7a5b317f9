"""Topics across the cluster: create, change, delete and list them on the broker groups'
masters, wait until the nameservers route a change, and read each queue's bounds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from metaq.client.admin.cluster import ClusterAdmin
from metaq.client.admin.results import (
    MAX_QUEUES,
    MIN_QUEUES,
    QueueStats,
    TopicListing,
    TopicSettings,
)
from metaq.client.errors import AdminError, UnknownTopic
from metaq.common.model import BrokerView, TopicRoute

ADMIN_GROUP: Final = "metaq-admin"
"""The consumer group named in offset queries made for bounds only; nothing is committed
under it."""
_ROUTE_POLL_S: Final = 0.05


class TopicSettingsError(AdminError):
    """A queue count out of range; ``field`` names it (``read_queues``, ``write_queues``)."""

    def __init__(self, field: str) -> None:
        super().__init__(f"{field} must be between {MIN_QUEUES} and {MAX_QUEUES}")
        self.field = field


class TopicExists(AdminError):
    """``create_topic`` found the topic on a chosen broker group already."""

    def __init__(self, topic: str, group: str) -> None:
        super().__init__(f"topic {topic} already exists on {group}")
        self.topic = topic
        self.group = group


class TopicMissing(AdminError):
    """``update_topic`` did not find the topic on a chosen broker group."""

    def __init__(self, topic: str, group: str) -> None:
        super().__init__(f"topic {topic} does not exist on {group}")
        self.topic = topic
        self.group = group


@dataclass(frozen=True, slots=True)
class TopicPlacement:
    """A topic's settings as one broker group's master took them."""

    broker: BrokerView
    settings: TopicSettings


class TopicAdmin(ClusterAdmin):
    """The calls on topics across the broker groups."""

    async def create_topic(
        self,
        topic: str,
        settings: TopicSettings | None = None,
        *,
        brokers: Sequence[str] | None = None,
        cluster: str = "",
        wait: bool = True,
    ) -> list[TopicPlacement]:
        """Create ``topic`` on the master of each broker group in ``brokers`` (default:
        every master of the cluster) and, with ``wait``, wait until the nameserver routes
        it there. TopicExists when a group has it already (nothing is changed then)."""
        wanted = settings or TopicSettings()

        def plan(broker: BrokerView, existing: TopicSettings | None) -> TopicSettings:
            if existing is not None:
                raise TopicExists(topic, broker.broker_name)
            return wanted

        return await self._put_topics(topic, plan, brokers, cluster, wait)

    async def update_topic(
        self,
        topic: str,
        *,
        read_queues: int | None = None,
        write_queues: int | None = None,
        perm: str | None = None,
        ordered: bool | None = None,
        brokers: Sequence[str] | None = None,
        cluster: str = "",
        wait: bool = True,
    ) -> list[TopicPlacement]:
        """Change the given settings of ``topic`` on each chosen group's master; the
        others keep their value there. TopicMissing when a group does not have it."""
        changes: dict[str, Any] = {
            "read_queues": read_queues,
            "write_queues": write_queues,
            "perm": perm,
            "ordered": ordered,
        }
        changed = {key: value for key, value in changes.items() if value is not None}

        def plan(broker: BrokerView, existing: TopicSettings | None) -> TopicSettings:
            if existing is None:
                raise TopicMissing(topic, broker.broker_name)
            return msgspec.structs.replace(existing, **changed)

        return await self._put_topics(topic, plan, brokers, cluster, wait)

    async def _put_topics(
        self,
        topic: str,
        plan: Callable[[BrokerView, TopicSettings | None], TopicSettings],
        brokers: Sequence[str] | None,
        cluster: str,
        wait: bool,
    ) -> list[TopicPlacement]:
        """Every chosen master is checked before any is changed."""
        plans = []
        for broker in await self.masters(brokers, cluster=cluster):
            settings = plan(broker, (await self.broker_topics(broker)).get(topic))
            for field in ("read_queues", "write_queues"):
                if not MIN_QUEUES <= getattr(settings, field) <= MAX_QUEUES:
                    raise TopicSettingsError(field)
            plans.append((broker, settings))
        placed = [TopicPlacement(b, await self.put_topic(b, topic, s)) for b, s in plans]
        if wait:
            await self.wait_routed(topic, {p.broker.broker_name: p.settings for p in placed})
        return placed

    async def wait_routed(
        self, topic: str, expected: Mapping[str, TopicSettings], timeout_s: float | None = None
    ) -> TopicRoute:
        """Poll the topic's route until every named broker group shows the queue counts
        given (brokers report topic changes to the nameservers on their next
        registration)."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                route: TopicRoute | None = await self.routes.route(topic, refresh=True)
            except UnknownTopic:
                route = None
            if route is not None and _route_matches(route, expected):
                return route
            if time.monotonic() > deadline:
                raise AdminError(
                    f"the brokers took the change, but the nameserver did not route it within "
                    f"{timeout_s} s (are the brokers registered with this nameserver?)"
                )
            await asyncio.sleep(_ROUTE_POLL_S)  # poll interval of a deadline-bound wait

    async def delete_topic(
        self, topic: str, *, brokers: Sequence[str] | None = None, cluster: str = ""
    ) -> list[str]:
        """Delete ``topic`` from each chosen group's master (default: every master); the
        groups that had it. Stored messages stay until retention removes them."""
        deleted = [
            broker.broker_name
            for broker in await self.masters(brokers, cluster=cluster)
            if await self.remove_topic(broker, topic)
        ]
        if not deleted:
            raise AdminError(f"topic {topic} does not exist on any chosen broker")
        return deleted

    async def list_topics(
        self, *, brokers: Sequence[str] | None = None, cluster: str = ""
    ) -> list[TopicListing]:
        """The topics of each chosen group's master, sorted by (topic, group)."""
        rows = [
            TopicListing(name, broker.broker_name, settings)
            for broker in await self.masters(brokers, cluster=cluster)
            for name, settings in (await self.broker_topics(broker)).items()
        ]
        return sorted(rows, key=lambda row: (row.topic, row.group))

    async def topic_stats(self, topic: str) -> list[QueueStats]:
        """Each readable queue's bounds, asked of the broker that serves it."""
        consumer = self._consumer(ADMIN_GROUP)
        queues = await consumer.queues(topic)
        answers = await asyncio.gather(
            *(consumer.query(topic, q, with_committed=False) for q in queues)
        )
        return [
            QueueStats(q, a.min_offset, a.max_offset) for q, a in zip(queues, answers, strict=True)
        ]


def _route_matches(route: TopicRoute, expected: Mapping[str, TopicSettings]) -> bool:
    for name, settings in expected.items():
        group = route.group(name)
        if (
            group is None
            or group.read_queues != settings.read_queues
            or group.write_queues != settings.write_queues
        ):
            return False
    return True
