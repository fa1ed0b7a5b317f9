"""A server's view of the ACL: loaded from its file at start-up, reloaded when the file
changes, and replaced by a newer one the nameservers distribute.

Brokers and nameservers each read their own file (``auth_acl_file``). The nameservers
agree on the cluster's ACL through Raft and hand it to every broker with the answers to
its heartbeats (:meth:`AclSource.adopt`), which writes it to the file too, so a server
that restarts while no nameserver answers starts with the latest it had. ``metaq acl
--file`` edits a file in place (an atomic rename); a change is in force within
:data:`RELOAD_INTERVAL_S` without a restart, and a nameserver whose file is newer than
the cluster's proposes it. A file that stops parsing keeps the last good ACL in force
(and says so in the log): a typo must not open the cluster, nor lock everyone out.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Final

from metaq.common import acl
from metaq.common.acl import Acl, AclError
from metaq.common.service import PeriodicService

log = logging.getLogger(__name__)

RELOAD_INTERVAL_S: Final = 1.0


class AuthConfigError(ValueError):
    """Authentication is enabled but cannot be enforced as configured."""


class AclSource:
    """The ACL in force, from one file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self.acl = self._load_first()

    def _load_first(self) -> Acl:
        try:
            self._stamp = self._stat()
            loaded = acl.load(self.path)
        except AclError as exc:
            raise AuthConfigError(str(exc)) from None
        if not self._stamp:
            raise AuthConfigError(
                f"auth_acl_file {self.path} does not exist: create it with "
                f"`metaq acl init ADMIN --file {self.path}` (or turn auth_enabled off)"
            )
        if not any(user.is_admin for user in loaded.users.values()):
            log.warning(
                "the ACL in %s has no user with 'admin cluster': nobody can change it but "
                "with metaq acl --file",
                self.path,
            )
        log.info("ACL version %d: %d users, from %s", loaded.version, len(loaded.users), self.path)
        return loaded

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def refresh(self) -> bool:
        """Reload when the file changed; True when a new ACL is in force."""
        try:
            stamp = self._stat()
        except OSError as exc:
            log.error("ACL file %s: %s; keeping version %d", self.path, exc, self.acl.version)
            return False
        if stamp == self._stamp or stamp is None:
            return False
        self._stamp = stamp
        try:
            loaded = acl.load(self.path)
        except AclError as exc:
            log.error("%s; keeping ACL version %d in force", exc, self.acl.version)
            return False
        log.info(
            "ACL version %d -> %d (%d users)", self.acl.version, loaded.version, len(loaded.users)
        )
        self.acl = loaded
        return True

    def adopt_text(self, text: bytes | str, origin: str, *, same_version: bool = False) -> bool:
        """:meth:`adopt` the ACL file's JSON ``text``; one that does not parse is logged
        and left (the ACL in force stays)."""
        try:
            newer = Acl.from_json(json.loads(text))
        except (ValueError, AclError) as exc:
            log.error("the ACL from %s is not a metaq ACL (%s); keeping version %d",
                      origin, exc, self.acl.version)  # fmt: skip
            return False
        return self.adopt(newer, origin, same_version=same_version)

    def adopt(self, newer: Acl, origin: str, *, same_version: bool = False) -> bool:
        """Enforce ``newer`` (from ``origin``, for the log) when its version is above the
        one in force (or, with ``same_version``, equal but different: the cluster's wins
        over a file edited apart), and keep it in the file; True when it was taken. A
        file that cannot be written is logged: the ACL is in force all the same."""
        current = self.acl.version
        differs = same_version and newer.to_json() != self.acl.to_json()
        if newer.version < current or (newer.version == current and not differs):
            return False
        self.acl = newer
        try:
            acl.save(self.path, newer)
            self._stamp = self._stat()
        except OSError as exc:
            log.error("cannot keep ACL version %d in %s (%s): enforced, not saved",
                      newer.version, self.path, exc)  # fmt: skip
        log.info("ACL version %d -> %d (%d users) from %s", current, newer.version,
                 len(newer.users), origin)  # fmt: skip
        return True


class AclReloader(PeriodicService):
    name = "acl-reload"

    def __init__(self, source: AclSource, interval_s: float = RELOAD_INTERVAL_S) -> None:
        super().__init__(interval_s)
        self._source = source

    async def run_once(self) -> None:
        self._source.refresh()


def open_source(
    enabled: bool, acl_file: str, component: str, has_cluster_secret: bool = True
) -> AclSource | None:
    """The ACL source when ``enabled``; else None, with a WARNING that anyone is served.

    Auth needs the cluster secret too: it is what tells the cluster's own traffic (slaves
    fetching the log and forwarding commits, brokers registering) from users'."""
    if not enabled:
        log.warning(
            "%s runs with auth_enabled = false: it serves ANYONE who reaches its ports "
            "(send, consume, admin). Enable it with auth_enabled = true and auth_acl_file "
            "(docs/operations.md, Security).",
            component,
        )
        return None
    if not has_cluster_secret:
        raise AuthConfigError(
            f"{component}: auth_enabled = true needs the cluster secret as well "
            "(cluster_secret_file or METAQ_CLUSTER_SECRET): brokers and nameservers prove "
            "it to each other, where clients prove a user"
        )
    if not acl_file:
        raise AuthConfigError(
            f"{component}: auth_enabled = true needs auth_acl_file, the users and grants "
            "file that `metaq acl init ADMIN --file FILE` creates"
        )
    return AclSource(Path(acl_file))
