"""``metaq progress``: how far a consumer group got in each queue of a topic.

    metaq progress --group G --topic T

Per readable queue: the broker group, the queue id, the group's committed offset (the
next it will consume; ``-`` when it never committed there), the queue's max offset and
the lag between them; then the total. A queue the group never committed in counts all
the messages it holds. A group that committed on no queue of the topic is refused (a
misspelt name, or a group that never consumed it), naming the groups that did.
"""

from __future__ import annotations

import argparse
from typing import Any

from metaq.client.cli.support import (
    CliError,
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
        "progress",
        run,
        help="a consumer group's committed offsets and lag per queue",
        description=__doc__,
    )
    parser.add_argument("-g", "--group", required=True, type=group_name, help="the consumer group")
    parser.add_argument("-t", "--topic", required=True, type=topic_name, help="the topic")


async def run(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        rows = await client.progress(args.group, args.topic)
        if all(r.offsets.committed is None for r in rows):
            known = ", ".join(await client.topic_groups(args.topic)) or "none"
            raise CliError(
                f"consumer group {args.group!r} has committed no offset on topic "
                f"{args.topic!r}: check the name (groups with offsets on it: {known})"
            )
    total = sum(row.lag for row in rows)
    if args.json:
        print_json(
            {
                "group": args.group,
                "topic": args.topic,
                "queues": [
                    {
                        "broker": r.queue.broker_name,
                        "queue": r.queue.queue_id,
                        "committed": r.offsets.committed,
                        "min_offset": r.offsets.min_offset,
                        "max_offset": r.offsets.max_offset,
                        "lag": r.lag,
                    }
                    for r in rows
                ],
                "total_lag": total,
            }
        )
        return 0
    table(
        ["broker", "queue", "committed", "max offset", "lag"],
        [
            [
                r.queue.broker_name,
                r.queue.queue_id,
                r.offsets.committed,
                r.offsets.max_offset,
                r.lag,
            ]
            for r in rows
        ],
    )
    print(f"total lag: {total}")
    return 0
