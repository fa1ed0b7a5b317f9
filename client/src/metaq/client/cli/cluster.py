"""``metaq cluster list``: the clusters, broker groups and brokers the nameserver knows."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from metaq.client.cli.support import add_command, add_group, print_json, route_cache, table


def register(subparsers: Any) -> None:
    group = add_group(subparsers, "cluster", help="inspect the cluster")
    parser = add_command(
        group,
        "list",
        list_cluster,
        help="list clusters, broker groups and brokers",
        description="List every cluster, broker group and broker a nameserver knows, "
        "with addresses, role, epoch and liveness.",
    )
    parser.add_argument("--cluster", default="", help="only this cluster")


async def list_cluster(args: argparse.Namespace) -> int:
    async with route_cache(args) as routes:
        view = await routes.cluster(args.cluster)
    brokers = view.brokers()
    if args.json:
        print_json(
            {
                "nameserver": view.nameserver,
                "broker_expiry_ms": view.broker_expiry_ms,
                "brokers": [dataclasses.asdict(b) for b in brokers],
            }
        )
        return 0
    if not brokers:
        print(f"no brokers registered (nameserver {view.nameserver})")
        return 0
    table(
        [
            "cluster", "group", "id", "role", "data address", "http address", "room",
            "epoch", "perm", "repl", "commitlog", "heartbeat", "topics",
        ],
        [
            [
                b.cluster, b.broker_name, b.broker_id, b.role, b.data_address,
                b.http_address or "-", b.computer_room, b.epoch, b.permission,
                b.replication_mode, b.commitlog_max_offset,
                f"{b.last_heartbeat_age_ms / 1000:.1f}s ago", b.topic_count,
            ]
            for b in brokers
        ],
    )  # fmt: skip
    return 0
