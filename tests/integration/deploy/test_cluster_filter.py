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
