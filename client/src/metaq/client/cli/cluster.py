"""``metaq cluster list`` (the clusters, broker groups and brokers the nameserver knows)
and ``metaq cluster switchover`` (a planned change of a group's master)."""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

from metaq.client.cli.support import (
    CliError,
    add_command,
    add_group,
    add_secret_option,
    cluster_secret,
    http_json,
    http_scheme,
    http_session,
    print_json,
    route_cache,
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
        "how many commitlog bytes it is behind its master, and liveness.",
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
            "epoch", "in sync", "lag", "perm", "repl", "commitlog", "heartbeat", "topics",
        ],
        [
            [
                b.cluster, b.broker_name, b.broker_id, b.role, b.data_address,
                b.http_address or "-", b.computer_room, b.epoch,
                "-" if b.in_sync is None else ("yes" if b.in_sync else "no"), b.lag_bytes,
                b.permission,
                b.replication_mode, b.commitlog_max_offset,
                f"{b.last_heartbeat_age_ms / 1000:.1f}s ago", b.topic_count,
            ]
            for b in brokers
        ],
    )  # fmt: skip
    return 0


async def switchover(args: argparse.Namespace) -> int:
    secret = cluster_secret(args)
    async with route_cache(args) as routes:
        view = await routes.cluster()
        group = next(
            (g for c in view.clusters for g in c.groups if g.broker_name == args.group), None
        )
        if group is None:
            raise CliError(f"no broker group {args.group!r} is registered")
        if group.in_sync_ids is None:
            raise CliError(f"group {args.group!r} is not managed by the failover controller")
        master = group.master
        if master is None:
            raise CliError(f"group {args.group!r} has no master to hand over from right now")
        if master.broker_id == args.to:
            raise CliError(f"broker {args.to} already is the master of {args.group!r}")
        if args.to not in group.in_sync_ids:
            raise CliError(
                f"broker {args.to} is not in the in-sync set {list(group.in_sync_ids)} of "
                f"{args.group!r}; wait until it has caught up"
            )
        started = time.monotonic()
        base = f"{http_scheme(args)}://{master.http_address}/replication"
        async with http_session(args) as session:
            timeout_ms = round(args.catch_up_timeout * 1000)
            body = {"to": args.to, "timeout_ms": timeout_ms, "fence_ms": timeout_ms + 10_000}
            status, reply = await http_json(session, "POST", f"{base}/handover", body)
            if status != 200:
                raise CliError(f"master {master.broker_id} refused the handover: {reply}")
            try:
                control = await routes.switchover(args.group, args.to, group.epoch, secret=secret)
            except Exception:
                await http_json(session, "POST", f"{base}/resume")
                raise
    elapsed_ms = (time.monotonic() - started) * 1000
    if args.json:
        print_json({"group": args.group, "master_id": control.master_id,
                    "epoch": control.epoch, "elapsed_ms": round(elapsed_ms, 1)})  # fmt: skip
    else:
        print(
            f"{args.group}: broker {control.master_id} is master at epoch {control.epoch} "
            f"(log end {reply['end']} handed over in {elapsed_ms:.0f} ms)"
        )
    return 0
