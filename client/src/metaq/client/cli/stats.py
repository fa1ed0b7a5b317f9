"""``metaq stats``: messages in and out per topic and per consumer group (RocketMQ's
``mqadmin statsAll``).

    metaq stats [--topic T] [--group G]

Per topic: messages sent in and pulled out per second over the last minute, and in all
since the brokers started. Per consumer group and topic: messages pulled and
acknowledged (the advance of its committed offsets), the same way. Summed over every
live broker; a broker that did not answer is named on stderr. Rates cover less than a
minute when a broker started since (the window is printed).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from metaq.client.cli.support import add_command, admin, group_name, print_json, table, topic_name


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "stats",
        run,
        help="messages in and out per second, per topic and consumer group",
        description=__doc__,
    )
    parser.add_argument("-t", "--topic", type=topic_name, help="only this topic")
    parser.add_argument("-g", "--group", type=group_name, help="only this consumer group")


async def run(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        stats = await client.stats()
    topics = [t for t in stats.topics if not args.topic or t.topic == args.topic]
    groups = [
        g
        for g in stats.groups
        if (not args.topic or g.topic == args.topic) and (not args.group or g.group == args.group)
    ]
    if args.group:
        topics = [t for t in topics if any(g.topic == t.topic for g in groups)]
    for problem in stats.unreachable:
        print(f"metaq: left out, no answer: {problem}", file=sys.stderr)
    if args.json:
        shown = stats.to_json()
        shown["topics"] = [t for t in shown["topics"] if t["topic"] in {x.topic for x in topics}]
        shown["groups"] = [
            g for g in shown["groups"] if (g["group"], g["topic"]) in {(x.group, x.topic)
                                                                       for x in groups}
        ]  # fmt: skip
        print_json(shown)
        return 0
    print(f"rates over the last {stats.window_s:.0f} s")
    table(
        ["topic", "in/s", "out/s", "in total", "out total"],
        [[t.topic, t.in_tps, t.out_tps, t.in_total, t.out_total] for t in topics],
    )
    print()
    table(
        ["group", "topic", "pulled/s", "acked/s", "pulled total", "acked total"],
        [
            [g.group, g.topic, g.pulled_tps, g.acked_tps, g.pulled_total, g.acked_total]
            for g in groups
        ],
    )
    return 0
