"""What every ``metaq`` subcommand shares: common options, the admin client, tables, errors."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import textwrap
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TextIO

from metaq.client.admin import Admin
from metaq.common.auth import ENV_VAR, ClusterSecret, SecretError, load_secret
from metaq.common.errors import InvalidMessage
from metaq.common.names import check_group
from metaq.common.record import check_topic
from metaq.common.tls import TlsConfig, TlsError
from metaq.common.users import Credentials, CredentialsError, load_credentials

DEFAULT_NAMESERVER: Final = "127.0.0.1:9876"
NAMESERVERS_ENV: Final = "METAQ_NAMESERVERS"

Handler = Callable[[argparse.Namespace], Awaitable[int]]
"""A subcommand: does its work, prints, returns the exit code."""
SubParsers = "argparse._SubParsersAction[argparse.ArgumentParser]"


class CliError(Exception):
    """A failure to report as one line on stderr, with exit code ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def common_options(*, defaults: bool = False) -> argparse.ArgumentParser:
    """Options every command takes, before its name (``metaq -n HOST:PORT topic list``)
    or after it: nameservers, timeout, JSON, credentials, TLS.

    Only the top-level parser has the ``defaults``: argparse copies every value a
    subcommand's parser holds over the ones parsed before the subcommand, so a default
    there would undo an option given before it. Given on both sides, the later wins.
    """
    parent = argparse.ArgumentParser(
        add_help=False, argument_default=None if defaults else argparse.SUPPRESS
    )

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    group = parent.add_argument_group("connection and output")
    group.add_argument(
        "-n",
        "--nameserver",
        action="append",
        dest="nameservers",
        metavar="HOST:PORT",
        help=f"a nameserver to ask; repeatable (default: ${NAMESERVERS_ENV}, comma-separated, "
        f"else {DEFAULT_NAMESERVER})",
    )
    group.add_argument(
        "--timeout",
        type=float,
        default=default(5.0),
        metavar="S",
        help="seconds to wait for any one answer (default: 5)",
    )
    group.add_argument(
        "--json", action="store_true", default=default(False), help="print JSON instead of a table"
    )
    group.add_argument(
        "--credentials-file",
        default=default(""),
        metavar="FILE",
        help="the user to prove on a cluster with auth (what `metaq acl add-user --out` "
        "writes; default: $METAQ_CREDENTIALS_FILE, else $METAQ_ACCESS_KEY and "
        "$METAQ_SECRET_KEY)",
    )
    tls = parent.add_argument_group("TLS (on when any of these is given)")
    tls.add_argument(
        "--tls",
        action="store_true",
        default=default(False),
        help="speak TLS, trusting the system's CAs",
    )
    tls.add_argument(
        "--tls-ca", metavar="FILE", help="the CA (PEM) the servers' certificates chain to"
    )
    tls.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="a client certificate (PEM), for servers that verify clients",
    )
    tls.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert")
    return parent


def credentials(args: argparse.Namespace) -> Credentials | None:
    """The user this command proves, if any was given (see ``--credentials-file``)."""
    try:
        return load_credentials(file=getattr(args, "credentials_file", ""))
    except CredentialsError as exc:
        raise CliError(str(exc), code=2) from None


_TLS_FLAGS: Final = (
    ("tls_cert_file", "--tls-cert"),
    ("tls_key_file", "--tls-key"),
    ("tls_ca_file", "--tls-ca"),
)


def tls_settings(args: argparse.Namespace) -> TlsConfig | None:
    """The TLS options as a client's settings (files checked now), None for plain."""
    ca, cert, key = (getattr(args, name, None) or "" for name in ("tls_ca", "tls_cert", "tls_key"))
    if not (getattr(args, "tls", False) or ca or cert or key):
        return None
    try:
        tls = TlsConfig(cert_file=cert, key_file=key, ca_file=ca)
        tls.check()
    except TlsError as exc:
        message = (
            str(exc).replace("tls_cert_file", "--tls-cert").replace("tls_key_file", "--tls-key")
        )
        raise CliError(message.replace("tls_ca_file", "--tls-ca"), code=2) from None
    return tls


