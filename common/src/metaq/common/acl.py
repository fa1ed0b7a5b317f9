"""Who may do what: users, their grants and address allow-lists, and the decision.

A grant is a permission on a resource: ``pub`` / ``sub`` / ``admin`` on ``topic:NAME``,
``group:NAME`` (a trailing ``*`` makes either a prefix: ``topic:orders*``) or ``cluster``
(``admin cluster`` may do anything, the ACL itself included). ``view cluster`` is the
console's read-only role: every page, no change. A user with a non-empty
``cidrs`` list is refused from any other source address.

A consumer group's retry and dead-letter topics (``%RETRY%G``, ``%DLQ%G``) follow the
group: ``sub`` on ``group:G`` lets its members pull them and send failed messages back.

Every refusal is a :class:`PermissionDenied` naming the user, what it lacks and the
``metaq acl`` command that would grant it, plus a short ``reason`` for the
``metaq_auth_denied_total`` metric. Nothing here does I/O except :func:`load` and
:func:`save`, which read and (atomically) replace one JSON file.
"""

from __future__ import annotations

import ipaddress
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final, Literal, TypeAlias

from metaq.common.errors import NotAuthenticated
from metaq.common.names import group_of
from metaq.common.users import Verifier, check_access_key

Permission: TypeAlias = Literal["pub", "sub", "admin", "view"]
PERMISSIONS: Final[tuple[Permission, ...]] = ("pub", "sub", "admin", "view")
Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network


class AclError(ValueError):
    """A grant, a CIDR or an ACL file that cannot be taken; the message says why."""


DENIAL_REASONS: Final = (
    "unauthenticated",
    "bad_proof",
    "bad_signature",
    "replay",
    "clock",
    "address",
    "permission",
    "csrf",
    "not_local",
    "throttled",
    "unbound",
    "wrong_server",
    "metrics_auth",
)
"""The ``reason`` labels of ``metaq_auth_denied_total``: a server exports each at zero
from its start, so an alert on ``increase()`` sees the first refusal of every kind."""


