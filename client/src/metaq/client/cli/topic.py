"""``metaq topic create|update|delete|list|route|stats``.

Topics live on brokers: create, update and delete change each chosen broker group's
master, found through the nameserver's cluster info (``--brokers`` picks groups; default:
every master of the cluster). Routes and queue offsets come from the nameserver and the
data plane, as clients see them. All of it is :class:`metaq.client.admin.Admin`.
"""

from __future__ import annotations

import argparse
from typing import Any, Final

from metaq.client.admin import (
    MAX_QUEUES,
    MIN_QUEUES,
    TopicExists,
    TopicMissing,
    TopicPlacement,
    TopicSettings,
    TopicSettingsError,
)
from metaq.client.cli.support import (
    CliError,
    add_command,
    add_group,
    admin,
    print_json,
    split_names,
    table,
    topic_name,
)
from metaq.common.model import TOPIC_PERMISSIONS, GroupRoute

PERMISSIONS: Final = tuple(p.topic_text for p in TOPIC_PERMISSIONS)


def register(subparsers: Any) -> None:
    group = add_group(subparsers, "topic", help="create, change, remove and inspect topics")

    create = add_command(
        group,
        "create",
        create_topic,
        help="create a topic on broker masters",
        description="Create a topic on the master of each chosen broker group (default: "
        "every master of the cluster), then wait until the nameserver routes it.",
        epilog="example:\n  metaq topic create orders --queues 8 --brokers broker-a,broker-b",
    )
    _topic_settings(create, defaults=True)
    update = add_command(
        group,
        "update",
        update_topic,
        help="change queue counts, permission or ordering of a topic",
        description="Change a topic's settings on each chosen broker master; settings not "
        "given keep their current value. The topic must already exist there.",
        epilog="example:\n  metaq topic update orders --perm write-wipe --brokers broker-a",
    )
    _topic_settings(update, defaults=False)
    delete = add_command(
        group,
        "delete",
        delete_topic,
        help="delete a topic from broker masters",
        description="Delete a topic from each chosen broker master (default: every master). "
        "Stored messages stay until retention removes them.",
    )
    delete.add_argument("topic", type=topic_name, help="topic name")
    _brokers_option(delete)
    listing = add_command(group, "list", list_topics, help="list the topics of each broker master")
    _brokers_option(listing)
    route = add_command(
        group,
        "route",
        show_route,
        help="show where a topic's queues are",
        description="Show the route of a topic as the nameserver gives it to clients.",
    )
    route.add_argument("topic", type=topic_name, help="topic name")
    stats = add_command(
        group,
        "stats",
        topic_stats,
        help="show per-queue minimum and maximum offsets",
        description="Show each readable queue's [min, max) offsets, asked of its broker.",
    )
    stats.add_argument("topic", type=topic_name, help="topic name")


def _brokers_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-b",
        "--brokers",
        action="append",
        metavar="NAME[,NAME]",
        help="broker groups to act on; repeatable (default: every master of the cluster)",
    )
    parser.add_argument("--cluster", default="", help="only brokers of this cluster")


def _topic_settings(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    parser.add_argument(
        "topic", type=topic_name, help="topic name: letters, digits, '_', '-', '|', '%%'"
    )
    default = " (default: 8)" if defaults else ""
    parser.add_argument(
        "-q", "--queues", type=int, metavar="N", help=f"read and write queue count{default}"
    )
    parser.add_argument("--read-queues", type=int, metavar="N", help="read queue count")
    parser.add_argument("--write-queues", type=int, metavar="N", help="write queue count")
    parser.add_argument(
        "--perm",
        choices=PERMISSIONS,
        help="what clients may do" + (" (default: read-write)" if defaults else ""),
    )
    order = parser.add_mutually_exclusive_group()
    order.add_argument("--ordered", action="store_true", default=None, help="keys keep their order")
    order.add_argument("--unordered", dest="ordered", action="store_false", help="not ordered")
    _brokers_option(parser)
    parser.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="do not wait until the nameserver routes the change",
    )


