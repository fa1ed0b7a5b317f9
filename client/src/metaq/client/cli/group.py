"""``metaq group list|describe|delete``: the consumer groups the masters know.

    metaq group list
    metaq group describe G
    metaq group delete G [--force] [--retry-topic] [--dlq-topic]

A group is known by its committed offsets and its live members. ``delete`` forgets its
offsets on every master (and, through the journal, on their slaves); it refuses a group
with live members unless ``--force`` (members that go on consuming commit their
positions again and bring the group back); ``--retry-topic`` and ``--dlq-topic`` delete
its ``%RETRY%G`` and ``%DLQ%G`` topics too.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import msgspec

from metaq.client.cli.support import add_command, add_group, admin, group_name, print_json, table


def register(subparsers: Any) -> None:
    group = add_group(subparsers, "group", help="list, describe and delete consumer groups")
    add_command(
        group,
        "list",
        list_groups,
        help="every consumer group with its topics, live members and lag",
        description="Every consumer group a master holds committed offsets or live "
        "members of, with the topics it consumes, its live members and its total lag.",
    )
    parser = add_command(
        group,
        "describe",
        describe,
        help="a group's members and committed offsets",
        description="A consumer group's live members (client id, host, room, mode, "
        "subscriptions) and its committed offset in every queue, with lag in messages and "
        "in time and the member that pulled the queue last.",
    )
    parser.add_argument("group", type=group_name, help="the consumer group")
    parser = add_command(
        group,
        "delete",
        delete,
        help="forget a group's offsets (and its retry and dead-letter topics)",
        description=__doc__,
    )
    parser.add_argument("group", type=group_name, help="the consumer group")
    parser.add_argument(
        "--force", action="store_true", help="delete even while the group has live members"
    )
    parser.add_argument(
        "--retry-topic", action="store_true", help="delete its retry topic %%RETRY%%GROUP too"
    )
    parser.add_argument(
        "--dlq-topic", action="store_true", help="delete its dead-letter topic %%DLQ%%GROUP too"
    )


async def list_groups(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        groups = await client.list_groups()
    if args.json:
        print_json([dataclasses.asdict(g) for g in groups])
        return 0
    if not groups:
        print("no consumer groups")
        return 0
    table(
        ["group", "members", "lag", "topics"],
        [[g.group, len(g.members), g.lag, ", ".join(g.topics)] for g in groups],
    )
    return 0


async def describe(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        found = await client.describe_group(args.group)
    if args.json:
        print_json(
            {
                "group": found.group,
                "lag": found.lag,
                "members": [msgspec.structs.asdict(m) for m in found.members],
                "offsets": [
                    {"broker": r.broker_name, **msgspec.structs.asdict(r.offset)}
                    for r in found.offsets
                ],
            }
        )
        return 0
    print(f"consumer group {found.group}: {len(found.members)} live member(s), lag {found.lag}")
    if found.members:
        table(
            ["client id", "host", "room", "mode", "subscriptions"],
            [
                [m.client_id, m.host or "-", m.computer_room or "-", m.mode,
                 ", ".join(f"{t} ({e or '*'})" for t, e in m.subscriptions)]
                for m in found.members
            ],
        )  # fmt: skip
    if found.offsets:
        print()
        table(
            ["broker", "topic", "queue", "committed", "max offset", "lag", "lag s", "owner"],
            [
                [r.broker_name, r.offset.topic, r.offset.queue_id, r.offset.offset,
                 r.offset.max_offset, r.offset.lag, round(r.offset.lag_ms / 1000, 1),
                 r.offset.owner]
                for r in found.offsets
            ],
        )  # fmt: skip
    return 0


async def delete(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        done = await client.delete_group(
            args.group,
            force=args.force,
            with_retry_topic=args.retry_topic,
            with_dlq_topic=args.dlq_topic,
        )
    if args.json:
        print_json(dataclasses.asdict(done))
        return 0
    where = ", ".join(f"{b}: {n}" for b, n in sorted(done.deleted_offsets.items())) or "none"
    print(f"deleted consumer group {done.group}: offsets forgotten ({where})")
    if done.live_members:
        print(f"forced past live members {', '.join(done.live_members)}")
    for topic, brokers in done.deleted_topics.items():
        print(f"topic {topic}: " + (f"deleted from {', '.join(brokers)}" if brokers else "none"))
    return 0
