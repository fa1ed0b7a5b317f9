"""The broker registry: liveness by a fake clock, routes, ordering, permissions, sessions."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metaq.common.model import BrokerKey, BrokerState, GroupControl, Permission, Role, TopicConfig
from metaq.nameserver.assignment import QueueRef
from metaq.nameserver.registry import (
    FORGET_DEPARTED_AFTER_S,
    RegistrationRefused,
    Registry,
    readable_queues,
)

EXPIRY_S = 10.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def broker(
    name: str = "broker-a",
    broker_id: int = 0,
    *,
    role: Role | None = None,
    room: str = "",
    epoch: int = 1,
    permission: Permission = Permission.READ_WRITE,
    cluster: str = "c1",
) -> BrokerState:
    return BrokerState(
        cluster=cluster,
        key=BrokerKey(name, broker_id),
        role=role or (Role.MASTER if broker_id == 0 else Role.SLAVE),
        data_address=f"127.0.0.1:{9000 + broker_id}",
        computer_room=room,
        epoch=epoch,
        permission=permission,
    )


def table(*configs: TopicConfig) -> dict[str, TopicConfig]:
    return {config.name: config for config in configs}


def topic(
    name: str = "orders",
    queues: int = 4,
    permission: Permission = Permission.READ_WRITE,
    *,
    write_queues: int | None = None,
) -> TopicConfig:
    return TopicConfig(
        name=name,
        read_queues=queues,
        write_queues=queues if write_queues is None else write_queues,
        permission=permission,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry(clock: FakeClock) -> Registry:
    return Registry(EXPIRY_S, clock)


# --- routes ------------------------------------------------------------------------------


def test_registered_master_serves_its_topics_in_the_route(registry: Registry) -> None:
    registered = registry.register(broker(room="hz"), table(topic("orders", 8)))

    route = registry.route("orders")

    assert route is not None
    (group,) = route.groups
    assert (group.cluster, group.broker_name, group.computer_room) == ("c1", "broker-a", "hz")
    assert (group.read_queues, group.write_queues) == (8, 8)
    assert group.permission is Permission.READ_WRITE
    assert [(b.broker_id, b.role, b.data_address) for b in group.brokers] == [
        (0, Role.MASTER, "127.0.0.1:9000")
    ]
    assert (registered.master_data_address, registered.epoch) == ("127.0.0.1:9000", 1)


def test_a_topic_nobody_serves_has_no_route(registry: Registry) -> None:
    registry.register(broker(), table(topic("orders")))

    assert registry.route("payments") is None


def test_route_orders_groups_by_name_and_brokers_master_first(registry: Registry) -> None:
    registry.register(broker("broker-b", 2), table(topic()))
    registry.register(broker("broker-b", 1), table(topic()))
    # After a failover the master need not be id 0.
    registry.register(broker("broker-b", 3, role=Role.MASTER, epoch=2), table(topic()))
    registry.register(broker("broker-a", 0), table(topic()))

    route = registry.route("orders")

    assert route is not None
    assert [g.broker_name for g in route.groups] == ["broker-a", "broker-b"]
    assert [b.broker_id for b in route.groups[1].brokers] == [3, 1, 2]


def test_answers_do_not_depend_on_the_order_brokers_registered_in(clock: FakeClock) -> None:
    states = [
        (broker("broker-c", 0, room="sh"), table(topic("orders", 2))),
        (broker("broker-a", 1), table(topic("orders", 4))),
        (broker("broker-a", 0, room="hz"), table(topic("orders", 4))),
        (broker("broker-b", 0), table(topic("orders", 3, Permission.READ_ONLY))),
    ]
    answers = []
    for order in itertools.permutations(states):
        registry = Registry(EXPIRY_S, clock)
        for state, topics in order:
            registry.register(state, topics)
        answers.append((registry.route("orders"), registry.cluster_info()))

    assert all(answer == answers[0] for answer in answers)


def test_the_masters_topic_config_wins_over_a_slaves(registry: Registry) -> None:
    registry.register(broker("broker-a", 1), table(topic("orders", 2)))
    registry.register(broker("broker-a", 0), table(topic("orders", 8)))

    route = registry.route("orders")

    assert route is not None
    assert route.groups[0].read_queues == 8


def test_a_group_without_a_master_is_readable_from_slaves_but_not_writable(
    registry: Registry, clock: FakeClock
) -> None:
    registry.register(broker("broker-a", 0), table(topic()))
    registry.register(broker("broker-a", 1, room="hz"), table(topic()))

    registry.unregister(BrokerKey("broker-a", 0))
    route = registry.route("orders")

    assert route is not None
    (group,) = route.groups
    assert group.permission is Permission.READ_ONLY
    assert [(b.broker_id, b.role) for b in group.brokers] == [(1, Role.SLAVE)]
    assert group.computer_room == "hz"


def test_the_brokers_permission_restricts_every_topic(registry: Registry) -> None:
    registry.register(
        broker(permission=Permission.WRITE_WIPE),
        table(topic("rw"), topic("wo", permission=Permission.WRITE_ONLY)),
    )

    rw, wo = registry.route("rw"), registry.route("wo")

    assert rw is not None and wo is not None
    assert rw.groups[0].permission is Permission.WRITE_WIPE
    assert wo.groups[0].permission is Permission.NONE


def test_each_group_keeps_its_own_permission_and_only_readable_groups_are_shared_out(
    registry: Registry,
) -> None:
    registry.register(broker("a", room="hz"), table(topic("orders", 2)))
    registry.register(broker("b"), table(topic("orders", 1, Permission.READ_ONLY)))
    registry.register(broker("c"), table(topic("orders", 1, Permission.WRITE_WIPE)))
    registry.register(broker("d"), table(topic("orders", 3, Permission.WRITE_ONLY)))
    registry.register(broker("e"), table(topic("orders", 3, Permission.NONE)))

    route = registry.route("orders")

    assert route is not None
    assert {g.broker_name: g.permission for g in route.groups} == {
        "a": Permission.READ_WRITE,
        "b": Permission.READ_ONLY,
        "c": Permission.WRITE_WIPE,
        "d": Permission.WRITE_ONLY,
        "e": Permission.NONE,
    }
    assert readable_queues(route) == [
        QueueRef("a", 0, "hz"),
        QueueRef("a", 1, "hz"),
        QueueRef("b", 0, ""),
        QueueRef("c", 0, ""),
    ]


def test_readable_queues_follow_read_queues_not_write_queues(registry: Registry) -> None:
    registry.register(broker(), table(topic("orders", 2, write_queues=4)))

    route = registry.route("orders")

    assert route is not None
    assert [q.queue_id for q in readable_queues(route)] == [0, 1]


def test_a_new_topic_table_replaces_the_old_one(registry: Registry) -> None:
    registry.register(broker(), table(topic("orders"), topic("payments")))
    registry.register(broker(), table(topic("orders", 2)))

    assert registry.route("payments") is None
    assert registry.topics() == ["orders"]


# --- liveness ----------------------------------------------------------------------------


def test_a_silent_broker_leaves_the_answers_just_past_the_expiry(
    registry: Registry, clock: FakeClock
) -> None:
    registry.register(broker(), table(topic()))

    clock.advance(EXPIRY_S)
    assert registry.route("orders") is not None

    clock.advance(0.001)
    assert registry.route("orders") is None
    assert registry.cluster_info() == []


def test_heartbeats_keep_a_broker_alive_past_the_expiry(
    registry: Registry, clock: FakeClock
) -> None:
    topics = table(topic())
    for _ in range(5):
        registry.register(broker(), topics)
        clock.advance(EXPIRY_S * 0.9)

    assert registry.route("orders") is not None


def test_the_sweep_forgets_exactly_the_silent_brokers(registry: Registry, clock: FakeClock) -> None:
    registry.register(broker("broker-b", 1), table(topic()))
    registry.register(broker("broker-a", 0), table(topic()))
    clock.advance(EXPIRY_S / 2)
    registry.register(broker("broker-c", 0), table(topic()))
    clock.advance(EXPIRY_S / 2 + 1)

    gone = registry.expire()

    assert gone == [BrokerKey("broker-a", 0), BrokerKey("broker-b", 1)]
    assert registry.expire() == []
    assert not registry.unregister(BrokerKey("broker-a", 0))
    route = registry.route("orders")
    assert route is not None
    assert [g.broker_name for g in route.groups] == ["broker-c"]


def test_unregister_removes_a_broker_at_once_and_is_idempotent(registry: Registry) -> None:
    registry.register(broker("broker-a", 0), table(topic()))
    registry.register(broker("broker-a", 1), table(topic()))

    assert registry.unregister(BrokerKey("broker-a", 1))
    assert not registry.unregister(BrokerKey("broker-a", 1))
    assert not registry.unregister(BrokerKey("nobody", 0))
    route = registry.route("orders")
    assert route is not None
    assert [b.broker_id for b in route.groups[0].brokers] == [0]


def test_an_ended_session_removes_its_broker_at_once(registry: Registry) -> None:
    registry.register(broker(), table(topic()), session=7)

    assert registry.end_session(BrokerKey("broker-a", 0), 7)
    assert registry.route("orders") is None


def test_an_old_session_ending_late_leaves_the_reconnected_broker_alone(
    registry: Registry,
) -> None:
    key = BrokerKey("broker-a", 0)
    registry.register(broker(), table(topic()), session=1)
    registry.register(broker(), table(topic()), session=2)
    # A unary registration does not take the broker away from its session.
    registry.register(broker(), table(topic()))

    assert not registry.end_session(key, 1)
    assert registry.is_live(key)
    assert registry.end_session(key, 2)
    assert not registry.is_live(key)


def test_a_broker_registered_without_a_session_ignores_session_ends(registry: Registry) -> None:
    registry.register(broker(), table(topic()))

    assert not registry.end_session(BrokerKey("broker-a", 0), 1)
    assert registry.route("orders") is not None


# --- masters, epochs, clusters -------------------------------------------------------------


def test_a_master_of_a_higher_epoch_fences_the_old_master_out(registry: Registry) -> None:
    registry.register(broker("broker-a", 0, epoch=3), table(topic()))
    registry.register(broker("broker-a", 1, epoch=3), table(topic()))

    registered = registry.register(broker("broker-a", 1, role=Role.MASTER, epoch=4), table(topic()))

    assert registered.fenced == (BrokerKey("broker-a", 0),)
    assert (registered.master_data_address, registered.epoch) == ("127.0.0.1:9001", 4)
    route = registry.route("orders")
    assert route is not None
    assert [(b.broker_id, b.role) for b in route.groups[0].brokers] == [(1, Role.MASTER)]
    assert route.groups[0].epoch == 4


@pytest.mark.parametrize("epoch", [2, 3])
def test_a_master_claim_not_above_the_live_masters_epoch_is_refused(
    registry: Registry, epoch: int
) -> None:
    registry.register(broker("broker-a", 0, epoch=3), table(topic()))

    with pytest.raises(RegistrationRefused, match=r"broker-a/0 is its master at epoch 3"):
        registry.register(broker("broker-a", 1, role=Role.MASTER, epoch=epoch), table(topic()))

    route = registry.route("orders")
    assert route is not None
    assert [b.broker_id for b in route.groups[0].brokers] == [0]


def test_a_slave_behind_on_the_epoch_is_still_registered(registry: Registry) -> None:
    registry.register(broker("broker-a", 0, epoch=5), table(topic()))

    registered = registry.register(broker("broker-a", 1, epoch=4), table(topic()))

    assert registered.epoch == 5
    assert registry.is_live(BrokerKey("broker-a", 1))


def test_a_restarted_master_may_reregister_at_its_own_epoch(registry: Registry) -> None:
    registry.register(broker(epoch=3), table(topic()), session=1)

    registered = registry.register(broker(epoch=3), table(topic()), session=2)

    assert registered.master_data_address == "127.0.0.1:9000"


def test_a_live_broker_cannot_be_registered_again_from_another_address(
    registry: Registry,
) -> None:
    registry.register(broker(epoch=3), table(topic()), session=1)
    forged = replace(broker(epoch=4), data_address="10.6.6.6:1")

    with pytest.raises(RegistrationRefused, match=r"registered and live at 127\.0\.0\.1:9000"):
        registry.register(forged, table(topic("stolen")))

    route = registry.route("orders")
    assert route is not None
    assert route.groups[0].brokers[0].data_address == "127.0.0.1:9000"
    assert registry.route("stolen") is None


def test_a_moved_broker_registers_once_its_old_entry_is_gone(
    registry: Registry, clock: FakeClock
) -> None:
    registry.register(broker(), table(topic()), session=1)
    registry.end_session(BrokerKey("broker-a", 0), 1)
    registry.register(replace(broker(), data_address="h:1"), table(topic()))

    clock.advance(registry.broker_expiry_s + 0.1)
    registered = registry.register(replace(broker(), data_address="h:2"), table(topic()))

    assert registered.master_data_address == "h:2"


def test_a_group_belongs_to_one_cluster(registry: Registry) -> None:
    registry.register(broker("broker-a", 0, cluster="c1"), table(topic()))

    with pytest.raises(RegistrationRefused, match="a group belongs to one cluster"):
        registry.register(broker("broker-a", 1, cluster="c2"), table(topic()))


def controlled(broker_id: int, role: Role, epoch: int) -> BrokerState:
    return replace(broker("broker-a", broker_id, role=role, epoch=epoch), controlled=True)


def test_in_a_controlled_group_only_the_controllers_master_at_its_epoch_takes_writes(
    registry: Registry,
) -> None:
    # The old master has not heard yet that broker 1 replaced it at epoch 6.
    registry.register(controlled(0, Role.MASTER, 5), table(topic()))
    registry.register(controlled(1, Role.SLAVE, 5), table(topic()))
    registry.set_control(GroupControl("broker-a", 6, 1, (1,)))

    waiting = registry.route("orders")
    registered = registry.register(controlled(1, Role.MASTER, 6), table(topic()))
    moved = registry.route("orders")

    assert waiting is not None and moved is not None
    (group,) = waiting.groups
    assert [(b.broker_id, b.role) for b in group.brokers] == [(0, Role.SLAVE), (1, Role.SLAVE)]
    assert group.permission is Permission.READ_ONLY
    (group,) = moved.groups
    assert [(b.broker_id, b.role) for b in group.brokers] == [(1, Role.MASTER), (0, Role.SLAVE)]
    assert group.permission is Permission.READ_WRITE
    assert registered.fenced == ()
    assert registered.master_data_address == "127.0.0.1:9001"
    assert registry.control("broker-a") == GroupControl("broker-a", 6, 1, (1,))


def test_a_master_elected_at_an_epoch_this_nameserver_has_not_heard_of_is_routed(
    registry: Registry,
) -> None:
    # This nameserver's controller is cut off from the Raft majority: it still has broker
    # 0 as master at epoch 5, while the majority elected broker 1 at epoch 6.
    registry.set_control(GroupControl("broker-a", 5, 0, (0, 1)))
    registry.register(controlled(0, Role.SLAVE, 5), table(topic()))
    registry.register(controlled(1, Role.MASTER, 6), table(topic()))

    route = registry.route("orders")

    assert route is not None
    (group,) = route.groups
    assert [(b.broker_id, b.role) for b in group.brokers] == [(1, Role.MASTER), (0, Role.SLAVE)]
    assert group.permission is Permission.READ_WRITE


def test_controlled_masters_are_neither_refused_nor_fenced_for_their_epoch(
    registry: Registry,
) -> None:
    registry.register(controlled(1, Role.MASTER, 6), table(topic()))

    registered = registry.register(controlled(0, Role.MASTER, 5), table(topic()))

    assert registered.fenced == ()
    assert [b.state.key.broker_id for b in registry.members("broker-a")] == [0, 1]


def test_members_and_addresses_are_of_live_brokers_only(
    registry: Registry, clock: FakeClock
) -> None:
    registry.register(broker("broker-a", 0), table(topic()))
    clock.advance(EXPIRY_S / 2)
    registry.register(broker("broker-a", 1), table(topic()))

    assert [m.last_heartbeat_age_s for m in registry.members("broker-a")] == [EXPIRY_S / 2, 0]
    clock.advance(EXPIRY_S / 2 + 1)

    assert [m.state.key.broker_id for m in registry.members("broker-a")] == [1]
    assert registry.data_address(BrokerKey("broker-a", 0)) == ""
    assert registry.data_address(BrokerKey("broker-a", 1)) == "127.0.0.1:9001"
    assert registry.group_names() == ["broker-a"]
    assert registry.members("broker-b") == []


def test_cluster_info_lists_live_brokers_by_cluster_group_and_id(
    registry: Registry, clock: FakeClock
) -> None:
    registry.register(broker("broker-b", 0, cluster="c2", room="sh"), table())
    registry.register(broker("broker-a", 1), table(topic("x"), topic("y")), session=3)
    clock.advance(2.5)
    registry.register(broker("broker-a", 0, room="hz", epoch=2), table(topic("x")))

    clusters = registry.cluster_info()

    assert [c.cluster for c in clusters] == ["c1", "c2"]
    (group_a,) = clusters[0].groups
    assert (group_a.broker_name, group_a.epoch, group_a.computer_room) == ("broker-a", 2, "hz")
    assert [
        (b.state.key.broker_id, b.last_heartbeat_age_s, b.session_open, b.topic_count)
        for b in group_a.brokers
    ] == [(0, 0.0, False, 1), (1, 2.5, True, 2)]
    assert [c.cluster for c in registry.cluster_info("c2")] == ["c2"]


# --- permissions -------------------------------------------------------------------------

permissions = st.sampled_from(list(Permission))


@given(permissions, permissions)
def test_restricting_keeps_what_both_allow(first: Permission, second: Permission) -> None:
    both = first.restrict(second)

    assert both == second.restrict(first)
    assert both.readable == (first.readable and second.readable)
    assert both.writable == (first.writable and second.writable)
    assert first.restrict(first) is first


def test_a_wipe_survives_restriction_while_reads_remain() -> None:
    assert Permission.READ_WRITE.restrict(Permission.WRITE_WIPE) is Permission.WRITE_WIPE
    assert Permission.READ_ONLY.restrict(Permission.WRITE_WIPE) is Permission.WRITE_WIPE
    assert Permission.WRITE_ONLY.restrict(Permission.WRITE_WIPE) is Permission.NONE
    assert Permission.READ_WRITE.without_writes() is Permission.READ_ONLY
    assert Permission.WRITE_WIPE.without_writes() is Permission.WRITE_WIPE


def test_a_broker_that_left_is_kept_as_departed_for_an_hour_unless_it_comes_back(
    registry: Registry, clock: FakeClock
) -> None:
    registry.register(broker(broker_id=0), table())
    registry.register(broker(broker_id=1), table())
    assert registry.departed() == []

    clock.advance(EXPIRY_S + 1)
    registry.register(broker(broker_id=0), table())
    assert registry.expire() == [BrokerKey("broker-a", 1)]
    [gone] = registry.departed()
    assert (gone.state.key, gone.last_heartbeat_age_s, gone.down) == (
        BrokerKey("broker-a", 1),
        0.0,
        True,
    )

    clock.advance(60)
    assert registry.departed()[0].last_heartbeat_age_s == 60
    registry.register(broker(broker_id=1), table())
    assert registry.departed() == []

    registry.unregister(BrokerKey("broker-a", 1))
    clock.advance(FORGET_DEPARTED_AFTER_S + 1)
    assert registry.departed() == []


def test_a_route_looks_only_at_the_groups_serving_its_topic(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Clients ask in proportion to their number: a route that looked at every group would
    # cost clients times groups.
    for index in range(200):
        registry.register(broker(f"other-{index:03d}"), table(topic(f"topic-{index}")))
    registry.register(broker("broker-z"), table(topic("orders")))
    looked: list[object] = []
    live = registry._live

    def counting(group: Any, now: float) -> Any:
        looked.append(group)
        return live(group, now)

    monkeypatch.setattr(registry, "_live", counting)

    route = registry.route("orders")

    assert route is not None and [g.broker_name for g in route.groups] == ["broker-z"]
    assert len(looked) == 1


def test_routes_follow_tables_that_change_and_brokers_that_leave(registry: Registry) -> None:
    registry.register(broker("broker-a", 0), table(topic("orders"), topic("payments")))
    registry.register(broker("broker-a", 1), table(topic("orders"), topic("audit")))
    registry.register(broker("broker-b", 0), table(topic("payments")))

    registry.register(broker("broker-a", 0), table(topic("orders")))
    payments = registry.route("payments")
    assert payments is not None and [g.broker_name for g in payments.groups] == ["broker-b"]

    registry.unregister(BrokerKey("broker-a", 0))
    orders = registry.route("orders")
    assert orders is not None and [b.broker_id for b in orders.groups[0].brokers] == [1]

    registry.unregister(BrokerKey("broker-a", 1))
    assert registry.route("orders") is None and registry.route("audit") is None
    assert registry.route("payments") is not None


def test_a_fenced_masters_topics_leave_the_routes_with_it(registry: Registry) -> None:
    registry.register(broker("broker-a", 0, epoch=1), table(topic("orders"), topic("payments")))
    registry.register(broker("broker-a", 1, role=Role.MASTER, epoch=2), table(topic("orders")))

    assert registry.route("payments") is None
    orders = registry.route("orders")
    assert orders is not None and [b.broker_id for b in orders.groups[0].brokers] == [1]


def test_a_table_changed_in_place_reindexes_only_the_topics_named(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A session applies a broker's topic changes to the table it registered: a create must
    # not cost a pass over the broker's 10,000 topics.
    served = table(*(topic(f"topic-{n:05d}") for n in range(10_000)))
    registry.register(broker("broker-a", 0), served)
    registry.register(broker("broker-a", 1), table(topic("topic-00001")))
    unindexed: list[str] = []
    unindex = registry._unindex

    def counting(name: str, topics: Any, group: Any) -> None:
        topics = list(topics)
        unindexed.extend(topics)
        unindex(name, topics, group)

    monkeypatch.setattr(registry, "_unindex", counting)

    served["fresh"] = topic("fresh")
    del served["topic-00000"]
    del served["topic-00001"]  # the slave still serves it
    registry.register(
        broker("broker-a", 0), served, changed=("fresh", "topic-00000", "topic-00001")
    )

    assert unindexed == ["topic-00000", "topic-00001"]
    assert registry.route("fresh") is not None
    assert registry.route("topic-00000") is None
    route = registry.route("topic-00001")
    assert route is not None and [b.broker_id for b in route.groups[0].brokers] == [1]
