"""``metaq send``: send messages from the command line and print where they went."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Final

from metaq.client.cli.support import (
    CliError,
    add_command,
    credentials,
    nameservers,
    print_json,
    table,
    tls_settings,
    topic_name,
)
from metaq.client.producer import Producer
from metaq.client.results import SendResult

_SHOW_EACH_UP_TO: Final = 20


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "send",
        send_messages,
        help="send messages to a topic",
        description="Send a message (or --count copies) and print each send result: "
        "status, message id, broker group, queue and offset. The body is the BODY "
        "argument, the contents of --file, or standard input when neither is given.",
        epilog="examples:\n"
        "  metaq send orders 'hello' --tags new --keys order-17\n"
        "  metaq send orders --file payload.bin --count 100\n"
        "  echo hi | metaq send orders",
    )
    parser.add_argument("topic", type=topic_name, help="topic to send to")
    parser.add_argument("body", nargs="?", help="message body as text")
    # argparse takes optional positionals only right after the ones before them; let the
    # body come after options too ("metaq send T --tags a BODY").
    parser.set_defaults(late_positional="body")
    parser.add_argument("-f", "--file", type=Path, help="read the body from this file")
    parser.add_argument("-t", "--tags", default="", help="the message's tags")
    parser.add_argument(
        "-k",
        "--keys",
        action="append",
        default=[],
        metavar="KEY[,KEY]",
        help="message keys (for 'metaq query key'); repeatable",
    )
    parser.add_argument(
        "-p",
        "--property",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a user property; repeatable",
    )
    parser.add_argument(
        "-c", "--count", type=int, default=1, metavar="N", help="send N copies (default: 1)"
    )
    parser.add_argument(
        "--sharding-key", help="send every copy to the queue this key hashes to (in order)"
    )
    parser.add_argument(
        "--group", default="DEFAULT_PRODUCER", help="producer group (default: DEFAULT_PRODUCER)"
    )


def _body(args: argparse.Namespace) -> bytes:
    if args.body is not None and args.file is not None:
        raise CliError("give the body either as an argument or with --file, not both", code=2)
    if args.file is not None:
        try:
            data: bytes = args.file.read_bytes()
        except OSError as exc:
            raise CliError(f"cannot read {args.file}: {exc.strerror}") from None
        return data
    if args.body is not None:
        text: str = args.body
        return text.encode()
    if sys.stdin.isatty():
        raise CliError("no body: give BODY, --file, or pipe it on standard input", code=2)
    return sys.stdin.buffer.read()


def _properties(values: list[str]) -> dict[str, str]:
    out = {}
    for value in values:
        name, sep, text = value.partition("=")
        if not sep or not name:
            raise CliError(f"property {value!r} is not NAME=VALUE", code=2)
        out[name] = text
    return out


async def send_messages(args: argparse.Namespace) -> int:
    if args.count < 1:
        raise CliError("--count must be at least 1", code=2)
    body = _body(args)
    keys = tuple(k for value in args.keys for k in value.split(",") if k)
    properties = _properties(args.property)
    producer = Producer(
        nameservers(args),
        group=args.group,
        send_timeout_s=args.timeout,
        credentials=credentials(args),
        tls=tls_settings(args),
    )
    async with producer:
        futures = [
            producer.send_async(
                args.topic,
                body,
                tags=args.tags,
                keys=keys,
                properties=properties or None,
                sharding_key=args.sharding_key,
            )
            for _ in range(args.count)
        ]
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
    results = [o for o in outcomes if isinstance(o, SendResult)]
    failures = [o for o in outcomes if not isinstance(o, SendResult)]
    if args.json:
        print_json(
            {
                "results": [r._asdict() | {"status": r.status.value} for r in results],
                "failed": [str(f) for f in failures],
            }
        )
    elif len(results) <= _SHOW_EACH_UP_TO:
        if results:
            table(
                ["status", "msg id", "group", "queue", "offset"],
                [[r.status.value, r.msg_id, r.broker, r.queue_id, r.queue_offset] for r in results],
            )
    else:
        per_queue = Counter((r.broker, r.queue_id) for r in results)
        table(
            ["group", "queue", "messages"],
            [[b, q, n] for (b, q), n in sorted(per_queue.items())],
        )
        statuses = Counter(r.status.value for r in results)
        print("statuses: " + ", ".join(f"{s} {n}" for s, n in sorted(statuses.items())))
    if failures:
        if args.count == 1:
            raise CliError(str(failures[0]))
        first = failures[0]
        raise CliError(f"{len(failures)} of {args.count} sends failed; first error: {first}")
    return 0
