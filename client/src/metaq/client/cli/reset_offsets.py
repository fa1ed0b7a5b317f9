"""``metaq reset-offsets``: move a consumer group to a point in time on every queue.

    metaq reset-offsets --group G --topic T --to-time ISO8601|EPOCH_MS

On every readable queue of the topic, finds the first message stored at or after the
time (the queue's end when every message is older) and commits that offset for the
group. Running members of the group keep committing their own positions and would undo
the reset: stop them first; when they start again they begin at the new offsets.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from metaq.client.cli.consume import parse_time_ms
from metaq.client.cli.support import (
    add_command,
    group_name,
    nameservers,
    print_json,
    table,
    tls_settings,
    topic_name,
)
from metaq.client.pull_consumer import PullConsumer
from metaq.client.routes import QueueRoute
from metaq.common.tls import TlsConfig


@dataclass(frozen=True, slots=True)
class QueueReset:
    queue: QueueRoute
    before: int | None
    """The group's committed offset before the reset; None when it had none."""
    after: int


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


async def reset_offsets(
    nameservers: Sequence[str],
    group: str,
    topic: str,
    timestamp_ms: int,
    *,
    timeout_s: float = 5.0,
    tls: TlsConfig | None = None,
) -> list[QueueReset]:
    """Commit, on every queue of ``topic``, the first offset stored at or after the time."""
    async with PullConsumer(nameservers, group, request_timeout_s=timeout_s, tls=tls) as consumer:
        queues = await consumer.queues(topic)

        async def one(queue: QueueRoute) -> QueueReset:
            found = await consumer.query(topic, queue, timestamp_ms=timestamp_ms)
            assert found.timestamp_offset is not None, "the broker ignored timestamp_ms"
            await consumer.commit(topic, queue, found.timestamp_offset)
            return QueueReset(queue, found.committed, found.timestamp_offset)

        return list(await asyncio.gather(*(one(q) for q in queues)))


async def run(args: argparse.Namespace) -> int:
    rows = await reset_offsets(
        nameservers(args),
        args.group,
        args.topic,
        args.to_time,
        timeout_s=args.timeout,
        tls=tls_settings(args),
    )
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
