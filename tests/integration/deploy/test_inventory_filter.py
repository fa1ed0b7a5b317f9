"""The roles' ``metaq_inventory_problems`` filter (preflight.yml's first check): each
inventory mistake that used to deploy silently is named, with the likely intended name,
and a good inventory (the example one's shape) has none."""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

import pytest
from lab import PLAYBOOKS


@pytest.fixture(scope="module")
def filters() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "metaq_inventory_filter", PLAYBOOKS / "filter_plugins" / "metaq_inventory.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def broker(group: str, role: str, room: str, **more: object) -> dict[str, object]:
    return {"metaq_broker_group": group, "metaq_broker_role": role, "metaq_room": room, **more}


def cluster(**changes: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    hostvars: dict[str, dict[str, Any]] = {
        "ns1": {"ansible_host": "10.0.0.1", "metaq_nameserver_settings": {}},
        "a0": broker("broker-a", "master", "room1"),
        "a1": broker("broker-a", "slave", "room2", metaq_broker_id=1),
        "b0": broker("broker-b", "master", "room2", metaq_data_dir="/data1"),
        "b1": broker("broker-b", "slave", "room1", metaq_broker_id=1),
    }
    for host, variables in changes.items():
        hostvars[host] = variables
    brokers = [h for h in hostvars if h != "ns1"]
    groups = {"all": list(hostvars), "ungrouped": [], "nameservers": ["ns1"], "brokers": brokers}
    return hostvars, groups


def test_a_good_inventory_has_no_problem(filters: ModuleType) -> None:
    assert filters.metaq_inventory_problems(*cluster()) == []


def test_a_misspelt_variable_is_named_with_the_one_meant(filters: ModuleType) -> None:
    hostvars, groups = cluster()
    del hostvars["a1"]["metaq_broker_group"]
    hostvars["a1"]["metaq_broker_grup"] = "broker-b"
    hostvars["ns1"]["metaq_nameserver_setings"] = {}

    assert filters.metaq_inventory_problems(hostvars, groups) == [
        "metaq_broker_grup (on a1) is no variable the playbooks read: did you mean "
        "metaq_broker_group?",
        "metaq_nameserver_setings (on ns1) is no variable the playbooks read: did you mean "
        "metaq_nameserver_settings?",
        "broker a1 does not set metaq_broker_group",
    ]


def test_every_default_of_the_roles_is_known(filters: ModuleType) -> None:
    known = filters.known_variables()
    assert {"metaq_tune_os", "metaq_broker_store_settings", "metaq_nofile", "metaq_tls"} <= known
    assert {"metaq_exclude_hosts", "metaq_allow_degraded", "metaq_cluster_secret"} <= known


def test_a_role_outside_the_allowed_set_is_refused(filters: ModuleType) -> None:
    problems = filters.metaq_inventory_problems(
        *cluster(a1=broker("broker-a", "slvae", "room2", metaq_broker_id=1))
    )
    assert problems == [
        "broker a1 has metaq_broker_role 'slvae' (did you mean slave?): it must be master or slave"
    ]


def test_clashing_ids_and_masters_are_refused(filters: ModuleType) -> None:
    problems = filters.metaq_inventory_problems(
        *cluster(
            b1=broker("broker-a", "slave", "room1", metaq_broker_id=1),
            b0=broker("broker-b", "slave", "room2", metaq_broker_id=2),
            a1=broker("broker-a", "master", "room2", metaq_broker_id=0),
        )
    )
    assert problems == [
        "a0, a1 are all broker 0 of broker-a: each (group, id) must be one host",
        "broker-a has 2 masters (a0, a1): each group is deployed with one "
        "(metaq_broker_role: master, id 0)",
        "broker-b has no master: each group is deployed with one (metaq_broker_role: master, id 0)",
    ]


def test_a_broker_without_its_room_is_refused(filters: ModuleType) -> None:
    hostvars, groups = cluster()
    del hostvars["b1"]["metaq_room"]
    assert filters.metaq_inventory_problems(hostvars, groups) == [
        "broker b1 does not set metaq_room"
    ]


def test_a_missing_group_is_named_with_the_one_meant(filters: ModuleType) -> None:
    hostvars, groups = cluster()
    groups["nameserver"] = groups.pop("nameservers")
    assert filters.metaq_inventory_problems(hostvars, groups) == [
        "the inventory has no hosts in group nameservers (its groups: brokers, nameserver): "
        "did you mean nameserver?"
    ]
