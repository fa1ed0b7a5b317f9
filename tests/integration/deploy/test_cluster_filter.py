"""The roles' ``metaq_cluster_problems`` filter: what the playbooks check before a rolling
operation and wait on after each restart, one sentence per member that keeps a group
from being whole and in sync, from a real ``metaq cluster list --json`` answer."""

from __future__ import annotations

import importlib.util
import json
from types import ModuleType
from typing import Any

import pytest
from lab import PLAYBOOKS

from metaq.common.model import BrokerKey, BrokerState, BrokerView, Permission, ReplicationMode, Role

MEMBERS = [{"host": "a0", "group": "broker-a", "id": 0},
           {"host": "a1", "group": "broker-a", "id": 1},
           {"host": "b0", "group": "broker-b", "id": 0},
           {"host": "b1", "group": "broker-b", "id": 1}]  # fmt: skip


@pytest.fixture(scope="module")
def filters() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "metaq_cluster_filter", PLAYBOOKS / "filter_plugins" / "metaq_cluster.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def listed(*brokers: tuple[str, int, Role, bool | None, int]) -> list[dict[str, Any]]:
    """Brokers as ``metaq cluster list --json`` prints them (the CLI's own conversion)."""
    infos = [
        BrokerView(BrokerState(cluster="c", key=BrokerKey(group, broker_id), role=role,
                               data_address="h:1", http_address="h:2", computer_room="r",
                               epoch=1, permission=Permission.READ_WRITE,
                               replication_mode=ReplicationMode.SYNC),
                   last_heartbeat_age_s=0.005, session_open=True, in_sync=in_sync,
                   lag_bytes=lag)
        for group, broker_id, role, in_sync, lag in brokers
    ]  # fmt: skip
    answer: list[dict[str, Any]] = json.loads(json.dumps([b.to_json() for b in infos]))
    return answer


def down_master(group: str, broker_id: int, *, left_s: float, in_sync: bool) -> dict[str, Any]:
    """A master that went down, as ``metaq cluster list --json`` still lists it."""
    view = BrokerView(
        BrokerState(cluster="c", key=BrokerKey(group, broker_id), role=Role.MASTER,
                    data_address="h:1", http_address="h:2", computer_room="r", epoch=1,
                    permission=Permission.READ_WRITE, replication_mode=ReplicationMode.SYNC),
        last_heartbeat_age_s=left_s, in_sync=in_sync, down=True,
    )  # fmt: skip
    answer: dict[str, Any] = json.loads(json.dumps(view.to_json()))
    return answer


WHOLE = [("broker-a", 0, Role.MASTER, True, 0), ("broker-a", 1, Role.SLAVE, True, 0),
         ("broker-b", 0, Role.SLAVE, True, 0), ("broker-b", 1, Role.MASTER, True, 0)]  # fmt: skip


def test_a_whole_cluster_has_no_problem_whichever_member_is_master(filters: ModuleType) -> None:
    assert filters.metaq_cluster_problems(listed(*WHOLE), MEMBERS) == []


def test_a_missing_slave_is_named_by_id_group_and_host(filters: ModuleType) -> None:
    brokers = listed(*[b for b in WHOLE if b[:2] != ("broker-a", 1)])
    assert filters.metaq_cluster_problems(brokers, MEMBERS) == [
        "broker 1 of broker-a (a1) is missing: the nameservers do not list it"
    ]


def test_a_lagging_slave_and_a_group_without_master_are_each_said(filters: ModuleType) -> None:
    brokers = listed(("broker-a", 0, Role.MASTER, True, 0),
                     ("broker-a", 1, Role.SLAVE, False, 123456),
                     ("broker-b", 0, Role.SLAVE, True, 0),
                     ("broker-b", 1, Role.SLAVE, None, 0))  # fmt: skip
    assert filters.metaq_cluster_problems(brokers, MEMBERS) == [
        "broker 1 of broker-a (a1) is not in sync (123,456 bytes behind its master)",
        "broker 1 of broker-b (b1) is not in sync (the failover controller does not manage "
        "its group)",
        "broker-b has no master",
    ]


def test_registered_is_enough_when_sync_is_not_asked(filters: ModuleType) -> None:
    brokers = listed(("broker-a", 0, Role.SLAVE, False, 10))
    assert filters.metaq_cluster_problems(brokers, MEMBERS[:1], False) == []
    assert filters.metaq_cluster_problems([], MEMBERS[:1], False) == [
        "broker 0 of broker-a (a0) is missing: the nameservers do not list it"
    ]


def test_a_dead_master_listed_as_down_is_neither_a_master_nor_a_member_in_sync(
    filters: ModuleType,
) -> None:
    """a1 was broker-a's master and died; a0 was promoted. The list still names a1 with
    the role it last registered, so a role lookup that did not leave it out would order
    a1 among the masters of a rolling restart and a0 first, with no slave to hand over to."""
    brokers = listed(("broker-a", 0, Role.MASTER, True, 0), *WHOLE[2:])
    brokers.append(down_master("broker-a", 1, left_s=42.0, in_sync=False))

    up = filters.metaq_up(brokers)
    assert [(b["broker_name"], b["broker_id"], b["role"]) for b in up if b["role"] == "master"] == [
        ("broker-a", 0, "master"),
        ("broker-b", 1, "master"),
    ]
    assert ("broker-a", 1) not in {(b["broker_name"], b["broker_id"]) for b in up}
    assert filters.metaq_cluster_problems(brokers, MEMBERS) == [
        "broker 1 of broker-a (a1) is down: it left the nameservers 42 s ago"
    ]
    assert filters.metaq_cluster_problems(brokers, MEMBERS[1:2], False) == [
        "broker 1 of broker-a (a1) is down: it left the nameservers 42 s ago"
    ]


def test_a_group_whose_only_master_is_down_has_no_master(filters: ModuleType) -> None:
    brokers = [*listed(*WHOLE[:3]), down_master("broker-b", 1, left_s=3.0, in_sync=True)]
    assert filters.metaq_cluster_problems(brokers, MEMBERS) == [
        "broker 1 of broker-b (b1) is down: it left the nameservers 3 s ago",
        "broker-b has no master",
    ]
