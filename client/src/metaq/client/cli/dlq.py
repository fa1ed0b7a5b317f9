"""``metaq dlq list|show|resend``: a consumer group's dead letters.

    metaq dlq list --group G [--json]
    metaq dlq show --group G --msg-id ID [--json]
    metaq dlq resend --group G (--msg-id ID ... | --all)

A message lands in ``%DLQ%<group>`` after the group's handler failed on it
``max_reconsume_times`` times (see ``metaq.client.retry``). ``list`` shows each one: its
message id, the topic it was first sent to, how often it was tried, the last failure
and the start of its body; ``show`` one of them whole (properties, keys, tags, body).
``resend`` sends the chosen ones to their original topic again as new messages (same
body, tags, keys and user properties), for every group subscribed to it; the dead
letters themselves stay until retention removes them.
"""

from __future__ import annotations

import argparse
from typing import Any

from metaq.client.cli.support import (
    CliError,
    add_command,
    add_group,
    admin,
    group_name,
    print_json,
    table,
)
from metaq.client.message import Message
from metaq.client.retry import PROP_FAILURE, PROP_ORIGIN_MSG_ID, PROP_RETRY_TOPIC


def register(subparsers: Any) -> None:
    group = add_group(subparsers, "dlq", help="a consumer group's dead letters")
    parser = add_command(
        group, "list", list_dead, help="list a group's dead letters", description=__doc__
    )
    parser.add_argument("-g", "--group", required=True, type=group_name, help="the consumer group")
    parser = add_command(
        group, "show", show_dead, help="show one dead letter whole", description=__doc__
    )
    parser.add_argument("-g", "--group", required=True, type=group_name, help="the consumer group")
    parser.add_argument("--msg-id", required=True, help="its id, as dlq list shows it")
    parser = add_command(
        group,
        "resend",
        resend,
        help="send dead letters to their original topic again",
        description=__doc__,
    )
    parser.add_argument("-g", "--group", required=True, type=group_name, help="the consumer group")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--msg-id", action="append", default=[], help="repeatable")
    which.add_argument("--all", action="store_true", help="every dead letter of the group")


async def dead_letters(args: argparse.Namespace) -> list[Message]:
    async with admin(args) as client:
        return await client.dead_letters(args.group)


async def list_dead(args: argparse.Namespace) -> int:
    letters = await dead_letters(args)
    rows: list[dict[str, Any]] = [
        {
            "msg_id": m.properties.get(PROP_ORIGIN_MSG_ID, m.msg_id),
            "topic": m.properties.get(PROP_RETRY_TOPIC, "?"),
            "tries": m.reconsume_times,
            "stored": m.store_timestamp_ms,
            "failure": m.properties.get(PROP_FAILURE, ""),
            "body": m.body[:60].decode(errors="replace"),
        }
        for m in letters
    ]
    if args.json:
        print_json(rows)
    elif not rows:
        print(f"no dead letters for group {args.group}")
    else:
        table(["msg id", "topic", "tries", "last failure", "body"],
              [[r["msg_id"], r["topic"], r["tries"], r["failure"][:60], r["body"]]
               for r in rows])  # fmt: skip
    return 0


def _id(message: Message) -> str:
    return message.properties.get(PROP_ORIGIN_MSG_ID, message.msg_id)


async def show_dead(args: argparse.Namespace) -> int:
    found = [m for m in await dead_letters(args) if _id(m) == args.msg_id]
    if not found:
        raise CliError(f"no dead letter of group {args.group!r} has id {args.msg_id}")
    message = found[-1]
    fields = {
        "msg_id": _id(message),
        "dlq_msg_id": message.msg_id,
        "topic": message.properties.get(PROP_RETRY_TOPIC, "?"),
        "tries": message.reconsume_times,
        "tags": message.tags,
        "keys": list(message.keys),
        "properties": dict(message.properties),
        "born_timestamp_ms": message.born_timestamp_ms,
        "stored_timestamp_ms": message.store_timestamp_ms,
        "body": message.body.decode(errors="replace"),
    }
    if args.json:
        print_json(fields)
    else:
        for name, value in fields.items():
            print(f"{name:>20}: {value}")
    return 0


async def resend(args: argparse.Namespace) -> int:
    letters = await dead_letters(args)
    wanted = set(args.msg_id)
    chosen = [
        m for m in letters
        if args.all or m.properties.get(PROP_ORIGIN_MSG_ID, m.msg_id) in wanted
    ]  # fmt: skip
    missing = wanted - {m.properties.get(PROP_ORIGIN_MSG_ID, m.msg_id) for m in chosen}
    if missing:
        raise CliError(f"no dead letter of group {args.group!r} has id {sorted(missing)}")
    async with admin(args) as client:
        for message in chosen:
            sent = await client.resend_dead_letter(message)
            print(f"resent {message.properties.get(PROP_ORIGIN_MSG_ID, message.msg_id)} to "
                  f"{message.properties[PROP_RETRY_TOPIC]} as {sent.msg_id}")  # fmt: skip
    return 0
