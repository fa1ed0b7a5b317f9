"""``metaq read``: print a topic's stored messages for no consumer group.

    metaq read TOPIC [--broker B] [--queue Q] [--from OFFSET | --since TIME] [--count N]

Pulls straight from the brokers and commits nothing: no group is joined, none is left
behind to count in the lag alerts (RocketMQ's ``printMsg`` / ``printMsgByQueue``). The
queues are read one after another, each from ``--from`` (a queue offset: give
``--queue``), else from the first message stored at or after ``--since`` (ISO 8601,
no zone: local time; or ms since the epoch), else from its oldest kept message, up to
its end; the command stops after ``--count`` messages (default 20). ``--queue`` (with
``--broker`` when several broker groups serve the topic) reads that queue only. One
line per message, as ``metaq consume`` prints them; with ``--json`` one JSON object
per line.
"""

from __future__ import annotations

import argparse
from typing import Any

from metaq.client.admin import Admin
from metaq.client.cli.consume import format_message, message_json, parse_time_ms
from metaq.client.cli.support import CliError, add_command, admin, topic_name
from metaq.common.model import QueueRoute


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "read",
        run,
        help="print a topic's stored messages without a consumer group",
        description=__doc__,
    )
    parser.add_argument("topic", metavar="TOPIC", type=topic_name)
    parser.add_argument("--broker", metavar="B", help="the broker group of --queue")
    parser.add_argument("--queue", type=int, metavar="Q", help="read only this queue id")
    start = parser.add_mutually_exclusive_group()
    start.add_argument(
        "--from", dest="offset", type=int, metavar="OFFSET", help="the queue offset to start at"
    )
    start.add_argument(
        "--since",
        type=parse_time_ms,
        metavar="TIME",
        help="start at the first message stored at or after TIME",
    )
    parser.add_argument(
        "--count", type=int, default=20, metavar="N", help="print at most N messages (20)"
    )


async def run(args: argparse.Namespace) -> int:
    if args.count < 1:
        raise CliError("--count must be at least 1", code=2)
    if args.offset is not None and args.queue is None:
        raise CliError("--from names an offset in one queue: give --queue too", code=2)
    if args.broker is not None and args.queue is None:
        raise CliError("--broker picks the group of --queue: give --queue too", code=2)
    render = message_json if args.json else format_message
    async with admin(args) as client:
        queues = None if args.queue is None else [await _queue(client, args)]
        async for message in client.read_messages(
            args.topic, args.count, queues=queues, offset=args.offset, since_ms=args.since
        ):
            print(render(message))
    return 0


async def _queue(client: Admin, args: argparse.Namespace) -> QueueRoute:
    """The one queue ``--queue`` (and ``--broker``) name, else a usage error naming the
    queues there are."""
    queues = (await client.route(args.topic)).read_queues
    found = [q for q in queues if q.queue_id == args.queue and args.broker in (None, q.broker_name)]
    if len(found) == 1:
        return found[0]
    if found:
        groups = ", ".join(q.broker_name for q in found)
        raise CliError(
            f"queue {args.queue} of {args.topic!r} is served by several broker groups "
            f"({groups}): pick one with --broker",
            code=2,
        )
    listed = ", ".join(f"{q.broker_name}:{q.queue_id}" for q in queues)
    raise CliError(
        f"topic {args.topic!r} has no readable queue {args.queue}"
        + (f" in broker group {args.broker!r}" if args.broker else "")
        + f"; its queues: {listed}",
        code=2,
    )
