"""``metaq progress``: how far a consumer group got in each queue of a topic.

    metaq progress --group G --topic T

Per readable queue: the broker group, the queue id, the group's committed offset (the
next it will consume; ``-`` when it never committed there), the queue's max offset and
the lag between them; then the total. A queue the group never committed in counts all
the messages it holds.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from metaq.client.cli.support import (
    add_command,
    group_name,
    nameservers,
    print_json,
    table,
    tls_settings,
    topic_name,
)
from metaq.client.pull_consumer import PullConsumer, QueueOffsets
from metaq.client.routes import QueueRoute
from metaq.common.tls import TlsConfig


@dataclass(frozen=True, slots=True)
class QueueProgress:
    queue: QueueRoute
    offsets: QueueOffsets

    @property
    def lag(self) -> int:
        lag = self.offsets.lag
        return lag if lag is not None else self.offsets.max_offset - self.offsets.min_offset


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


async def group_progress(
    nameservers: Sequence[str],
    group: str,
    topic: str,
    *,
    timeout_s: float = 5.0,
    tls: TlsConfig | None = None,
) -> list[QueueProgress]:
    """Every readable queue of ``topic`` with the group's position in it."""
    async with PullConsumer(nameservers, group, request_timeout_s=timeout_s, tls=tls) as consumer:
        queues = await consumer.queues(topic)
        answers = await asyncio.gather(*(consumer.query(topic, q) for q in queues))
    return [QueueProgress(q, a) for q, a in zip(queues, answers, strict=True)]


async def run(args: argparse.Namespace) -> int:
    rows = await group_progress(
        nameservers(args), args.group, args.topic, timeout_s=args.timeout, tls=tls_settings(args)
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
