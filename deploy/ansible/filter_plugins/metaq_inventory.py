"""``metaq_inventory_problems``: the inventory mistakes that would otherwise deploy
silently, one sentence each, checked by preflight.yml before a run touches a host.

- a ``metaq_*`` variable no role or playbook reads (a misspelling), with the name it
  most likely meant;
- a broker without its group, role or room, a role other than master or slave, two
  brokers with the same (group, id), a group with no master or two;
- a missing ``nameservers`` or ``brokers`` group, with the name it most likely meant.

The variables the roles read are their defaults (``roles/*/defaults/main.yml``) and
:data:`SET_ELSEWHERE`, so a new default is known without a change here.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

ROLES: Final = Path(__file__).resolve().parent.parent / "roles"
REQUIRED_GROUPS: Final = ("nameservers", "brokers")
ROLE_NAMES: Final = ("master", "slave")
BROKER_KEYS: Final = ("metaq_broker_group", "metaq_broker_role", "metaq_room")
# A top-level key of a defaults file (each is one flat map).
_DEFAULT: Final = re.compile(r"^(metaq_\w+):", re.MULTILINE)

SET_ELSEWHERE: Final = frozenset({
    # From a vault (docs/deploy.md).
    "metaq_cluster_secret", "metaq_admin_secret_key",
    # The playbooks' switches (-e).
    "metaq_exclude_hosts", "metaq_connect_wait_s", "metaq_allow_degraded",
    "metaq_allow_downgrade", "metaq_restart_nameservers", "metaq_restart_pending_only",
    "metaq_stop_serial",
    # Set by the plays for the roles' task files.
    "metaq_before_restart", "metaq_switch_current", "metaq_wait_group",
})  # fmt: skip


def known_variables(roles: Path = ROLES) -> frozenset[str]:
    """Every variable the roles and playbooks read from an inventory."""
    names = set(SET_ELSEWHERE)
    for defaults in roles.glob("*/defaults/main.yml"):
        names.update(_DEFAULT.findall(defaults.read_text()))
    return frozenset(names)


def metaq_inventory_problems(
    hostvars: Mapping[str, Mapping[str, Any]],
    groups: Mapping[str, Iterable[str]],
    known: Iterable[str] | None = None,
) -> list[str]:
    """``hostvars`` and ``groups`` as a play sees them, before any play set a fact;
    ``known``: the variable names read (by default :func:`known_variables`)."""
    known_names = frozenset(known) if known is not None else known_variables()
    problems = []
    for name in REQUIRED_GROUPS:
        if not list(groups.get(name, ())):
            have = sorted(g for g in groups if g not in ("all", "ungrouped"))
            guess = difflib.get_close_matches(name, have, n=1)
            hint = f": did you mean {guess[0]}?" if guess else ""
            problems.append(
                f"the inventory has no hosts in group {name} (its groups: "
                f"{', '.join(have) or 'none'}){hint}"
            )
    unknown: dict[str, list[str]] = {}
    for host in groups.get("all", ()):
        for key in hostvars[host]:
            if key.startswith("metaq_") and key not in known_names:
                unknown.setdefault(key, []).append(host)
    for key, hosts in sorted(unknown.items()):
        guess = difflib.get_close_matches(key, sorted(known_names), n=1)
        hint = f": did you mean {guess[0]}?" if guess else ""
        problems.append(f"{key} (on {_hosts(hosts)}) is no variable the playbooks read{hint}")
    problems += _broker_problems(hostvars, list(groups.get("brokers", ())))
    return problems


def _broker_problems(hostvars: Mapping[str, Mapping[str, Any]], brokers: list[str]) -> list[str]:
    problems = []
    members: dict[tuple[str, int], list[str]] = {}
    masters: dict[str, list[str]] = {}
    for host in brokers:
        found = hostvars[host]
        missing = [key for key in BROKER_KEYS if key not in found]
        if missing:
            problems.append(f"broker {host} does not set {' or '.join(missing)}")
            continue
        role = str(found["metaq_broker_role"])
        if role not in ROLE_NAMES:
            guess = difflib.get_close_matches(role, ROLE_NAMES, n=1)
            hint = f" (did you mean {guess[0]}?)" if guess else ""
            problems.append(
                f"broker {host} has metaq_broker_role {role!r}{hint}: it must be master or slave"
            )
            continue
        group = str(found["metaq_broker_group"])
        try:
            broker_id = int(found.get("metaq_broker_id", 0 if role == "master" else 1))
        except (TypeError, ValueError):
            problems.append(f"broker {host} has metaq_broker_id {found['metaq_broker_id']!r}, "
                            "not a number")  # fmt: skip
            continue
        members.setdefault((group, broker_id), []).append(host)
        if role == "master":
            masters.setdefault(group, []).append(host)
    for (group, broker_id), hosts in sorted(members.items()):
        if len(hosts) > 1:
            problems.append(f"{_hosts(hosts)} are all broker {broker_id} of {group}: "
                            "each (group, id) must be one host")  # fmt: skip
    for group in sorted({group for group, _ in members}):
        found_masters = masters.get(group, [])
        if len(found_masters) != 1:
            problems.append(
                f"{group} has {len(found_masters) or 'no'} master"
                + (f"s ({_hosts(found_masters)})" if found_masters else "")
                + ": each group is deployed with one (metaq_broker_role: master, id 0)"
            )
    return problems


def _hosts(hosts: list[str]) -> str:
    return ", ".join(hosts)


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {"metaq_inventory_problems": metaq_inventory_problems}
