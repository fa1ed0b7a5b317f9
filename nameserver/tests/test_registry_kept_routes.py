"""The registry keeps a topic's route until something it shows changes: a kept route is
always the route built afresh, whatever brokers do, and steady heartbeats keep it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.common.model import BrokerKey, BrokerState, GroupControl, Permission, Role, TopicConfig
from metaq.nameserver.registry import RegistrationRefused, Registry

EXPIRY_S = 10.0
TOPICS = ("t1", "t2", "t3", "t4")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def state(group: str, broker_id: int, **changes: object) -> BrokerState:
    base = BrokerState(
        cluster="c1",
        key=BrokerKey(group, broker_id),
        role=Role.MASTER if broker_id == 0 else Role.SLAVE,
        data_address=f"127.0.0.1:{9000 + broker_id}",
        epoch=1,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


registrations = st.builds(
    lambda group, broker_id, role, epoch, controlled, permission, port, room, offset, topics: (
        "register",
        state(
            group,
            broker_id,
            role=role,
            epoch=epoch,
            controlled=controlled,
            permission=permission,
            data_address=f"127.0.0.1:{port}",
            computer_room=room,
            commitlog_max_offset=offset,
        ),
        topics,
    ),
    st.sampled_from(["broker-a", "broker-b"]),
    st.integers(0, 2),
    st.sampled_from([Role.MASTER, Role.SLAVE]),
    st.integers(1, 3),
    st.booleans(),
    st.sampled_from(list(Permission)),
    st.sampled_from([9000, 9001, 9002]),
    st.sampled_from(["", "room1"]),
    st.integers(0, 1 << 20),
    st.sets(st.sampled_from(TOPICS[:3]), max_size=3),
)
# A broker registered before heartbeats again with one field changed (or, with the
# offset, nothing a route shows): the small steps that random registrations rarely take.
heartbeats = st.tuples(
    st.just("beat"),
    st.integers(0, 5),
    st.sampled_from(
        [
            ("commitlog_max_offset", 7),
            ("role", Role.MASTER),
            ("role", Role.SLAVE),
            ("epoch", 4),
            ("controlled", True),
            ("controlled", False),
            ("permission", Permission.READ_ONLY),
            ("http_address", "127.0.0.1:8080"),
            ("computer_room", "room2"),
            ("cluster", "c2"),
        ]
    ),
)
operations = st.lists(
    st.one_of(
        registrations,
        registrations,
        heartbeats,
        heartbeats,
        st.tuples(
            st.just("unregister"), st.sampled_from(["broker-a", "broker-b"]), st.integers(0, 2)
        ),
        st.tuples(
            st.just("control"),
            st.sampled_from(["broker-a", "broker-b"]),
            st.integers(0, 2),
            st.integers(1, 4),
        ),
        st.tuples(st.just("advance"), st.sampled_from([0.0, 0.5, 4.0, 9.9, 10.0, 10.1, 30.0])),
        st.tuples(st.just("expire")),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_a_kept_route_is_always_the_route_built_afresh(ops: list[tuple[object, ...]]) -> None:
    clock = FakeClock()
    registry = Registry(EXPIRY_S, clock)
    tables: dict[BrokerKey, dict[str, TopicConfig]] = {}
    states: dict[BrokerKey, BrokerState] = {}
    for op in ops:
        match op:
            case ("register", BrokerState() as broker, set() as names):
                # The same table object again unless the topics changed, as a session
                # registers: an unchanged table is passed as it was.
                old = tables.get(broker.key)
                wanted = {n: TopicConfig(n, 4, 4) for n in sorted(names)}
                table = old if old is not None and old == wanted else wanted
                try:
                    registry.register(broker, table)
                except RegistrationRefused:
                    continue
                tables[broker.key] = table
                states[broker.key] = broker
            case ("beat", int() as pick, (str() as field, value)) if states:
                changes: dict[str, Any] = {field: value}
                broker = replace(list(states.values())[pick % len(states)], **changes)
                try:
                    registry.register(broker, tables[broker.key])
                except RegistrationRefused:
                    continue
                states[broker.key] = broker
            case ("unregister", str() as group, int() as broker_id):
                registry.unregister(BrokerKey(group, broker_id))
            case ("control", str() as group, int() as master_id, int() as epoch):
                registry.set_control(GroupControl(group, epoch, master_id, (master_id,)))
            case ("advance", float() as seconds):
                clock.now += seconds
            case ("expire",):
                registry.expire()
        for name in TOPICS:
            assert registry.route(name) == registry.built_route(name, clock()), (name, op)


def test_a_heartbeat_that_changes_nothing_a_route_shows_keeps_the_route() -> None:
    clock = FakeClock()
    registry = Registry(EXPIRY_S, clock)
    table = {"orders": TopicConfig("orders", 4, 4)}
    master, slave = state("broker-a", 0), state("broker-a", 1)
    registry.register(master, table)
    registry.register(slave, table)
    first = registry.route("orders")
    assert first is not None

    for n in range(1, 4):
        clock.now += 5.0
        # Only the commit-log offset and the master's in-sync ids move in a steady group.
        registry.register(replace(master, commitlog_max_offset=n * 1000, in_sync_ids=(0, 1)), table)
        registry.register(replace(slave, commitlog_max_offset=n * 1000), table)
        assert registry.route("orders") is first

    registry.register(replace(master, permission=Permission.READ_ONLY), table)
    changed = registry.route("orders")
    assert changed is not first and changed is not None
    assert not changed.groups[0].permission.writable


def test_a_kept_route_loses_a_broker_the_moment_it_could_expire() -> None:
    clock = FakeClock()
    registry = Registry(EXPIRY_S, clock)
    table = {"orders": TopicConfig("orders", 4, 4)}
    registry.register(state("broker-a", 0), table)
    clock.now += 5.0
    registry.register(state("broker-a", 1), table)
    assert [b.broker_id for b in registry.route("orders").groups[0].brokers] == [0, 1]  # type: ignore[union-attr]

    clock.now += EXPIRY_S - 5.0  # the master's last heartbeat is exactly the expiry old
    assert [b.broker_id for b in registry.route("orders").groups[0].brokers] == [0, 1]  # type: ignore[union-attr]
    clock.now += 0.001  # nothing registered or swept: only time moved
    assert [b.broker_id for b in registry.route("orders").groups[0].brokers] == [1]  # type: ignore[union-attr]


def test_a_master_the_controller_did_not_make_shows_as_master_once_it_is_not_controlled() -> None:
    clock = FakeClock()
    registry = Registry(EXPIRY_S, clock)
    table = {"orders": TopicConfig("orders", 4, 4)}
    registry.set_control(GroupControl("broker-a", 2, 1, (1,)))
    master = state("broker-a", 0, controlled=True)
    registry.register(master, table)
    route = registry.route("orders")
    assert route is not None and route.groups[0].brokers[0].role is Role.SLAVE

    registry.register(replace(master, controlled=False), table)
    route = registry.route("orders")
    assert route is not None and route.groups[0].brokers[0].role is Role.MASTER
