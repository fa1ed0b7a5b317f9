"""``metaq_cluster_problems``: what keeps broker groups from being whole and in sync, one
sentence per problem, from ``metaq cluster list --json`` (the CLI's Admin view of the
nameservers) and the members the inventory expects.

The playbooks wait on it after each restart and check it before a rolling operation
touches anything (docs/deploy.md); an empty list is a cluster they may go on with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


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
        elif in_sync and found.get("in_sync") is not True:
            why = (
                "the failover controller does not manage its group"
                if found.get("in_sync") is None
                else f"{int(found.get('lag_bytes') or 0):,} bytes behind its master"
            )
            problems.append(f"{who} is not in sync ({why})")
    if in_sync:
        masters = {group for (group, _), b in listed.items() if b.get("role") == "master"}
        for group in dict.fromkeys(str(m["group"]) for m in members):
            if group not in masters:
                problems.append(f"{group} has no master")
    return problems


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {"metaq_cluster_problems": metaq_cluster_problems}
