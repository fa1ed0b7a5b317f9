"""``metaq trace MSG_ID``: where a message went (RocketMQ's ``queryMsgTraceById``).

    metaq trace 0a0b0c...

The message as stored (topic, broker group, queue, offset, store time), then, oldest
first, every step producers and consumers with ``trace=True`` wrote for it: its send
(producer group, client id, host, latency), each delivery to a consumer group (client
id, host, attempt, outcome, handler time, and the retry topic a redelivery came
through) and each hop to a group's retry or dead-letter topic. See
:mod:`metaq.client.trace`.
"""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from metaq.client.admin import MessageTrace
from metaq.client.cli.support import CliError, add_command, admin, key_values, print_json, table
from metaq.client.trace import CONSUME, SEND, TraceEvent


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "trace",
        run,
        help="where a message went: sent, stored, delivered, retried",
        description=__doc__,
    )
    parser.add_argument("msg_id", metavar="MSG_ID", help="message id, 32 hex digits")


async def run(args: argparse.Namespace) -> int:
    try:
        raw = bytes.fromhex(args.msg_id)
    except ValueError:
        raw = b""
    if len(raw) != 16:
        raise CliError(f"a message id is 32 hex digits, not {args.msg_id!r}", code=2)
    async with admin(args) as client:
        trace = await client.message_trace(raw.hex())
    if args.json:
        print_json(trace.to_json())
        return 0
    _print(trace)
    return 0


def _time(ms: int) -> str:
    if not ms:
        return "-"
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds")


def _print(trace: MessageTrace) -> None:
    m = trace.message
    key_values(
        [
            ("msg id", trace.msg_id),
            ("topic", m.topic if m else "-"),
            ("stored", f"{m.broker_name} queue {m.queue_id} offset {m.queue_offset}" if m else "-"),
            ("store time", _time(m.store_timestamp_ms) if m else "-"),
        ]
    )
    for problem in trace.problems:
        print(f"note: {problem}")
    if not trace.events:
        print("no trace events: neither its producer nor its consumers had trace=True")
        return
    table(
        ["time", "step", "group", "client", "host", "attempt", "status", "ms", "where"],
        [_row(e) for e in trace.events],
    )


def _row(e: TraceEvent) -> list[object]:
    if e.kind == SEND:
        where = f"{e.broker} queue {e.queue_id} offset {e.queue_offset}"
    elif e.kind == CONSUME:
        where = f"{e.broker} queue {e.queue_id} offset {e.queue_offset}"
        if e.via != e.topic:
            where += f" via {e.via}"
    else:
        where = f"to {e.via}"
    return [
        _time(e.time_ms),
        e.kind,
        e.group,
        e.client_id,
        e.host,
        e.attempt or "-",
        e.status or "-",
        f"{e.cost_ms:.1f}" if e.kind in (SEND, CONSUME) else "-",
        where,
    ]
