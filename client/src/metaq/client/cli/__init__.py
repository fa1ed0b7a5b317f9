"""The ``metaq`` command line: cluster and topic administration, sending, lookups.

Each module of this package is one command group and has ``register(subparsers)``, which
adds its commands; :data:`COMMAND_MODULES` lists them, so a new group is one line there.
Every command takes ``--nameserver`` (repeatable; default ``$METAQ_NAMESERVERS`` or
127.0.0.1:9876), ``--timeout`` and ``--json``, before its name or after it. Exit codes: 0
success, 1 the operation failed (one line on stderr says why), 2 bad usage, 141 the
reader of the output went away (``metaq topic list | head``), quietly, as other Unix
tools do on SIGPIPE.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Final

from metaq.client.cli.support import CliError, common_options
from metaq.common.errors import MetaqError
from metaq.common.users import CREDENTIALS_FILE_ENV
from metaq.common.version import installed_version

COMMAND_MODULES: Final = (
    "cluster",
    "controller",
    "broker",
    "topic",
    "send",
    "query",
    "trace",
    "consume",
    "read",
    "progress",
    "stats",
    "group",
    "connections",
    "reset_offsets",
    "dlq",
    "acl",
)
"""Modules of ``metaq.client.cli`` whose ``register(subparsers)`` adds commands, in help
order."""
SIGPIPE_EXIT: Final = 128 + 13
"""The exit code of a process SIGPIPE ended, which a shell reports for ``yes | head``."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="metaq",
        description="Administer a metaq cluster, send messages and look them up.",
        epilog="Run 'metaq COMMAND --help' for the options of a command.",
        parents=[common_options(defaults=True)],
    )
    parser.add_argument(
        "--version", action="version", version=f"metaq {installed_version('metaq-client')}"
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log more (repeat for debug)"
    )
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        module.register(subparsers)
    parser.set_defaults(handler=None, group_parser=parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code. Output into a pipe whose reader is gone (``|
    head``) ends the command quietly with :data:`SIGPIPE_EXIT`, whichever command wrote
    it (the way the Python documentation's "Note on SIGPIPE" recommends)."""
    try:
        try:
            return _run(argv)
        finally:
            # Within the try, --help's and --version's exits too: output buffered for
            # a pipe meets the closed pipe here, not in the flush at exit.
            sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that flush
        # does not fail a second time with "Exception ignored ...".
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return SIGPIPE_EXIT


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
    except CliError as exc:  # an argument's type refused it (a name, say)
        print(f"metaq: error: {exc}", file=sys.stderr)
        return exc.code
    late = getattr(args, "late_positional", None)
    if late and len(extra) == 1 and not extra[0].startswith("-") and getattr(args, late) is None:
        setattr(args, late, extra.pop())
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.handler is None:
        args.group_parser.print_help(sys.stderr)
        return 2
    if getattr(args, "credentials_file", ""):
        # Commands that build clients from nameservers alone find it there too.
        os.environ[CREDENTIALS_FILE_ENV] = args.credentials_file
    try:
        code: int = asyncio.run(args.handler(args))
    except CliError as exc:
        print(f"metaq: error: {exc}", file=sys.stderr)
        return exc.code
    except MetaqError as exc:
        print(f"metaq: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code
