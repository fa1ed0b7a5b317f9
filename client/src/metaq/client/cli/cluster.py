"""``metaq cluster list`` (the clusters, broker groups and brokers the nameserver knows)
and ``metaq cluster switchover`` (a planned change of a group's master)."""

from __future__ import annotations

import argparse
from typing import Any

from metaq.client.cli.support import (
    add_command,
    add_group,
    add_secret_option,
    admin,
    cluster_secret,
    print_json,
    table,
)


def register(subparsers: Any) -> None:
    group = add_group(subparsers, "cluster", help="inspect the cluster")
    parser = add_command(
        group,
        "list",
        list_cluster,
        help="list clusters, broker groups and brokers",
        description="List every cluster, broker group and broker a nameserver knows, "
        "with addresses, role, epoch, whether the controller counts it in sync (electable), "
        "how many commitlog bytes it is behind its master, and liveness. A broker that "
        "left the nameserver within the last hour (it died, was cut off or was stopped) "
        "is listed as down, as it last registered.",
    )
    parser.add_argument("--cluster", default="", help="only this cluster")
    parser = add_command(
        group,
        "switchover",
        switchover,
        help="move a broker group's master role to one of its in-sync slaves",
        description="A planned change of master with near-zero unavailability: the master "
        "stops taking writes, waits until the chosen slave holds its whole log, then the "
        "controller makes that slave master at the next epoch; the old master follows it. "
        "Nothing is lost, under sync or async replication. If the controller refuses, "
        "the old master takes writes again.",
    )
    parser.add_argument("--group", required=True, help="the broker group (broker name)")
    parser.add_argument("--to", type=int, required=True, help="the broker id to make master")
    parser.add_argument(
        "--catch-up-timeout", type=float, default=5.0,
        help="seconds the slave may take to catch up (default 5)",
    )  # fmt: skip
    add_secret_option(parser)


async def list_cluster(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        view = await client.cluster(args.cluster)
    brokers = view.brokers(down=True)
    if args.json:
        print_json(
            {
                "nameserver": view.nameserver,
                "broker_expiry_ms": view.broker_expiry_ms,
                "brokers": [b.to_json() for b in brokers],
            }
        )
        return 0
    if not brokers:
        print(f"no brokers registered (nameserver {view.nameserver})")
        return 0
    table(
        [
            "cluster", "group", "id", "role", "state", "data address", "http address",
            "room", "epoch", "in sync", "lag", "perm", "repl", "commitlog", "heartbeat",
            "topics",
        ],
        [
            [
                b.state.cluster, b.broker_name, b.broker_id, b.state.role,
                "down" if b.down else "up", b.state.data_address,
                b.state.http_address or "-", b.state.computer_room, b.state.epoch,
                "-" if b.in_sync is None else ("yes" if b.in_sync else "no"),
                None if b.down else b.lag_bytes,
                b.state.permission,
                b.state.replication_mode or "-", b.state.commitlog_max_offset,
                f"{'left ' if b.down else ''}{b.last_heartbeat_age_s:.1f}s ago",
                None if b.down else b.topic_count,
            ]
            for b in brokers
        ],
    )  # fmt: skip
    return 0


async def switchover(args: argparse.Namespace) -> int:
    async with admin(args, secret=cluster_secret(args)) as client:
        done = await client.switchover(
            args.group, args.to, catch_up_timeout_s=args.catch_up_timeout
        )
    if args.json:
        print_json({"group": args.group, "master_id": done.master_id,
                    "epoch": done.epoch, "elapsed_ms": round(done.elapsed_ms, 1)})  # fmt: skip
    else:
        print(
            f"{args.group}: broker {done.master_id} is master at epoch {done.epoch} "
            f"(log end {done.log_end} handed over in {done.elapsed_ms:.0f} ms)"
        )
    return 0
