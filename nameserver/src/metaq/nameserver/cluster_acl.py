"""The cluster's users and grants, agreed by the nameservers through Raft and handed to
every broker with the answers to its heartbeats.

Each nameserver with ``auth_enabled`` keeps its own ACL file in step with the cluster's:
a cluster ACL newer than its file is adopted (enforced here and written to the file); a
file newer than the cluster's (the first nameserver to start, or one edited with
``metaq acl --file``) is proposed to the cluster. Changes from the console and the HTTP
API (:meth:`ClusterAcl.change`) commit through Raft, so a change made on one copy while
someone changed another is refused rather than lost.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from metaq.common.acl import Acl
from metaq.common.acl_source import RELOAD_INTERVAL_S, AclSource
from metaq.common.service import PeriodicService
from metaq.nameserver.controller import (
    AclChangeRefused,
    ClusterAclText,
    Controller,
    ControllerUnavailable,
)

log = logging.getLogger(__name__)

ORIGIN = "the nameservers' Raft log"


class ClusterAcl(PeriodicService):
    """This nameserver's ACL (``source``) kept in step with the cluster's."""

    name = "cluster-acl"

    def __init__(
        self, source: AclSource, controller: Controller, interval_s: float = RELOAD_INTERVAL_S
    ) -> None:
        super().__init__(interval_s)
        self.source = source
        self._controller = controller
        self._unproposed = 0
        controller.add_acl_listener(self._committed)

    @property
    def acl(self) -> Acl:
        """The ACL in force here: the cluster's, or this file's while it is newer."""
        return self.source.acl

    def _committed(self, committed: ClusterAclText) -> None:
        self.source.adopt_text(committed[1], ORIGIN, same_version=True)

    async def run_once(self) -> None:
        self.source.refresh()
        version, text = self._controller.acl
        local = self.source.acl
        if version and version >= local.version:
            self.source.adopt_text(text, ORIGIN, same_version=True)
            return
        try:
            await self._propose(local, version)
        except (AclChangeRefused, ControllerUnavailable) as exc:
            if local.version != self._unproposed:  # once per version, not every second
                self._unproposed = local.version
                log.warning("the ACL file's version %d is not the cluster's yet: %s",
                            local.version, exc)  # fmt: skip

    async def change(self, edit: Callable[[Acl], Acl], expected_version: int | None = None) -> Acl:
        """Commit ``edit`` of the ACL in force (it raises AclError for a change that cannot
        be made) and adopt the result here at once; AclChangeRefused when
        ``expected_version`` (the version the editor saw) is no longer the one in force,
        or someone else's change committed first; ControllerUnavailable without a Raft
        majority."""
        base = self.source.acl
        if expected_version is not None and expected_version != base.version:
            raise AclChangeRefused(
                f"the ACL is at version {base.version}, not {expected_version}: someone "
                "changed it meanwhile; read it again and redo the change"
            )
        changed = edit(base)
        if changed.version <= base.version:
            raise AclChangeRefused(
                f"ACL version {changed.version} is not above the version in force ({base.version})"
            )
        await self._propose(changed, self._controller.acl[0])
        self.source.adopt(changed, ORIGIN)
        return changed

    async def _propose(self, acl: Acl, cluster_version: int) -> None:
        text = json.dumps(acl.to_json(), indent=2) + "\n"
        await self._controller.set_acl(text, acl.version, cluster_version)
        log.info("ACL version %d committed for the cluster", acl.version)
