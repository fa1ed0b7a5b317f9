"""Filters over ``metaq cluster list --json`` (the CLI's Admin view of the nameservers).

``metaq_cluster_problems``: what keeps broker groups from being whole and in sync, one
sentence per problem, given the members the inventory expects. The playbooks wait on it
after each restart and check it before a rolling operation touches anything
(docs/deploy.md); an empty list is a cluster they may go on with.

``metaq_up``: the brokers that are up. The list also names a broker that went down
within the last hour, with the role it last registered: a master that died is listed as
a master beside the slave promoted after it, so every lookup of a broker's role now goes
through this filter first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def metaq_up(brokers: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [b for b in brokers if not b.get("down")]


def metaq_cluster_problems(
    brokers: Sequence[Mapping[str, Any]],
    members: Sequence[Mapping[str, Any]],
    in_sync: bool = True,
) -> list[str]:
    """``brokers``: the ``brokers`` of ``metaq cluster list --json``. ``members``: the
    brokers expected, each ``{"host": ..., "group": ..., "id": ...}``. Each must be
    registered; with ``in_sync`` also counted in sync by the failover controller, and
    each of their groups must have a master."""
    listed = {(str(b["broker_name"]), int(b["broker_id"])): b for b in brokers}
    problems = []
    for member in members:
        group, broker_id = str(member["group"]), int(member["id"])
        who = f"broker {broker_id} of {group} ({member['host']})"
        found = listed.get((group, broker_id))
        if found is None:
            problems.append(f"{who} is missing: the nameservers do not list it")
        elif found.get("down"):
            age = int(found.get("last_heartbeat_age_ms") or 0) / 1000
            problems.append(f"{who} is down: it left the nameservers {age:.0f} s ago")
        elif in_sync and found.get("in_sync") is not True:
            why = (
                "the failover controller does not manage its group"
                if found.get("in_sync") is None
                else f"{int(found.get('lag_bytes') or 0):,} bytes behind its master"
            )
            problems.append(f"{who} is not in sync ({why})")
    if in_sync:
        masters = {group for (group, _), b in listed.items()
                   if b.get("role") == "master" and not b.get("down")}  # fmt: skip
        for group in dict.fromkeys(str(m["group"]) for m in members):
            if group not in masters:
                problems.append(f"{group} has no master")
    return problems


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {"metaq_cluster_problems": metaq_cluster_problems, "metaq_up": metaq_up}
