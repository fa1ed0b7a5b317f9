"""``metaq acl``: users, grants and address allow-lists of a cluster.

With ``--http HOST:PORT`` (a nameserver's HTTP endpoint) the commands read and change the
cluster's ACL there, as an admin user: the nameservers agree on it through Raft and hand
it to every broker with the answers to its heartbeats, and each server keeps it in its
own ``auth_acl_file``. With ``--file`` they change one ACL file in place (an atomic
rename), which its server rereads within a second; ``init`` makes the first file, and a
nameserver given a file newer than the cluster's proposes it to the cluster. The ACL
holds each user's verifier, never its secret: ``add-user`` prints the generated secret
key once (or writes it to ``--out``), and it cannot be recovered from the ACL.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metaq.client.admin import AclConflict
from metaq.client.cli.support import CliError, add_command, add_group, admin, print_json, table
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
HTTP_ENV = "METAQ_NAMESERVER_HTTP"


def register(subparsers: Any) -> None:
    group = add_group(
        subparsers,
        "acl",
        help="manage users and their grants (auth_acl_file)",
        description="Users, grants (pub/sub/admin on topic:NAME, group:NAME, a trailing * "
        "for a prefix, or cluster; view cluster for the read-only console) and "
        "source-address allow-lists: the cluster's, at a nameserver's HTTP endpoint (--http, "
        f"default ${HTTP_ENV}), which the nameservers hand to every broker, or one ACL "
        f"file's (--file, default ${ACL_FILE_ENV}).",
    )

    def command(name: str, handler: Any, help: str) -> argparse.ArgumentParser:
        parser = add_command(group, name, handler, help=help)
        parser.add_argument("--file", default=os.environ.get(ACL_FILE_ENV, ""), help="the ACL file")
        if name != "init":
            parser.add_argument(
                "--http", default=os.environ.get(HTTP_ENV, ""), metavar="HOST:PORT",
                help="a nameserver's HTTP endpoint: the cluster's ACL, as an admin user",
            )  # fmt: skip
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
        where = f"--http HOST:PORT (${HTTP_ENV}), or " if "http" in args else ""
        raise CliError(f"say which ACL: {where}--file FILE (${ACL_FILE_ENV})", code=2)
    return Path(args.file)


async def _read(args: argparse.Namespace) -> Acl:
    if getattr(args, "http", ""):
        async with admin(args) as calls:
            return await calls.cluster_acl(args.http)
    return _load(_path(args))


async def _apply(args: argparse.Namespace, edit: Callable[[Acl], Acl]) -> Acl:
    """``edit`` the cluster's ACL (with ``--http``) or the file's; the ACL written."""
    try:
        if getattr(args, "http", ""):
            async with admin(args) as calls:
                return await calls.change_cluster_acl(args.http, edit)
        path = _path(args)
        changed = edit(_load(path))
    except AclError as exc:
        raise CliError(str(exc)) from None
    except AclConflict as exc:
        raise CliError(f"{exc}; run the command again") from None
    _save(path, changed)
    return changed


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


def _new_user(args: argparse.Namespace, secret: str) -> tuple[Callable[[Acl], Acl], Credentials]:
    try:
        credentials = Credentials(args.user, secret)
        verifier = Verifier.make(args.user, secret)
    except CredentialsError as exc:
        raise CliError(str(exc), code=2) from None

    def edit(current: Acl) -> Acl:
        if current.user(args.user) is not None:
            raise CliError(f"user {args.user} exists; remove-user first to give it a new key")
        return current.with_user(User(args.user, verifier))

    return edit, credentials


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
    edit, credentials = _new_user(args, new_secret_key())
    _save(path, edit(current).grant(args.user, Grant("admin", "cluster")))
    _hand_out(args, credentials)
    return 0


async def add_user(args: argparse.Namespace) -> int:
    secret = new_secret_key()
    if args.secret_key_file:
        try:
            secret = Path(args.secret_key_file).read_text().strip()
        except OSError as exc:
            raise CliError(f"cannot read {args.secret_key_file}: {exc.strerror}") from None
    edit, credentials = _new_user(args, secret)
    await _apply(args, edit)
    if args.secret_key_file:
        print(f"user {args.user} added")
    else:
        _hand_out(args, credentials)
    return 0


async def _change(args: argparse.Namespace, how: str) -> int:
    def edit(current: Acl) -> Acl:
        if how == "remove":
            return current.without_user(args.user)
        if how == "cidrs":
            return current.set_cidrs(args.user, acl.parse_cidrs(args.cidr))
        item = Grant.parse(args.permission, args.resource)
        return current.grant(args.user, item) if how == "grant" else current.revoke(args.user, item)

    changed = await _apply(args, edit)
    print(f"ACL version {changed.version}")
    return 0


async def remove_user(args: argparse.Namespace) -> int:
    return await _change(args, "remove")


async def grant(args: argparse.Namespace) -> int:
    return await _change(args, "grant")


async def revoke(args: argparse.Namespace) -> int:
    return await _change(args, "revoke")


async def cidrs(args: argparse.Namespace) -> int:
    return await _change(args, "cidrs")


async def list_users(args: argparse.Namespace) -> int:
    current = await _read(args)
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
