"""``metaq reset-offsets``: move a consumer group to a point in time on every queue.

    metaq reset-offsets --group G --topic T --to-time ISO8601|EPOCH_MS

On every readable queue of the topic, finds the first message stored at or after the
time (the queue's end when every message is older) and commits that offset for the
group. Running members of the group keep committing their own positions and would undo
the reset: stop them first; when they start again they begin at the new offsets.
"""

from __future__ import annotations

import argparse
from typing import Any

from metaq.client.cli.consume import parse_time_ms
from metaq.client.cli.support import add_command, admin, group_name, print_json, table, topic_name


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "reset-offsets",
        run,
        help="commit a consumer group's offsets as of a point in time",
        description=__doc__,
    )
    parser.add_argument("-g", "--group", required=True, type=group_name, help="the consumer group")
    parser.add_argument("-t", "--topic", required=True, type=topic_name, help="the topic")
    parser.add_argument(
        "--to-time",
        required=True,
        type=parse_time_ms,
        metavar="TIME",
        help="ISO 8601 (no zone: local time) or ms since the epoch",
    )


async def run(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        rows = await client.reset_offsets(args.group, args.topic, args.to_time)
    if args.json:
        print_json(
            {
                "group": args.group,
                "topic": args.topic,
                "timestamp_ms": args.to_time,
                "queues": [
                    {
                        "broker": r.queue.broker_name,
                        "queue": r.queue.queue_id,
                        "before": r.before,
                        "after": r.after,
                    }
                    for r in rows
                ],
            }
        )
        return 0
    table(
        ["broker", "queue", "before", "after"],
        [[r.queue.broker_name, r.queue.queue_id, r.before, r.after] for r in rows],
    )
    return 0