def topic_name(value: str) -> str:
    """An argparse ``type``: a legal topic name, else a usage error (exit 2) saying the
    rule. CliError rather than argparse's own error, which would print the whole usage
    around a one-line reason."""
    try:
        check_topic(value)
    except InvalidMessage as exc:
        raise CliError(str(exc), code=2) from None
    return value


def group_name(value: str) -> str:
    """An argparse ``type``: a legal consumer group name, else a usage error (exit 2)."""
    try:
        check_group(value)
    except InvalidMessage as exc:
        raise CliError(str(exc), code=2) from None
    return value


def add_command(
    subparsers: Any,
    name: str,
    handler: Handler,
    *,
    help: str,
    description: str | None = None,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    """A leaf command with the common options; ``handler`` runs it.

    A command may redefine a common option (``consume`` gives ``--timeout`` its own
    meaning): the later definition wins.
    """
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=help,
        description=_wrap(description or help),
        epilog=epilog,
        parents=[common_options()],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        conflict_handler="resolve",
    )
    parser.set_defaults(handler=handler)
    return parser


def _wrap(text: str) -> str:
    """Wrap each paragraph (the raw formatter keeps epilog examples as written)."""
    if "\n" in text.strip():
        return text
    return textwrap.fill(text, width=min(shutil.get_terminal_size().columns, 88) - 2)


def add_group(subparsers: Any, name: str, *, help: str, description: str | None = None) -> Any:
    """A command group (``metaq topic ...``); returns the subparsers to add leaves to."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help, description=description or help, parents=[common_options()]
    )
    parser.set_defaults(handler=None, group_parser=parser)
    return parser.add_subparsers(title="commands", metavar="COMMAND")


def nameservers(args: argparse.Namespace) -> list[str]:
    given: list[str] | None = args.nameservers
    if given:
        out = [a.strip() for value in given for a in value.split(",") if a.strip()]
    else:
        env = os.environ.get(NAMESERVERS_ENV, "")
        out = [a.strip() for a in env.split(",") if a.strip()] or [DEFAULT_NAMESERVER]
    for address in out:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise CliError(f"nameserver address {address!r} is not HOST:PORT", code=2)
    return out


def add_secret_option(parser: argparse.ArgumentParser) -> None:
    """For commands that change the cluster: how to prove the cluster secret."""
    parser.add_argument(
        "--cluster-secret-file",
        default="",
        metavar="FILE",
        help=f"the cluster secret the nameservers require (default: ${ENV_VAR})",
    )


def cluster_secret(args: argparse.Namespace) -> ClusterSecret | None:
    try:
        return load_secret(args.cluster_secret_file)
    except SecretError as exc:
        raise CliError(str(exc), code=2) from None


def admin(args: argparse.Namespace, *, secret: ClusterSecret | None = None) -> Admin:
    """The admin library as the common options configure it."""
    return Admin(
        nameservers(args),
        timeout_s=args.timeout,
        credentials=credentials(args),
        tls=tls_settings(args),
        cluster_secret=secret,
    )


def split_names(values: Sequence[str] | None) -> list[str]:
    """Repeatable and comma-separated values, flattened, duplicates dropped."""
    if not values:
        return []
    return list(dict.fromkeys(v.strip() for value in values for v in value.split(",") if v.strip()))


# --- output ---------------------------------------------------------------------------


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], out: TextIO | None = None
) -> None:
    """Print rows as aligned columns: numbers right-aligned, text left-aligned."""
    out = out or sys.stdout
    cells = [[_cell(v) for v in row] for row in rows]
    numeric = [
        any(_is_number(row[i]) for row in rows)
        and all(row[i] is None or _is_number(row[i]) for row in rows)
        for i in range(len(headers))
    ]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if numeric[i] else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    print(line([h.upper() for h in headers]), file=out)
    for row in cells:
        print(line(row), file=out)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False, default=str))


def key_values(pairs: Sequence[tuple[str, object]]) -> None:
    """Print ``key: value`` lines with the values aligned."""
    width = max((len(k) for k, _ in pairs), default=0)
    for key, value in pairs:
        print(f"{key + ':':<{width + 1}} {_cell(value)}")
