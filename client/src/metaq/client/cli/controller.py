"""``metaq controller status``: the failover controller the nameservers run over Raft.

    metaq controller status

The Raft leader, the members (each with whether the answering nameserver is connected
to it), the term and whether a majority is seen; then, per broker group the controller
manages, its master, epoch and in-sync set (the brokers a failover may promote).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from metaq.client.cli.support import add_command, add_group, admin, key_values, print_json, table


def register(subparsers: Any) -> None:
    group = add_group(subparsers, "controller", help="the nameservers' failover controller")
    add_command(
        group,
        "status",
        status,
        help="Raft leader and members, and each group's master, epoch and in-sync set",
        description=__doc__,
    )


async def status(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        found = await client.controller_status()
    if args.json:
        print_json(dataclasses.asdict(found))
        return 0
    key_values(
        [
            ("nameserver", found.nameserver),
            ("raft leader", found.leader or "none (no majority?)"),
            ("this nameserver", "leader" if found.is_leader else "follower"),
            ("term", found.term),
            ("quorum", found.has_quorum),
            ("members", ", ".join(
                f"{a} ({'connected' if c else 'not connected'})" for a, c in found.members
            ) or "unknown (an older nameserver)"),
        ]
    )  # fmt: skip
    print()
    if not found.groups:
        print("no broker group is managed by the controller")
        return 0
    table(
        ["group", "master", "epoch", "in sync", "master address"],
        [
            [g.broker_name, g.master_id, g.epoch, ", ".join(map(str, g.in_sync_ids)),
             g.master_data_address or None]
            for g in found.groups
        ],
    )  # fmt: skip
    return 0
