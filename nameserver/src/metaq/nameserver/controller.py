"""The failover controller hosted by the nameservers: who is master of each broker group.

State per group (:class:`GroupControl`: epoch, master, in-sync set) is agreed by the
nameservers through Raft (:mod:`metaq.nameserver.raft`). Only the Raft leader decides:
every round (and at once on :meth:`Controller.wakeup`, e.g. when a broker's session ends)
it runs :class:`Decider` over its own registry and commits what it proposes. Every
nameserver, leader or not, mirrors the committed state on its event loop, hands it to the
registry (routes follow it) and tells its listeners (the gRPC service pushes it to the
group's brokers).

Guarantees: epochs only grow; every transition names the state it was decided on, so a
stale proposal is a no-op; only a member of the committed in-sync set is ever elected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from metaq.common.model import BrokerKey, BrokerState, BrokerView, GroupControl
from metaq.common.service import PeriodicService
from metaq.nameserver import decisions
from metaq.nameserver.config import NameServerConfig
from metaq.nameserver.control import Refused
from metaq.nameserver.decisions import Decider, Proposal
from metaq.nameserver.raft import (
    ClusterAclText,
    ControllerUnavailable,
    ControlRaft,
    RaftStatus,
    Snapshot,
)
from metaq.nameserver.registry import Clock, Registry

log = logging.getLogger(__name__)

DECISION_INTERVAL_S: Final = 0.1
# How long a proposal (the controller's own, or a switchover) may wait for a majority.
COMMIT_TIMEOUT_S: Final = 3.0

Listener = Callable[[GroupControl], None]
LeadershipListener = Callable[[bool], None]
AclListener = Callable[[ClusterAclText], None]


__all__ = [
    "AclChangeRefused",
    "ClusterAclText",
    "Controller",
    "ControllerSettings",
    "ControllerUnavailable",
    "SwitchoverRefused",
]


class SwitchoverRefused(Exception):
    """The switchover's preconditions do not hold (answered FAILED_PRECONDITION)."""


class AclChangeRefused(Exception):
    """A change of the cluster's ACL made on a version that is no longer the cluster's."""


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    address: str = ""
    peers: tuple[str, ...] = ()
    directory: Path | None = None
    master_detection_s: float = 3.0
    bootstrap_grace_s: float = 5.0
    # Encrypts and authenticates Raft traffic; required with peers (see raft.py).
    raft_password: str | None = None
    takeover_timeout_s: float = 10.0
    standby_heartbeat_interval_s: float = 1.5
    """How often brokers whose beat decides nothing here are asked to heartbeat (0: at
    their own rate); see :meth:`NameServerService` and docs/nameserver.md."""

    @classmethod
    def of(cls, config: NameServerConfig, raft_password: str | None = None) -> ControllerSettings:
        return cls(
            raft_password=raft_password,
            address=config.controller_address,
            peers=config.controller_peers,
            directory=Path(config.controller_dir) if config.controller_dir else None,
            master_detection_s=config.master_detection_ms / 1000,
            bootstrap_grace_s=config.bootstrap_grace_ms / 1000,
            takeover_timeout_s=config.takeover_timeout_ms / 1000,
            standby_heartbeat_interval_s=min(
                config.standby_heartbeat_interval_ms, config.master_detection_ms / 2
            )
            / 1000,
        )


