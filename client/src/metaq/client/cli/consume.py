"""``metaq consume``: tail a topic as a member of a consumer group, one line per message.

    metaq consume TOPIC --group G [--from first|last|TIME] [--tags "a || b"]
                        [--count N] [--timeout S] [--json]

The command is a push consumer in clustering mode: it joins group ``G``, takes its share
of the topic's queues (all of them when it is the only member) and commits what it
printed, so running it again goes on where it stopped. ``--from`` places a group that
has no committed offset yet (``first`` by default; TIME is ISO 8601 or ms since the
epoch). It stops after ``--count`` messages or ``--timeout`` seconds, whichever comes
first (neither: until Ctrl-C); messages pulled beyond the count are not committed.
Here ``--timeout`` is how long to tail, not the per-answer timeout of other commands.
With ``--json`` each message is one JSON object per line.

The group's offsets stay on the brokers (and count in its lag) after the command ends:
to look at messages without a group, use ``metaq read``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from metaq.client.cli.support import (
    CliError,
    common_options,
    group_name,
    nameservers,
    tls_settings,
    topic_name,
)
from metaq.client.consume_options import FIRST, LAST, TIMESTAMP, ConsumeFrom
from metaq.client.message import Message
from metaq.client.push_consumer import PushConsumer
from metaq.common.tls import TlsConfig


def register(subparsers: Any) -> None:
    # As support.add_command, but this command's --timeout (how long to tail) replaces
    # the common per-answer one.
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "consume",
        help="tail a topic as a member of a consumer group",
        description=__doc__,
        parents=[common_options()],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        conflict_handler="resolve",
    )
    parser.set_defaults(handler=run)
    parser.add_argument("topic", metavar="TOPIC", type=topic_name)
    parser.add_argument(
        "-g", "--group", required=True, type=group_name, help="the consumer group to join"
    )
    parser.add_argument(
        "--from",
        dest="start",
        type=parse_start,
        default=FIRST,
        metavar="first|last|TIME",
        help="where a group with no committed offset starts: first (default), last, or "
        "ISO 8601 / ms since the epoch",
    )
    parser.add_argument("--tags", help='only messages with these tags, like "a || b"')
    parser.add_argument("--count", type=int, metavar="N", help="stop after N messages")
    parser.add_argument(
        "--timeout", type=float, metavar="S", help="stop after S seconds (default: never)"
    )


async def run(args: argparse.Namespace) -> int:
    if args.count is not None and args.count < 1:
        raise CliError("--count must be at least 1", code=2)
    await consume(
        nameservers(args),
        args.topic,
        args.group,
        start=args.start,
        tags=args.tags,
        count=args.count,
        timeout_s=args.timeout,
        render=message_json if args.json else format_message,
        tls=tls_settings(args),
    )
    return 0


def parse_time_ms(text: str) -> int:
    """ms since the epoch from digits (already ms) or ISO 8601 (no zone: local time)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither ms since the epoch nor an ISO 8601 time "
            "(like 2024-05-01T12:00:00+00:00)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()
    return round(moment.timestamp() * 1000)


def parse_start(text: str) -> ConsumeFrom:
    if text == "first":
        return FIRST
    if text == "last":
        return LAST
    return TIMESTAMP(parse_time_ms(text))


def message_json(message: Message) -> str:
    """One JSON object: the message's fields, the body as text (invalid UTF-8 escaped)."""
    return json.dumps(
        {
            "msg_id": message.msg_id,
            "topic": message.topic,
            "queue_id": message.queue_id,
            "queue_offset": message.queue_offset,
            "store_host": message.store_host,
            "store_timestamp_ms": message.store_timestamp_ms,
            "born_timestamp_ms": message.born_timestamp_ms,
            "tags": message.tags,
            "keys": list(message.keys),
            "properties": dict(message.properties),
            "body": message.body.decode(errors="backslashreplace"),
        }
    )


def format_message(message: Message) -> str:
    """One line: store time, queue and offset, id, tags, keys, then the body escaped."""
    stamp = datetime.datetime.fromtimestamp(message.store_timestamp_ms / 1000, datetime.UTC)
    body = (
        message.body.decode(errors="backslashreplace")
        .replace("\\", "\\\\")
        .replace("\n", "\\n")
        .replace("\r", "\\r")
    )
    keys = ",".join(message.keys) or "-"
    return (
        f"{stamp.isoformat(timespec='milliseconds').replace('+00:00', 'Z')} "
        f"{message.store_host} q{message.queue_id}@{message.queue_offset} "
        f"id={message.msg_id} tags={message.tags or '-'} keys={keys} {body}"
    )


async def consume(
    nameservers: Sequence[str],
    topic: str,
    group: str,
    *,
    start: ConsumeFrom = FIRST,
    tags: str | None = None,
    count: int | None = None,
    timeout_s: float | None = None,
    out: TextIO | None = None,
    render: Callable[[Message], str] = format_message,
    tls: TlsConfig | None = None,
) -> int:
    """Print messages until ``count`` were printed or ``timeout_s`` passed; how many.

    One handler runs at a time, and the one that prints the count-th message stops the
    delivery: no message past the count is handed out, so none is committed. Output
    into a pipe whose reader has gone (``| head``) stops the delivery too, leaving the
    message that could not be printed uncommitted, and raises BrokenPipeError after the
    consumer closed.
    """
    printed = 0
    broken: BrokenPipeError | None = None
    enough = asyncio.Event()

    async def show(message: Message) -> None:
        nonlocal printed, broken
        try:
            print(render(message), file=out or sys.stdout, flush=True)
        except BrokenPipeError as exc:
            broken = exc
            consumer.stop_delivery()  # before raising: the failure is not sent back
            enough.set()
            raise
        printed += 1
        if count is not None and printed >= count:
            consumer.stop_delivery()
            enough.set()

    consumer = PushConsumer(nameservers, group, tls=tls, consume_from=start, concurrency=1)
    consumer.subscribe(topic, show, tags=tags)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, enough.set)
    await consumer.start()
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await enough.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        await consumer.close()
    if broken is not None:
        raise broken
    return printed
