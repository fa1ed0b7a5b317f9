"""The shared vocabulary: the enums mirror the wire, converters round-trip, old forms load."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metaq.common.model import (
    TOPIC_PERMISSIONS,
    BrokerAddress,
    BrokerKey,
    BrokerState,
    BrokerView,
    ConsumeMode,
    GroupRoute,
    GroupView,
    Permission,
    ReplicationMode,
    Role,
    TopicConfig,
    TopicRoute,
)
from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1.data_pb2 import ConsumerHeartbeatRequest


def wire_names(enum_type: Any, prefix: str) -> set[str]:
    names: list[str] = enum_type.keys()
    return {n.removeprefix(prefix) for n in names} - {"UNSPECIFIED"}


def test_the_enums_mirror_the_wire_name_for_name() -> None:
    assert {p.name for p in Permission} == wire_names(pb.Permission, "PERMISSION_")
    assert {r.name for r in Role} == wire_names(pb.BrokerRole, "BROKER_ROLE_")
    assert {m.name for m in ReplicationMode} == wire_names(pb.ReplicationMode, "REPLICATION_MODE_")
    for permission in Permission:
        assert pb.Permission.Name(permission.to_proto()) == f"PERMISSION_{permission.name}"
        assert Permission.from_proto(permission.to_proto()) is permission
    for role in Role:
        assert pb.BrokerRole.Name(role.to_proto()) == f"BROKER_ROLE_{role.name}"
        assert Role.from_proto(role.to_proto()) is role
    for mode in ReplicationMode:
        assert pb.ReplicationMode.Name(mode.to_proto()) == f"REPLICATION_MODE_{mode.name}"
        assert ReplicationMode.from_proto(mode.to_proto()) is mode


def test_consume_modes_mirror_the_heartbeat_and_unspecified_is_clustering() -> None:
    assert {m.name for m in ConsumeMode} == wire_names(ConsumerHeartbeatRequest.Mode, "MODE_")
    for mode in ConsumeMode:
        assert ConsumeMode.from_proto(mode.to_proto()) is mode
    assert ConsumeMode.from_proto(ConsumerHeartbeatRequest.MODE_UNSPECIFIED) is (
        ConsumeMode.CLUSTERING
    )
    with pytest.raises(ValueError, match="consume mode 9"):
        ConsumeMode.from_proto(9)


def test_unspecified_on_the_wire_is_no_permission_or_role_and_no_mode() -> None:
    with pytest.raises(ValueError, match="permission 0"):
        Permission.from_proto(pb.PERMISSION_UNSPECIFIED)
    with pytest.raises(ValueError, match="broker role 0"):
        Role.from_proto(pb.BROKER_ROLE_UNSPECIFIED)
    with pytest.raises(ValueError, match="permission 99"):
        Permission.from_proto(99)
    assert ReplicationMode.from_proto(pb.REPLICATION_MODE_UNSPECIFIED) is None


@pytest.mark.parametrize(
    ("permission", "readable", "writable"),
    [
        (Permission.READ_ONLY, True, False),
        (Permission.WRITE_ONLY, False, True),
        (Permission.READ_WRITE, True, True),
        (Permission.WRITE_WIPE, True, False),
        (Permission.NONE, False, False),
    ],
)
def test_what_each_permission_allows(
    permission: Permission, readable: bool, writable: bool
) -> None:
    assert (permission.readable, permission.writable) == (readable, writable)


@given(st.sampled_from(Permission), st.sampled_from(Permission))
def test_a_restriction_allows_only_what_both_allow_and_keeps_a_wipe(
    a: Permission, b: Permission
) -> None:
    both = a.restrict(b)

    assert both.readable == (a.readable and b.readable)
    assert both.writable == (a.writable and b.writable)
    assert both.wiped == (both.readable and (a.wiped or b.wiped))
    assert not a.without_writes().writable
    assert a.without_writes().readable == a.readable


def test_the_enums_print_and_serialise_as_their_values() -> None:
    assert f"{Role.MASTER}/{Permission.WRITE_WIPE}/{ReplicationMode.SYNC}" == (
        "master/write-wipe/sync"
    )
    assert json.dumps([Role.SLAVE, Permission.READ_ONLY]) == '["slave", "read-only"]'


# --- persisted and wire forms each member wrote before the model ------------------------

BROKER_TOPICS_JSON = {
    # What metaq.broker.topics wrote to topics.json (and the topic journal) under its own
    # Permission enum: "read"/"write" for read-only/write-only; "ordered" came later.
    "r": {"read_queues": 1, "write_queues": 2, "perm": "read", "ordered": False},
    "w": {"read_queues": 3, "write_queues": 4, "perm": "write", "ordered": False},
    "rw": {"read_queues": 8, "write_queues": 8, "perm": "read-write", "ordered": True},
    "wipe": {"read_queues": 8, "write_queues": 8, "perm": "write-wipe", "ordered": False},
}


def test_the_brokers_old_topic_entries_load_and_are_written_back_unchanged() -> None:
    loaded = {
        name: TopicConfig.from_json(name, entry) for name, entry in BROKER_TOPICS_JSON.items()
    }

    assert loaded == {
        "r": TopicConfig("r", 1, 2, Permission.READ_ONLY),
        "w": TopicConfig("w", 3, 4, Permission.WRITE_ONLY),
        "rw": TopicConfig("rw", 8, 8, Permission.READ_WRITE, ordered=True),
        "wipe": TopicConfig("wipe", 8, 8, Permission.WRITE_WIPE),
    }
    assert {name: config.to_json() for name, config in loaded.items()} == BROKER_TOPICS_JSON


def test_an_entry_from_before_ordered_topics_is_unordered() -> None:
    entry = {"read_queues": 1, "write_queues": 1, "perm": "read-write"}

    assert TopicConfig.from_json("t", entry) == TopicConfig("t", 1, 1)


def test_both_spellings_of_a_topic_permission_are_read() -> None:
    for permission in Permission:
        assert Permission.from_text(permission.value) is permission
        assert Permission.from_text(permission.topic_text) is permission
    with pytest.raises(ValueError, match="'readable'"):
        Permission.from_text("readable")


def test_topic_permissions_keep_the_brokers_spelling_and_order() -> None:
    assert [p.topic_text for p in TOPIC_PERMISSIONS] == [
        "read-write",
        "read",
        "write",
        "write-wipe",
    ]


def test_the_broker_configs_replication_modes_are_read() -> None:
    assert [ReplicationMode("async"), ReplicationMode("sync")] == list(ReplicationMode)


def test_the_nameservers_route_json_keeps_its_keys_and_spellings() -> None:
    # GET /route/{topic} answers dataclasses.asdict of the route.
    route = TopicRoute(
        "orders",
        (
            GroupRoute(
                cluster="c1",
                broker_name="broker-a",
                epoch=3,
                computer_room="r1",
                brokers=(BrokerAddress(0, Role.MASTER, "127.0.0.1:1", "127.0.0.1:2", "r1"),),
                read_queues=4,
                write_queues=4,
                permission=Permission.READ_ONLY,
                ordered=False,
            ),
        ),
    )

    assert json.loads(json.dumps(dataclasses.asdict(route))) == {
        "topic": "orders",
        "groups": [
            {
                "cluster": "c1",
                "broker_name": "broker-a",
                "epoch": 3,
                "computer_room": "r1",
                "brokers": [
                    {
                        "broker_id": 0,
                        "role": "master",
                        "data_address": "127.0.0.1:1",
                        "http_address": "127.0.0.1:2",
                        "computer_room": "r1",
                    }
                ],
                "read_queues": 4,
                "write_queues": 4,
                "permission": "read-only",
                "ordered": False,
            }
        ],
    }


# --- protobuf converters ----------------------------------------------------------------

names = st.text(alphabet="abcdefgh-", min_size=1, max_size=12)
queues = st.integers(0, 1024)


@given(names, queues, queues, st.sampled_from(Permission), st.booleans())
def test_a_topic_config_round_trips_through_the_wire(
    name: str, reads: int, writes: int, permission: Permission, ordered: bool
) -> None:
    config = TopicConfig(name, reads, writes, permission, ordered)

    message = config.to_proto()

    assert (message.topic, message.read_queues, message.write_queues) == (name, reads, writes)
    assert TopicConfig.from_proto(pb.TopicConfig.FromString(message.SerializeToString())) == config


broker_states = st.builds(
    BrokerState,
    cluster=st.sampled_from(["c1", "other"]),
    key=st.builds(BrokerKey, names, st.integers(0, 16)),
    role=st.sampled_from(Role),
    data_address=st.sampled_from(["127.0.0.1:1", "[::1]:2"]),
    http_address=st.sampled_from(["", "127.0.0.1:3"]),
    computer_room=st.sampled_from(["", "r1"]),
    epoch=st.integers(0, 9),
    permission=st.sampled_from(Permission),
    replication_mode=st.sampled_from([None, *ReplicationMode]),
    commitlog_max_offset=st.integers(0, 1 << 40),
    controlled=st.booleans(),
    configured_master=st.booleans(),
    in_sync_ids=st.sets(st.integers(0, 16), max_size=3).map(lambda ids: tuple(sorted(ids))),
    unverified=st.booleans(),
)


@given(broker_states)
def test_a_broker_state_round_trips_through_the_wire(state: BrokerState) -> None:
    message = pb.BrokerState.FromString(state.to_proto().SerializeToString())

    assert (message.broker_name, message.broker_id) == (state.broker_name, state.broker_id)
    assert BrokerState.from_proto(message) == state


def test_a_broker_that_does_not_say_has_no_mode_and_its_in_sync_ids_come_out_sorted() -> None:
    message = pb.BrokerState(
        cluster="c1", broker_name="b", broker_id=0, role=pb.BROKER_ROLE_MASTER,
        data_address="127.0.0.1:1", permission=pb.PERMISSION_READ_WRITE, in_sync_ids=[2, 0, 2],
    )  # fmt: skip

    state = BrokerState.from_proto(message)

    assert state.replication_mode is None
    assert state.to_proto().replication_mode == pb.REPLICATION_MODE_UNSPECIFIED
    assert state.in_sync_ids == (0, 2)
    with pytest.raises(ValueError, match="broker role"):
        BrokerState.from_proto(pb.BrokerState(broker_name="b", permission=1))


addresses = st.builds(
    BrokerAddress,
    broker_id=st.integers(0, 16),
    role=st.sampled_from(Role),
    data_address=st.sampled_from(["", "127.0.0.1:1", "[::1]:2"]),
    http_address=st.sampled_from(["", "127.0.0.1:3"]),
    computer_room=st.sampled_from(["", "r1"]),
)
group_routes = st.builds(
    GroupRoute,
    cluster=st.just("c1"),
    broker_name=names,
    epoch=st.integers(0, 9),
    computer_room=st.sampled_from(["", "r1"]),
    brokers=st.lists(addresses, max_size=3).map(tuple),
    read_queues=st.integers(0, 4),
    write_queues=st.integers(0, 4),
    permission=st.sampled_from(Permission),
    ordered=st.booleans(),
)


@given(st.lists(group_routes, max_size=4, unique_by=lambda g: g.broker_name))
def test_a_route_round_trips_through_the_wire_with_its_groups_sorted(
    groups: list[GroupRoute],
) -> None:
    route = TopicRoute("orders", tuple(groups))

    back = TopicRoute.from_proto(pb.TopicRoute.FromString(route.to_proto().SerializeToString()))

    assert back == TopicRoute("orders", tuple(sorted(groups, key=lambda g: g.broker_name)))


def test_unknown_values_in_a_route_grant_nothing() -> None:
    message = pb.TopicRoute(
        topic="t",
        groups=[
            pb.GroupRoute(
                broker_name="b",
                brokers=[pb.BrokerAddress(broker_id=0, role=7, data_address="127.0.0.1:1")],
                read_queues=2,
                write_queues=2,
                permission=42,  # type: ignore[arg-type]
            )
        ],
    )

    route = TopicRoute.from_proto(message)

    (group,) = route.groups
    assert group.permission is Permission.NONE
    assert group.brokers[0].role is Role.SLAVE
    assert route.write_queues == route.read_queues == ()


def master_slave_group(name: str, master: str, permission: Permission) -> GroupRoute:
    return GroupRoute(
        cluster="c1",
        broker_name=name,
        epoch=1,
        computer_room="r1",
        brokers=(
            BrokerAddress(0, Role.MASTER, master, "", "r1")
            if master
            else BrokerAddress(0, Role.SLAVE, "127.0.0.1:8", "", "r1"),
            BrokerAddress(1, Role.SLAVE, "127.0.0.1:9", "", "r1"),
        ),
        read_queues=2,
        write_queues=1,
        permission=permission,
        ordered=False,
    )


def test_writes_go_to_masters_and_reads_to_a_slave_only_without_one() -> None:
    route = TopicRoute(
        "t",
        (
            master_slave_group("a", "127.0.0.1:1", Permission.READ_WRITE),
            master_slave_group("b", "", Permission.READ_WRITE),
            master_slave_group("c", "127.0.0.1:3", Permission.WRITE_WIPE),
        ),
    )

    assert [(str(q), q.address) for q in route.write_queues] == [("a:0", "127.0.0.1:1")]
    assert [(str(q), q.address) for q in route.read_queues] == [
        ("a:0", "127.0.0.1:1"),
        ("a:1", "127.0.0.1:1"),
        ("b:0", "127.0.0.1:8"),
        ("b:1", "127.0.0.1:8"),
        ("c:0", "127.0.0.1:3"),
        ("c:1", "127.0.0.1:3"),
    ]
    assert route.masterless  # group b takes writes but has no master
    assert route.group("b") is route.groups[1] and route.group("z") is None


def _view(broker_id: int, role: Role, end: int, **kwargs: Any) -> BrokerView:
    state = BrokerState("c", BrokerKey("broker-a", broker_id), role, f"h:{broker_id}",
                        commitlog_max_offset=end)  # fmt: skip
    return BrokerView(state, 1.5, **kwargs)


def test_a_reader_of_a_group_takes_in_sync_and_lag_from_its_control_and_master() -> None:
    master, slave = _view(0, Role.MASTER, 1000, session_open=True), _view(1, Role.SLAVE, 400)
    gone = _view(2, Role.SLAVE, 100, down=True)
    message = pb.BrokerGroupInfo(
        broker_name="broker-a",
        epoch=3,
        brokers=[master.to_proto(), slave.to_proto()],
        departed=[gone.to_departed_proto()],
        control=pb.GroupControl(broker_name="broker-a", epoch=3, in_sync_ids=[1, 0]),
    )
    group = GroupView.from_proto(message)
    assert group.in_sync_ids == (0, 1)
    assert group.master == dataclasses.replace(master, in_sync=True)
    assert group.brokers[1] == dataclasses.replace(slave, in_sync=True, lag_bytes=600)
    assert group.down == (dataclasses.replace(gone, in_sync=False),)
    message.ClearField("control")
    assert {b.in_sync for b in GroupView.from_proto(message).brokers} == {None}


def test_the_cluster_list_json_is_flat_with_the_keys_the_deploy_roles_read() -> None:
    shown = _view(1, Role.SLAVE, 400, in_sync=True, lag_bytes=600).to_json()
    assert json.loads(json.dumps(shown)) == shown
    assert {k: shown[k] for k in ("broker_name", "broker_id", "role", "in_sync", "lag_bytes")} == {
        "broker_name": "broker-a", "broker_id": 1, "role": "slave", "in_sync": True,
        "lag_bytes": 600,
    }  # fmt: skip
    assert shown["last_heartbeat_age_ms"] == 1500
