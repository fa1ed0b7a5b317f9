"""``metaq query id``, ``metaq query key`` and ``metaq query offset``: find stored
messages through the brokers' message-id and key indexes
(:meth:`metaq.client.admin.Admin.message_by_id`,
:meth:`~metaq.client.admin.Admin.messages_by_key`) or by queue offset
(:meth:`~metaq.client.admin.Admin.message_at`)."""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from metaq.client.cli.support import (
    CliError,
    add_command,
    add_group,
    admin,
    key_values,
    print_json,
    table,
    topic_name,
)

_PREVIEW = 40


def register(subparsers: Any) -> None:
    group = add_group(
        subparsers, "query", help="look stored messages up by id, key or queue offset"
    )
    by_id = add_command(
        group,
        "id",
        query_id,
        help="find a message by its id",
        description="Find a message by the id a send printed (32 hex digits), asking "
        "every broker of the cluster, and print it with its body.",
    )
    by_id.add_argument("msg_id", metavar="MSG_ID", help="message id, 32 hex digits")
    by_key = add_command(
        group,
        "key",
        query_key,
        help="find a topic's messages by key",
        description="Find the messages of a topic that carry a key (newest first), asking "
        "every broker group that serves the topic.",
    )
    by_key.add_argument("topic", type=topic_name, help="topic name")
    by_key.add_argument("key", help="message key")
    by_key.add_argument(
        "--limit", type=int, default=32, help="at most this many per broker (default: 32)"
    )
    by_offset = add_command(
        group,
        "offset",
        query_offset,
        help="the message at a queue offset",
        description="Print the message stored at OFFSET of queue QUEUE of a topic "
        "(RocketMQ's queryMsgByOffset). Queue ids are per broker group: name the group "
        "with --broker when more than one serves the topic with that queue id.",
    )
    by_offset.add_argument("topic", type=topic_name, help="topic name")
    by_offset.add_argument("queue", type=_natural, metavar="QUEUE", help="queue id")
    by_offset.add_argument("offset", type=_natural, metavar="OFFSET", help="queue offset")
    by_offset.add_argument("-b", "--broker", default="", help="the broker group of the queue")


def _natural(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise CliError(f"expected a whole number of at least 0, not {value!r}", code=2)
    return number


def _time(ms: int) -> str:
    if not ms:
        return "-"
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds")


async def query_id(args: argparse.Namespace) -> int:
    try:
        raw = bytes.fromhex(args.msg_id)
    except ValueError:
        raw = b""
    if len(raw) != 16:
        raise CliError(f"a message id is 32 hex digits, not {args.msg_id!r}", code=2)
    async with admin(args) as client:
        found = await client.message_by_id(raw.hex())
    _print_message(args, found.to_json())
    return 0


async def query_offset(args: argparse.Namespace) -> int:
    async with admin(args) as client:
        found = await client.message_at(
            args.topic, args.queue, args.offset, broker_name=args.broker
        )
    _print_message(args, found.to_json())
    return 0


def _print_message(args: argparse.Namespace, message: dict[str, Any]) -> None:
    if args.json:
        print_json(message)
        return
    properties = message.get("properties") or {}
    key_values(
        [
            ("msg id", message["msg_id"]),
            ("topic", message["topic"]),
            ("broker group", message.get("broker_name", "-")),
            ("queue", message["queue_id"]),
            ("queue offset", message["queue_offset"]),
            ("commitlog offset", message["commitlog_offset"]),
            ("born", _time(message["born_timestamp_ms"])),
            ("stored", _time(message["store_timestamp_ms"])),
            ("tags", message["tags"] or "-"),
            ("keys", " ".join(message["keys"]) or "-"),
            ("properties", ", ".join(f"{k}={v}" for k, v in properties.items()) or "-"),
            ("size", f"{message['size']} B" + (" (compressed)" if message["compressed"] else "")),
            ("body", f"({message['body_encoding']})"),
        ]
    )
    print(message["body"])


async def query_key(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= 1000:
        raise CliError("--limit must be between 1 and 1000", code=2)
    async with admin(args) as client:
        messages = await client.messages_by_key(args.topic, args.key, limit=args.limit)
    found = [m.to_json() for m in messages]
    if args.json:
        print_json(found)
        return 0
    if not found:
        raise CliError(f"no message of topic {args.topic} has key {args.key!r}")
    table(
        ["msg id", "group", "queue", "offset", "stored", "tags", "body"],
        [
            [
                m["msg_id"],
                m.get("broker_name", "-"),
                m["queue_id"],
                m["queue_offset"],
                _time(m["store_timestamp_ms"]),
                m["tags"] or "-",
                _preview(m),
            ]
            for m in found
        ],
    )
    return 0


def _preview(message: dict[str, Any]) -> str:
    if message["body_encoding"] != "text":
        return f"<{message['size']} B binary>"
    text = " ".join(str(message["body"]).split())
    return text if len(text) <= _PREVIEW else text[: _PREVIEW - 1] + "…"
