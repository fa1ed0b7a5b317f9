"""``metaq reset-offsets``: move a consumer group to a point in time on every queue.

    metaq reset-offsets --group G --topic T --to-time ISO8601|EPOCH_MS [--dry-run]

On every readable queue of the topic, finds the first message stored at or after the
time (the queue's end when every message is older) and commits that offset for the
group, through each broker group's master. Running members of the group are told: each
drops what it has in flight at its next pull (at once when it waits at a queue's end)
and goes on from the new offsets, and their commits from before the reset are refused,
so the reset sticks. The last line says which members were consuming the topic, or
that none was (the group then starts from the new offsets when it next runs).
``--dry-run`` shows the offsets a reset would commit and changes nothing.
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
    parser.add_argument(
        "--dry-run", action="store_true", help="show the new offsets, change nothing"
    )


async def run(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        done = await client.reset_offsets(
            args.group, args.topic, args.to_time, dry_run=args.dry_run
        )
    if args.json:
        print_json(
            {
                "group": args.group,
                "topic": args.topic,
                "timestamp_ms": args.to_time,
                "dry_run": args.dry_run,
                "queues": [
                    {
                        "broker": r.queue.broker_name,
                        "queue": r.queue.queue_id,
                        "before": r.before,
                        "after": r.after,
                    }
                    for r in done.queues
                ],
                "live_members": done.live_members,
                "unreplicated": done.unreplicated,
            }
        )
        return 0
    table(
        ["broker", "queue", "before", "after"],
        [[r.queue.broker_name, r.queue.queue_id, r.before, r.after] for r in done.queues],
    )
    print(outcome(done.live_members, dry_run=args.dry_run))
    for name in done.unreplicated:
        print(
            f"warning: {name}: committed on the master, but no slave confirmed it within "
            "the replication timeout: a failover now could lose it"
        )
    return 0


def outcome(live_members: list[str], *, dry_run: bool) -> str:
    """What a reset did about the group's running members, in one line."""
    if dry_run:
        return "dry run: nothing was committed"
    if not live_members:
        return "no member of the group is consuming the topic: it starts from these offsets"
    return (
        f"{len(live_members)} live member(s) told; each drops what it has in flight and "
        f"goes on from these offsets: {', '.join(live_members)}"
    )
