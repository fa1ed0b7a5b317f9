"""``metaq acl``: users, grants and address allow-lists in a cluster's ACL file.

The ACL is one JSON file (``auth_acl_file`` of every broker and nameserver), which these
commands change in place with an atomic rename; servers reread it within a second, and
the deployment copies it to every host (docs/operations.md, Security). It holds each
user's verifier, never its secret: ``add-user`` prints the generated secret key once
(or writes it to ``--out``), and it cannot be recovered from the file.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from metaq.client.cli.support import CliError, add_command, add_group, print_json, table
from metaq.common import acl
from metaq.common.acl import Acl, AclError, Grant, User
from metaq.common.users import (
    Credentials,
    CredentialsError,
    Verifier,
    credentials_text,
    new_secret_key,
)

ACL_FILE_ENV = "METAQ_ACL_FILE"


def register(subparsers: Any) -> None:
    group = add_group(
        subparsers,
        "acl",
        help="manage users and their grants (auth_acl_file)",
        description="Users, grants (pub/sub/admin on topic:NAME, group:NAME, a trailing * "
        "for a prefix, or cluster) and source-address allow-lists, in the ACL file the "
        f"brokers and nameservers read (--file, default ${ACL_FILE_ENV}).",
    )

    def command(name: str, handler: Any, help: str) -> argparse.ArgumentParser:
        parser = add_command(group, name, handler, help=help)
        parser.add_argument("--file", default=os.environ.get(ACL_FILE_ENV, ""), help="the ACL file")
        return parser

    parser = command("init", init, "create the ACL file with a first admin user")
    parser.add_argument("user", help="the admin's access key")
    parser.add_argument("--out", default="", help="write the credentials here (mode 600)")
    parser = command("add-user", add_user, "add a user with a generated secret key")
    parser.add_argument("user", help="the access key")
    parser.add_argument("--out", default="", help="write the credentials here (mode 600)")
    parser.add_argument(
        "--secret-key-file", default="", help="use the secret key in this file, not a new one"
    )
    parser = command("remove-user", remove_user, "remove a user and its grants")
    parser.add_argument("user")
    for name, handler in (("grant", grant), ("revoke", revoke)):
        parser = command(name, handler, f"{name} a permission on a resource")
        parser.add_argument("user")
        parser.add_argument("permission", choices=acl.PERMISSIONS)
        parser.add_argument("resource", help="topic:NAME, group:NAME (NAME* a prefix) or cluster")
    parser = command("cidrs", cidrs, "set the networks a user may connect from (none: any)")
    parser.add_argument("user")
    parser.add_argument("cidr", nargs="*", help="e.g. 10.1.0.0/16; give none to allow any")
    command("list", list_users, "list users, their grants and networks")


def _path(args: argparse.Namespace) -> Path:
    if not args.file:
        raise CliError(f"say which ACL file: --file FILE or ${ACL_FILE_ENV}", code=2)
    return Path(args.file)


def _load(path: Path) -> Acl:
    try:
        return acl.load(path)
    except AclError as exc:
        raise CliError(str(exc)) from None


def _save(path: Path, changed: Acl) -> None:
    try:
        acl.save(path, changed)
    except OSError as exc:
        raise CliError(f"cannot write the ACL file {path}: {exc.strerror}") from None


def _new_user(args: argparse.Namespace, current: Acl, secret: str) -> tuple[Acl, Credentials]:
    if current.user(args.user) is not None:
        raise CliError(f"user {args.user} exists; remove-user first to give it a new key")
    try:
        credentials = Credentials(args.user, secret)
        verifier = Verifier.make(args.user, secret)
    except CredentialsError as exc:
        raise CliError(str(exc), code=2) from None
    return current.with_user(User(args.user, verifier)), credentials


def _hand_out(args: argparse.Namespace, credentials: Credentials) -> None:
    text = credentials_text(credentials)
    if args.out:
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        print(f"credentials of {credentials.access_key} written to {args.out}")
    else:
        print(f"# the secret key is shown only now; keep it safe\n{text}", end="")


async def init(args: argparse.Namespace) -> int:
    path = _path(args)
    current = _load(path)
    if current.users:
        raise CliError(f"{path} already has users; use add-user and grant")
    changed, credentials = _new_user(args, current, new_secret_key())
    changed = changed.grant(args.user, Grant("admin", "cluster"))
    _save(path, changed)
    _hand_out(args, credentials)
    return 0


async def add_user(args: argparse.Namespace) -> int:
    path = _path(args)
    secret = new_secret_key()
    if args.secret_key_file:
        try:
            secret = Path(args.secret_key_file).read_text().strip()
        except OSError as exc:
            raise CliError(f"cannot read {args.secret_key_file}: {exc.strerror}") from None
    changed, credentials = _new_user(args, _load(path), secret)
    _save(path, changed)
    if args.secret_key_file:
        print(f"user {args.user} added")
    else:
        _hand_out(args, credentials)
    return 0


def _change(args: argparse.Namespace, how: str) -> int:
    path = _path(args)
    current = _load(path)
    try:
        if how == "remove":
            changed = current.without_user(args.user)
        elif how == "cidrs":
            changed = current.set_cidrs(args.user, acl.parse_cidrs(args.cidr))
        else:
            item = Grant.parse(args.permission, args.resource)
            changed = (
                current.grant(args.user, item)
                if how == "grant"
                else current.revoke(args.user, item)
            )
    except AclError as exc:
        raise CliError(str(exc)) from None
    _save(path, changed)
    print(f"ACL version {changed.version}")
    return 0


async def remove_user(args: argparse.Namespace) -> int:
    return _change(args, "remove")


async def grant(args: argparse.Namespace) -> int:
    return _change(args, "grant")


async def revoke(args: argparse.Namespace) -> int:
    return _change(args, "revoke")


async def cidrs(args: argparse.Namespace) -> int:
    return _change(args, "cidrs")


async def list_users(args: argparse.Namespace) -> int:
    current = _load(_path(args))
    rows = [
        {
            "user": key,
            "grants": sorted(map(str, user.grants)),
            "cidrs": [str(c) for c in user.cidrs],
        }
        for key, user in sorted(current.users.items())
    ]
    if args.json:
        print_json({"version": current.version, "users": rows})
        return 0
    table(
        ["user", "grants", "networks"],
        [[r["user"], ", ".join(r["grants"]) or "-", ", ".join(r["cidrs"]) or "any"] for r in rows],
    )
    return 0