class Controller(PeriodicService):
    """One nameserver's part of the failover controller. Use on one event loop.

    :meth:`start` joins the Raft group and starts deciding (when leader); :meth:`stop`
    leaves it. ``controls`` is the committed state as this nameserver knows it.
    """

    name = "failover-controller"

    def __init__(
        self, registry: Registry, settings: ControllerSettings, clock: Clock = time.monotonic
    ) -> None:
        super().__init__(DECISION_INTERVAL_S)
        self.settings = settings
        self._registry = registry
        self._raft = ControlRaft(
            settings.address, settings.peers, settings.directory, settings.raft_password
        )
        self._decider = Decider(
            settings.master_detection_s,
            settings.bootstrap_grace_s,
            clock,
            takeover_timeout_s=settings.takeover_timeout_s,
        )
        self._committed: Snapshot = {}
        self._listeners: list[Listener] = []
        self._acl: ClusterAclText = (0, "")
        self._acl_listeners: list[AclListener] = []
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._leading = False
        self._settled: dict[str, tuple[GroupControl, BrokerState]] = {}
        """Groups the last full decision found settled: their committed state, and their
        master's state then (see :meth:`_undecided`)."""
        self._leadership_listeners: list[LeadershipListener] = []
        self.master_changes: dict[str, int] = {}
        """Committed master changes applied here, by group (the failovers metric)."""

    # --- life ---------------------------------------------------------------------------

    def start(self) -> None:
        """Join the Raft group (OSError if its address cannot be bound), then decide."""
        self._event_loop = asyncio.get_running_loop()
        self._raft.start(self._committed_on_raft_thread, self._acl_on_raft_thread)
        super().start()

    async def on_stop(self) -> None:
        await self._raft.stop()

    # --- what others read ---------------------------------------------------------------

    @property
    def address(self) -> str:
        """This member's Raft address (``local`` for a controller with no peers)."""
        return self._raft.address

    @property
    def networked(self) -> bool:
        return self._raft.networked

    @property
    def is_leader(self) -> bool:
        return self._raft.is_leader

    @property
    def leader(self) -> str:
        return self._raft.leader

    def raft_status(self) -> RaftStatus:
        """The Raft group as this member sees it (for admin views)."""
        return self._raft.status()

    @property
    def controls(self) -> Snapshot:
        """The committed state of every managed group, by name (never mutated: replaced)."""
        return self._committed

    def control(self, broker_name: str) -> GroupControl | None:
        return self._committed.get(broker_name)

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(control)`` on the event loop whenever a group's state changes."""
        self._listeners.append(listener)

    def add_leadership_listener(self, listener: LeadershipListener) -> None:
        """Call ``listener(leading)`` on the event loop when this member becomes the Raft
        leader or stops being it (seen at the next decision round, within 100 ms)."""
        self._leadership_listeners.append(listener)

    @property
    def acl(self) -> ClusterAclText:
        """The cluster's ACL as committed: (version, JSON); (0, "") while it has none."""
        return self._acl

    def add_acl_listener(self, listener: AclListener) -> None:
        """Call ``listener(acl)`` on the event loop whenever the cluster's ACL changes."""
        self._acl_listeners.append(listener)

    async def set_acl(self, text: str, version: int, expected_version: int) -> int:
        """Commit a new cluster ACL over ``expected_version``; its version once committed.
        Raises AclChangeRefused or ControllerUnavailable."""
        outcome = await self._raft.propose_acl(text, version, expected_version, COMMIT_TIMEOUT_S)
        if isinstance(outcome, Refused):
            raise AclChangeRefused(outcome.why)
        return outcome

    # --- decisions ----------------------------------------------------------------------

    async def run_once(self) -> None:
        leading = self._raft.is_leader
        if leading != self._leading:
            self._leading = leading
            log.info("controller %s leader", "became" if leading else "is no longer")
            for listener in self._leadership_listeners:
                listener(leading)
        if not leading:
            self._decider.reset()
            self._settled.clear()
            return
        proposals = self.proposals()
        if proposals:
            await asyncio.gather(*(self._commit(p) for p in proposals))

    def proposals(self) -> list[Proposal]:
        """What a round of the leader decides (:meth:`run_once` commits it)."""
        controls, members = self._undecided()
        proposals = self._decider.decide(controls, members)
        self._note_settled(controls, members)
        return proposals

    async def switchover(
        self, broker_name: str, broker_id: int, expected_epoch: int
    ) -> GroupControl:
        """Make ``broker_id`` master at the next epoch, as the Switchover rpc describes.

        Raises SwitchoverRefused (preconditions, checked here and again in the Raft log)
        or ControllerUnavailable (no leader or majority in time).
        """
        checked = decisions.switchover(
            broker_name,
            self.control(broker_name),
            self._registry.members(broker_name),
            broker_id,
            expected_epoch,
            self.settings.master_detection_s,
        )
        if isinstance(checked, Refused):
            raise SwitchoverRefused(checked.why)
        outcome = await self._raft.propose(checked, COMMIT_TIMEOUT_S)
        if isinstance(outcome, Refused):
            raise SwitchoverRefused(outcome.why)
        log.info("switchover of %s/%d committed at epoch %d", broker_name, broker_id, outcome.epoch)
        return outcome

    def _undecided(self) -> tuple[dict[str, GroupControl], dict[str, list[BrokerView]]]:
        """The committed state and live controlled brokers of the groups this round must
        decide: all but those settled (:meth:`Decider.settled`) with the same committed
        state and their master heard in the same state within ``master_detection_s``.
        Those the decider would pass over anyway; leaving them out keeps a round at a
        lookup per group instead of a view of every broker (rounds run 10 times a second
        on the leader, whatever the number of groups)."""
        registry = self._registry
        detection_s = self.settings.master_detection_s
        controls: dict[str, GroupControl] = {}
        members: dict[str, list[BrokerView]] = {}
        for name in set(registry.group_names()) | set(self._committed):
            control = self._committed.get(name)
            if control is not None:
                settled = self._settled.get(name)
                if settled is not None and settled[0] is control:
                    heard = registry.heard(name, control.master_id)
                    if heard is not None and heard[0] is settled[1] and heard[1] <= detection_s:
                        continue
                controls[name] = control
            members[name] = [b for b in registry.members(name) if b.state.controlled]
        return controls, members

    def _note_settled(
        self, controls: dict[str, GroupControl], members: dict[str, list[BrokerView]]
    ) -> None:
        """Remember the groups this round found settled, with their state and master's."""
        detection_s = self.settings.master_detection_s
        for name, control in controls.items():
            master = next(
                (b for b in members.get(name, ()) if b.state.key.broker_id == control.master_id),
                None,
            )
            if (
                master is not None
                and master.last_heartbeat_age_s <= detection_s
                and self._decider.settled(control, master.state)
            ):
                self._settled[name] = (control, master.state)
            else:
                self._settled.pop(name, None)

    async def _commit(self, proposal: Proposal) -> None:
        try:
            outcome = await self._raft.propose(proposal, COMMIT_TIMEOUT_S)
        except ControllerUnavailable as exc:
            log.warning("group %s: %s not committed: %s", proposal.broker_name, proposal.kind, exc)
            return
        if isinstance(outcome, Refused):
            # Someone else's decision got there first; the next round decides afresh.
            log.info(
                "group %s: %s was a no-op: %s", proposal.broker_name, proposal.kind, outcome.why
            )

    # --- the committed state, from pysyncobj's thread to the loop -------------------------

    def _committed_on_raft_thread(self, snapshot: Snapshot) -> None:
        loop = self._event_loop
        if loop is None:
            return
        # A loop closed while the Raft thread still ticks has nobody left to tell.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._take, snapshot)

    def _acl_on_raft_thread(self, committed: ClusterAclText) -> None:
        loop = self._event_loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._take_acl, committed)

    def _take_acl(self, committed: ClusterAclText) -> None:
        if committed[0] <= self._acl[0]:
            return
        self._acl = committed
        log.info("cluster ACL version %d committed", committed[0])
        for listener in self._acl_listeners:
            listener(committed)

    def _take(self, snapshot: Snapshot) -> None:
        previous, self._committed = self._committed, snapshot
        for name in sorted(snapshot):
            new = snapshot[name]
            old = previous.get(name)
            if new == old:
                continue
            self._registry.set_control(new)
            if old is not None and old.master_id != new.master_id:
                self.master_changes[name] = self.master_changes.get(name, 0) + 1
            _log_change(old, new)
            for listener in self._listeners:
                listener(new)


def _log_change(old: GroupControl | None, new: GroupControl) -> None:
    master = BrokerKey(new.broker_name, new.master_id)
    if old is None or old.master_id != new.master_id:
        log.info(
            "group %s: master %s -> %s at epoch %d, in sync %s (%s)",
            new.broker_name,
            "none" if old is None else BrokerKey(old.broker_name, old.master_id),
            master,
            new.epoch,
            list(new.in_sync_ids),
            new.reason,
        )
    else:
        log.info(
            "group %s: in sync %s -> %s under master %s at epoch %d (%s)",
            new.broker_name,
            list(old.in_sync_ids),
            list(new.in_sync_ids),
            master,
            new.epoch,
            new.reason,
        )
