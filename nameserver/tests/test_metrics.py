"""The nameserver's /metrics: registered brokers, groups with and without a master by
the registry's liveness, and the controller's committed state and master changes."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from metaq.common.model import BrokerKey, BrokerState, GroupControl, Permission, Role, TopicConfig
from metaq.nameserver.controller import Controller, ControllerSettings
from metaq.nameserver.metrics import NameServerMetrics
from metaq.nameserver.registry import Registry

EXPIRY_S = 10.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def samples(metrics: NameServerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def state(name: str, broker_id: int, role: Role) -> BrokerState:
    return BrokerState(
        cluster="c1", key=BrokerKey(name, broker_id), role=role, data_address=f"h:{broker_id}"
    )


def test_groups_brokers_and_master_changes_are_exported() -> None:
    clock = FakeClock()
    registry = Registry(EXPIRY_S, clock)
    controller = Controller(registry, ControllerSettings(), clock)
    metrics = NameServerMetrics(registry, controller)
    registry.register(state("broker-a", 0, Role.MASTER), {})
    registry.register(state("broker-a", 1, Role.SLAVE), {})
    registry.register(state("broker-b", 1, Role.SLAVE), {})  # its master is gone

    got = samples(metrics)
    assert got[("metaq_registered_brokers", (("broker_group", "broker-a"), ("cluster", "c1"),
                                             ("role", "master")))] == 1  # fmt: skip
    assert got[("metaq_registered_brokers", (("broker_group", "broker-a"), ("cluster", "c1"),
                                             ("role", "slave")))] == 1  # fmt: skip
    assert got[("metaq_group_has_master", (("broker_group", "broker-a"),))] == 1
    assert got[("metaq_group_has_master", (("broker_group", "broker-b"),))] == 0
    assert got[("metaq_controller_groups_without_master", ())] == 1
    assert ("process_resident_memory_bytes", ()) in got
    # At zero from the first sight of a group: increase() then counts its first failover.
    assert got[("metaq_controller_failovers_total", (("broker_group", "broker-a"),))] == 0
    assert got[("metaq_controller_failovers_total", (("broker_group", "broker-b"),))] == 0

    # The controller committed broker-a with 0 as master, then elected 1.
    controller._take({"broker-a": GroupControl("broker-a", 1, 0, (0, 1))})
    controller._take({"broker-a": GroupControl("broker-a", 1, 0, (0,))})  # in-sync change only
    controller._take({"broker-a": GroupControl("broker-a", 2, 1, (1,))})
    got = samples(metrics)
    group = (("broker_group", "broker-a"),)
    assert got[("metaq_controller_failovers_total", group)] == 1
    assert got[("metaq_controller_epoch", group)] == 2
    assert got[("metaq_controller_in_sync_replicas", group)] == 1

    # Silent past the expiry: a group the controller manages stays, without a master.
    clock.now += EXPIRY_S + 1
    got = samples(metrics)
    assert got[("metaq_group_has_master", group)] == 0
    assert got[("metaq_controller_groups_without_master", ())] == 2
    assert not any(name == "metaq_registered_brokers" for name, _ in got)


def test_writable_queues_per_topic_drop_to_zero_without_a_master_or_write_permission() -> None:
    clock = FakeClock()
    registry = Registry(EXPIRY_S, clock)
    metrics = NameServerMetrics(registry, Controller(registry, ControllerSettings(), clock))
    orders, audit = TopicConfig("orders", 4, 4), TopicConfig("audit", 2, 2)
    frozen = TopicConfig("frozen", 2, 2, Permission.READ_ONLY)
    registry.register(state("broker-a", 0, Role.MASTER), {"orders": orders, "frozen": frozen})
    registry.register(state("broker-b", 0, Role.MASTER), {"orders": orders})
    registry.register(state("broker-c", 1, Role.SLAVE), {"audit": audit})  # no master

    got = samples(metrics)
    assert got[("metaq_topic_writable_queues", (("topic", "orders"),))] == 8
    assert got[("metaq_topic_writable_queues", (("topic", "audit"),))] == 0
    assert got[("metaq_topic_writable_queues", (("topic", "frozen"),))] == 0

    registry.register(state("broker-c", 0, Role.MASTER), {"audit": audit})
    assert samples(metrics)[("metaq_topic_writable_queues", (("topic", "audit"),))] == 2
