"""A server's view of the ACL file: loaded at start-up, reloaded when it changes.

Brokers and nameservers read the same file (``auth_acl_file``), which ``metaq acl``
edits in place (an atomic rename) and the deployment copies to every host; a change is
in force within :data:`RELOAD_INTERVAL_S` without a restart. A file that stops parsing
keeps the last good ACL in force (and says so in the log): a typo must not open the
cluster, nor lock everyone out.
"""

from __future__ import annotations

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
