"""Prometheus metrics of one nameserver: the registry and the failover controller as this
nameserver sees them, read at scrape time.

Every nameserver exports its own view, so a cluster of three exports three copies of
each group's state; dashboards and alerts take the ``max`` (or the leader's: join on
``metaq_controller_is_leader``). Each nameserver has its own registry, with the
process, platform and GC collectors on it.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import (
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from metaq.common.metrics import standard_collectors
from metaq.nameserver.controller import Controller
from metaq.nameserver.registry import Registry


class NameServerMetrics:
    """What ``GET /metrics`` renders."""

    def __init__(self, registry: Registry, controller: Controller) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        standard_collectors(self.registry, "nameserver")
        self.registry.register(_StateCollector(registry, controller))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector:
    def __init__(self, registry: Registry, controller: Controller) -> None:
        self._registry = registry
        self._controller = controller

    def collect(self) -> Iterable[Metric]:
        registry, controller = self._registry, self._controller
        brokers = GaugeMetricFamily(
            "metaq_registered_brokers",
            "Live brokers registered here, by cluster, group and role",
            labels=["cluster", "broker_group", "role"],
        )
        counts: dict[tuple[str, str, str], int] = {}
        for cluster in registry.cluster_info():
            for group in cluster.groups:
                for broker in group.brokers:
                    key = (cluster.cluster, group.broker_name, broker.state.role.value)
                    counts[key] = counts.get(key, 0) + 1
        for key, count in sorted(counts.items()):
            brokers.add_metric(list(key), count)
        yield brokers

        controls = controller.controls
        groups = sorted(set(registry.group_names()) | set(controls))
        has_master = GaugeMetricFamily(
            "metaq_group_has_master",
            "1 while the group's routes have a master taking writes, 0 while they have none "
            "(every group with a registered broker or a controller state)",
            labels=["broker_group"],
        )
        without = 0
        for name in groups:
            present = registry.has_master(name)
            without += not present
            has_master.add_metric([name], 1 if present else 0)
        yield has_master
        yield GaugeMetricFamily(
            "metaq_controller_groups_without_master",
            "Groups whose routes have no master taking writes",
            value=without,
        )

        writable = GaugeMetricFamily(
            "metaq_topic_writable_queues",
            "Queues of the topic the routes send to now: write queues of the groups that "
            "serve it with a master and write permission (0: every send to it fails); "
            "every topic a live broker serves",
            labels=["topic"],
        )
        for topic in registry.topics():
            route = registry.route(topic)
            writable.add_metric([topic], 0 if route is None else len(route.write_queues))
        yield writable

        epoch = GaugeMetricFamily(
            "metaq_controller_epoch", "The group's committed epoch", labels=["broker_group"]
        )
        in_sync = GaugeMetricFamily(
            "metaq_controller_in_sync_replicas",
            "Size of the group's committed in-sync set (its master included): who may be "
            "elected next",
            labels=["broker_group"],
        )
        for name, control in sorted(controls.items()):
            epoch.add_metric([name], control.epoch)
            in_sync.add_metric([name], len(control.in_sync_ids))
        yield epoch
        yield in_sync
        failovers = CounterMetricFamily(
            "metaq_controller_failovers",
            "Committed changes of a group's master (a failover or a switchover) this "
            "nameserver has applied since it started, its Raft log's replay at start-up "
            "included",
            labels=["broker_group"],
        )
        # Every group known here, at zero until its first change: increase() over a
        # series that appears at 1 would miss that change.
        changes = controller.master_changes
        for name in sorted(set(groups) | set(changes)):
            failovers.add_metric([name], changes.get(name, 0))
        yield failovers
        yield GaugeMetricFamily(
            "metaq_controller_is_leader",
            "1 while this nameserver is the controller's Raft leader (it decides failovers)",
            value=1 if controller.is_leader else 0,
        )
        leader = GaugeMetricFamily(
            "metaq_controller_raft_info",
            "Always 1: this member's Raft address and the leader it knows ('' when none)",
            labels=["address", "leader"],
        )
        leader.add_metric([controller.address, controller.leader or ""], 1)
        yield leader