class PermissionDenied(NotAuthenticated):
    """A request refused by authentication or authorization (NO_PERMISSION)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
        """A short label for metrics, one of :data:`DENIAL_REASONS`."""


@dataclass(frozen=True, slots=True)
class Grant:
    permission: Permission
    resource: str
    """``topic:NAME``, ``group:NAME`` (either may end in ``*``) or ``cluster``."""

    @classmethod
    def parse(cls, permission: str, resource: str) -> Grant:
        if permission not in PERMISSIONS:
            raise AclError(f"permission {permission!r} is not one of {', '.join(PERMISSIONS)}")
        kind, sep, name = resource.partition(":")
        if resource != "cluster" and (kind not in ("topic", "group") or not sep or not name):
            raise AclError(
                f"resource {resource!r} is not topic:NAME, group:NAME (NAME may end in '*' "
                "for a prefix) or cluster"
            )
        if "*" in name[:-1]:
            raise AclError(f"resource {resource!r}: '*' may only end the name (a prefix)")
        if permission == "view" and resource != "cluster":
            raise AclError(
                f"view is granted on cluster only (the console, read-only), not {resource!r}"
            )
        return cls(permission, resource)

    def __str__(self) -> str:
        return f"{self.permission} {self.resource}"

    def covers(self, permission: str, kind: str, name: str) -> bool:
        if self.permission == "admin" and self.resource == "cluster":
            return True
        if self.permission != permission:
            return False
        if self.resource == "cluster":
            return kind == "cluster"
        want_kind, _, pattern = self.resource.partition(":")
        if want_kind != kind:
            return False
        if pattern.endswith("*"):
            return name.startswith(pattern[:-1])
        return name == pattern


@dataclass(frozen=True, slots=True)
class User:
    access_key: str
    verifier: Verifier
    grants: frozenset[Grant] = frozenset()
    cidrs: tuple[Network, ...] = ()

    def allows(self, permission: str, kind: str, name: str) -> bool:
        return any(g.covers(permission, kind, name) for g in self.grants)

    @property
    def is_admin(self) -> bool:
        return Grant("admin", "cluster") in self.grants

    @property
    def is_viewer(self) -> bool:
        """May read every console page (``view cluster``, or ``admin cluster``)."""
        return self.is_admin or Grant("view", "cluster") in self.grants


def parse_cidrs(values: Iterable[str]) -> tuple[Network, ...]:
    out = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError as exc:
            raise AclError(f"{value!r} is not a CIDR such as 10.0.0.0/8: {exc}") from None
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Acl:
    """The users of a cluster; ``version`` grows with every change."""

    version: int = 0
    users: Mapping[str, User] = field(default_factory=dict)

    def user(self, access_key: str) -> User | None:
        return self.users.get(access_key)

    # --- changes (each returns a new Acl, one version up) ---------------------------

    def with_user(self, user: User) -> Acl:
        return Acl(self.version + 1, {**self.users, user.access_key: user})

    def without_user(self, access_key: str) -> Acl:
        if access_key not in self.users:
            raise AclError(f"there is no user {access_key}; `metaq acl list` shows them")
        users = dict(self.users)
        del users[access_key]
        return Acl(self.version + 1, users)

    def _change(self, access_key: str, grants: frozenset[Grant]) -> Acl:
        user = self.users.get(access_key)
        if user is None:
            raise AclError(
                f"there is no user {access_key}; add it first with metaq acl add-user {access_key}"
            )
        return self.with_user(replace(user, grants=grants))

    def grant(self, access_key: str, grant: Grant) -> Acl:
        user = self.users.get(access_key)
        return self._change(access_key, (user.grants if user else frozenset()) | {grant})

    def revoke(self, access_key: str, grant: Grant) -> Acl:
        user = self.users.get(access_key)
        if user is not None and grant not in user.grants:
            held = ", ".join(sorted(map(str, user.grants))) or "none"
            raise AclError(f"user {access_key} has no grant {grant} (it has: {held})")
        return self._change(access_key, (user.grants if user else frozenset()) - {grant})

    def set_cidrs(self, access_key: str, cidrs: tuple[Network, ...]) -> Acl:
        user = self.users.get(access_key)
        if user is None:
            raise AclError(f"there is no user {access_key}")
        return self.with_user(replace(user, cidrs=cidrs))

    # --- JSON -----------------------------------------------------------------------

    def to_json(self) -> dict[str, object]:
        return {
            "version": self.version,
            "users": {
                key: {
                    "verifier": user.verifier.to_json(),
                    "grants": sorted(map(str, user.grants)),
                    "cidrs": [str(c) for c in user.cidrs],
                }
                for key, user in sorted(self.users.items())
            },
        }

    @classmethod
    def from_json(cls, data: object) -> Acl:
        try:
            assert isinstance(data, dict)
            version = data["version"]
            assert isinstance(version, int)
            users = {}
            for key, entry in data["users"].items():
                check_access_key(key)
                grants = frozenset(Grant.parse(*g.split(" ", 1)) for g in entry["grants"])
                users[key] = User(
                    key, Verifier.from_json(entry["verifier"]), grants, parse_cidrs(entry["cidrs"])
                )
        except (AssertionError, KeyError, TypeError, AttributeError, ValueError) as exc:
            raise AclError(f"not a metaq ACL ({type(exc).__name__}: {exc})") from None
        return cls(version, users)


def _denied(user: str, permission: str, resource: str) -> PermissionDenied:
    return PermissionDenied(
        f"user {user} lacks {permission} on {resource.replace(':', ' ', 1)}; grant it with "
        f"metaq acl grant {user} {permission} {resource}",
        "permission",
    )


def check(user: User, permission: Permission, kind: str, name: str) -> None:
    """Raise :class:`PermissionDenied` unless ``user`` holds ``permission`` on the
    resource; a group's retry and DLQ topics are judged by ``sub`` on the group."""
    if kind == "topic":
        group = group_of(name)
        if group is not None:
            if not user.allows("sub", "group", group):
                raise _denied(user.access_key, "sub", f"group:{group}")
            return
    if not user.allows(permission, kind, name):
        resource = "cluster" if kind == "cluster" else f"{kind}:{name}"
        raise _denied(user.access_key, permission, resource)


def check_address(user: User, host: str) -> None:
    """Raise :class:`PermissionDenied` when ``user`` has an allow-list ``host`` is not on."""
    if not user.cidrs:
        return
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        address = None
    if address is None or not any(address in net for net in user.cidrs):
        raise PermissionDenied(
            f"user {user.access_key} may not connect from {host}; its allowed networks are "
            f"{', '.join(map(str, user.cidrs))} (change them with metaq acl cidrs)",
            "address",
        )


# --- the file -------------------------------------------------------------------------


def load(path: Path) -> Acl:
    """The ACL in ``path``; an empty one when the file does not exist yet."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Acl()
    except OSError as exc:
        raise AclError(f"ACL file {path}: cannot read it ({exc.strerror})") from None
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AclError(f"ACL file {path} is not JSON: {exc}") from None
    try:
        return Acl.from_json(data)
    except AclError as exc:
        raise AclError(f"ACL file {path}: {exc}") from None


def save(path: Path, acl: Acl) -> None:
    """Replace ``path`` with ``acl`` atomically (readers see the old or the new, whole),
    readable by its owner only: it holds verifiers, which are not secrets but help an
    attacker who also reads the traffic."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(acl.to_json(), f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
