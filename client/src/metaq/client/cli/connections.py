"""``metaq connections``: the clients connected to the cluster's brokers.

    metaq connections [--group G] [--topic T]

Consumers (RocketMQ's consumerConnection): group, client id, host, computer room,
client version and language, mode, subscriptions, and the brokers it heartbeats.
Producers (producerConnection): producer group, client id, host, room, version and
language, and the brokers it is connected to. ``--group`` keeps the consumers of that
consumer group and the producers of that producer group; ``--topic`` the consumers
subscribed to the topic. A client too old to say its version shows ``-``; a producer too
old to introduce itself is not listed.
"""

from __future__ import annotations

import argparse
from typing import Any

from metaq.client.cli.support import (
    add_command,
    admin,
    group_name,
    print_json,
    table,
    topic_name,
)


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "connections",
        run,
        help="consumers and producers connected to the brokers",
        description=__doc__,
    )
    parser.add_argument("-g", "--group", type=group_name, help="only this group")
    parser.add_argument("-t", "--topic", type=topic_name, help="only consumers of this topic")


async def run(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        found = await client.connections(group=args.group or "", topic=args.topic or "")
    if args.json:
        print_json(
            {
                "consumers": [
                    {"group": g, "client_id": m.client_id, "host": m.host,
                     "computer_room": m.computer_room, "client_version": m.client_version,
                     "language": m.language, "mode": m.mode,
                     "subscriptions": [list(s) for s in m.subscriptions], "brokers": b}
                    for g, m, b in found.consumers
                ],
                "producers": [
                    {"group": p.group, "client_id": p.client_id, "host": p.host,
                     "computer_room": p.computer_room, "client_version": p.client_version,
                     "language": p.language, "brokers": b}
                    for p, b in found.producers
                ],
            }
        )  # fmt: skip
        return 0
    print("consumers:" if found.consumers else "consumers: none")
    if found.consumers:
        table(
            ["group", "client id", "host", "room", "version", "language", "mode",
             "subscriptions", "brokers"],
            [
                [g, m.client_id, m.host, m.computer_room, m.client_version or None,
                 m.language or None, m.mode,
                 ", ".join(f"{t} ({e or '*'})" for t, e in m.subscriptions), ", ".join(b)]
                for g, m, b in found.consumers
            ],
        )  # fmt: skip
    print("producers:" if found.producers else "producers: none")
    if found.producers:
        table(
            ["group", "client id", "host", "room", "version", "language", "brokers"],
            [
                [p.group, p.client_id, p.host, p.computer_room or None,
                 p.client_version or None, p.language or None, ", ".join(b)]
                for p, b in found.producers
            ],
        )  # fmt: skip
    return 0