async def _put(args: argparse.Namespace, *, create: bool) -> int:
    brokers = split_names(args.brokers)
    # --read-queues and --write-queues win over --queues; what is not given keeps its
    # value (update) or the default (create).
    changes: dict[str, Any] = {
        "read_queues": args.read_queues if args.read_queues is not None else args.queues,
        "write_queues": args.write_queues if args.write_queues is not None else args.queues,
        "perm": args.perm,
        "ordered": args.ordered,
    }
    async with admin(args) as client:
        try:
            if create:
                given = {key: value for key, value in changes.items() if value is not None}
                placed = await client.create_topic(
                    args.topic,
                    TopicSettings(**given),
                    brokers=brokers,
                    cluster=args.cluster,
                    wait=False,
                )
            else:
                placed = await client.update_topic(
                    args.topic, **changes, brokers=brokers, cluster=args.cluster, wait=False
                )
        except TopicExists as exc:
            raise CliError(f"{exc}; use 'metaq topic update' to change it") from None
        except TopicMissing as exc:
            raise CliError(f"{exc}; use 'metaq topic create'") from None
        except TopicSettingsError as exc:
            raise CliError(
                f"{exc.field.replace('_', '-')} must be between {MIN_QUEUES} and {MAX_QUEUES}",
                code=2,
            ) from None
        if args.wait:
            expected = {p.broker.broker_name: p.settings for p in placed}
            await client.wait_routed(args.topic, expected, args.timeout)
    _print_placed(args, placed, create=create)
    return 0


def _print_placed(args: argparse.Namespace, placed: list[TopicPlacement], *, create: bool) -> None:
    if args.json:
        print_json({p.broker.broker_name: p.settings.to_json() for p in placed})
        return
    table(
        ["group", "broker", "read queues", "write queues", "perm", "ordered"],
        [
            [
                p.broker.broker_name,
                p.broker.state.data_address,
                p.settings.read_queues,
                p.settings.write_queues,
                p.settings.perm,
                p.settings.ordered,
            ]
            for p in placed
        ],
    )
    print(f"topic {args.topic} {'created' if create else 'updated'} on {len(placed)} broker(s)")


async def create_topic(args: argparse.Namespace) -> int:
    return await _put(args, create=True)


async def update_topic(args: argparse.Namespace) -> int:
    return await _put(args, create=False)


async def delete_topic(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        deleted = await client.delete_topic(
            args.topic, brokers=split_names(args.brokers), cluster=args.cluster
        )
    if args.json:
        print_json({"deleted": deleted})
    else:
        print(f"topic {args.topic} deleted from {', '.join(deleted)}")
    return 0


async def list_topics(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        listed = await client.list_topics(brokers=split_names(args.brokers), cluster=args.cluster)
    rows: list[list[object]] = [
        [
            t.topic,
            t.group,
            t.settings.read_queues,
            t.settings.write_queues,
            t.settings.perm,
            t.settings.ordered,
        ]
        for t in listed
    ]
    if args.json:
        keys = ["topic", "group", "read_queues", "write_queues", "perm", "ordered"]
        print_json([dict(zip(keys, row, strict=True)) for row in rows])
    elif rows:
        table(["topic", "group", "read queues", "write queues", "perm", "ordered"], rows)
    else:
        print("no topics")
    return 0


async def show_route(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        route = await client.route(args.topic)
    if args.json:
        print_json(
            {
                "topic": route.topic,
                "groups": [_group_json(g) for g in route.groups],
                "write_queues": [str(q) for q in route.write_queues],
                "read_queues": [str(q) for q in route.read_queues],
            }
        )
        return 0
    table(
        ["group", "cluster", "epoch", "room", "master", "brokers", "read", "write", "perm",
         "ordered"],
        [
            [g.broker_name, g.cluster, g.epoch, g.computer_room, g.master_address or "-",
             ",".join(g.addresses), g.read_queues, g.write_queues, g.permission, g.ordered]
            for g in route.groups
        ],
    )  # fmt: skip
    print(f"{len(route.write_queues)} writable, {len(route.read_queues)} readable queues")
    return 0


def _group_json(group: GroupRoute) -> dict[str, Any]:
    return {
        "broker_name": group.broker_name,
        "cluster": group.cluster,
        "epoch": group.epoch,
        "computer_room": group.computer_room,
        "master_address": group.master_address,
        "addresses": group.addresses,
        "http_addresses": group.http_addresses,
        "read_queues": group.read_queues,
        "write_queues": group.write_queues,
        "permission": group.permission.to_proto(),
        "ordered": group.ordered,
    }


async def topic_stats(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        stats = await client.topic_stats(args.topic)
    rows = [
        [s.queue.broker_name, s.queue.queue_id, s.min_offset, s.max_offset, s.messages]
        for s in stats
    ]
    if args.json:
        keys = ["group", "queue_id", "min_offset", "max_offset", "messages"]
        print_json([dict(zip(keys, row, strict=True)) for row in rows])
        return 0
    table(["group", "queue", "min offset", "max offset", "messages"], rows)
    total = sum(s.messages for s in stats)
    print(f"{total} messages in {len(rows)} queues")
    return 0
