"""The controller's state agreed through Raft (``pysyncobj``), bridged into asyncio.

:class:`ControlRaft` holds the replicated map broker_name -> :class:`GroupControl`. Its
transitions (:mod:`metaq.nameserver.control`) run on pysyncobj's own thread, in log order,
on every nameserver; :meth:`ControlRaft.propose` hands a proposal to that thread and awaits
the outcome on the event loop, which it never blocks. pysyncobj forwards a follower's
proposal to the leader, so any nameserver may propose.

With no peers the controller is a Raft cluster of one inside the process: no port is
opened, and it is its own leader after a few tens of milliseconds. With peers it listens
on its Raft address (bound to that host only) and needs a majority to commit, and it
needs a password (derived from the cluster secret): pysyncobj unpickles what reaches its
port, so without one anybody who connects runs code in this process. With the password
every message is encrypted and authenticated (Fernet) before it is unpickled, and a
connection that cannot prove it is dropped; :mod:`metaq.nameserver.raft_transport` bounds
what such a connection can make the nameserver buffer before it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pysyncobj import (  # type: ignore[import-untyped]
    FAIL_REASON,
    SyncObj,
    SyncObjConf,
    SyncObjException,
    replicated,
)
from pysyncobj.journal import Journal  # type: ignore[import-untyped]
from pysyncobj.node import Node  # type: ignore[import-untyped]
from pysyncobj.transport import Transport  # type: ignore[import-untyped]

from metaq.common.model import GroupControl
from metaq.nameserver import control
from metaq.nameserver.control import Outcome, Refused
from metaq.nameserver.decisions import Proposal
from metaq.nameserver.raft_transport import GuardedTransport

log = logging.getLogger(__name__)

# Raft is safe across a restart of every member at once only if each comes back with its
# currentTerm and votedFor (Raft §5): a member back at term 0 can be elected below the
# terms in the others' journals and have committed entries overwritten by a stale log.
# pysyncobj stores them in the journal's meta file since 0.3.17 (before any vote is sent)
# and restores them on start; earlier releases reset both. Refuse to run on one of those.
if not hasattr(Journal, "getCurrentTerm"):
    raise ImportError(
        "the installed pysyncobj does not persist the Raft term and vote across restarts, "
        "so a restart of every nameserver at once can undo committed controller decisions; "
        "install pysyncobj 0.3.17 or later (uv sync --frozen installs the pinned one)"
    )

# The node id of a controller with no peers: it has no address anyone dials.
LOCAL_NODE: Final = "local"
_CONNECTED: Final = 2
"""pysyncobj's status value of a partner it holds a connection to."""
_FAILURES: Final = {
    value: name for name, value in vars(FAIL_REASON).items() if isinstance(value, int)
}

Snapshot = Mapping[str, GroupControl]
ClusterAclText = tuple[int, str]
"""The cluster's ACL as Raft holds it: (version, the ACL file's JSON); (0, "") for none."""


class ControllerUnavailable(Exception):
    """No Raft leader or majority answered in time; the proposal's outcome is unknown."""


def _conf(address: str, networked: bool, directory: Path | None, password: str | None) -> Any:
    common: dict[str, Any] = {
        # A tick every 20 ms, and commands wake the tick thread at once (no batching):
        # a decision is committed within a few ms on loopback.
        "autoTickPeriod": 0.02,
        "appendEntriesUseBatch": False,
        # Fail fast when there is no leader; the controller retries every round anyway.
        "commandsWaitLeader": False,
        # Never fork a process that runs gRPC threads (pysyncobj forks to dump by default).
        "useFork": False,
        "journalFile": str(directory / "raft-journal.bin") if directory else None,
        "fullDumpFile": str(directory / "raft-dump.bin") if directory else None,
    }
    if not networked:
        # Nothing to wait for but ourselves: elect at once.
        return SyncObjConf(
            appendEntriesPeriod=0.01, raftMinTimeout=0.04, raftMaxTimeout=0.06, **common
        )
    return SyncObjConf(
        bindAddress=address,  # this host only, not pysyncobj's default of every interface
        password=password,
        maxBindRetries=1,  # a taken port fails start-up instead of retrying forever
        connectionRetryTime=1.0,
        # A leader cut off from the majority steps down after this, so it stops deciding.
        leaderFallbackTimeout=3.0,
        **common,
    )


class _ControlLog(SyncObj):  # type: ignore[misc]  # pysyncobj ships no types
    """The replicated state. Attributes set before ``SyncObj.__init__`` are not replicated
    (pysyncobj dumps only what is set afterwards): the publish hook is local."""

    def __init__(
        self,
        address: str,
        peers: Sequence[str],
        conf: Any,
        publish: Callable[[Snapshot], None],
        publish_acl: Callable[[ClusterAclText], None],
    ) -> None:
        self._publish = publish
        self._published: Snapshot = {}
        self._publish_acl = publish_acl
        self._published_acl: ClusterAclText = (0, "")
        if peers:
            super().__init__(address, list(peers), conf, transportClass=GuardedTransport)
        else:
            super().__init__(Node(address or LOCAL_NODE), [], conf, transportClass=Transport)
        # Replaced, never mutated, so a published snapshot stays as it was.
        self._groups: dict[str, GroupControl] = {}
        self._acl: ClusterAclText = (0, "")
        # A dump loaded at start-up replaces _groups without a transition: publish it too.
        self.addOnTickCallback(self._publish_if_changed)

    def _publish_if_changed(self) -> None:
        if self._groups is not self._published:
            self._published = self._groups
            self._publish(self._groups)
        if self._acl is not self._published_acl:
            self._published_acl = self._acl
            self._publish_acl(self._acl)

    def _commit(self, outcome: Outcome) -> Outcome:
        if isinstance(outcome, GroupControl):
            self._groups = {**self._groups, outcome.broker_name: outcome}
            # Before pysyncobj calls the proposer back, so its answer never outruns the state.
            self._publish_if_changed()
        return outcome

    # Arguments are plain values: they are pickled into the Raft log.
    @replicated  # type: ignore[untyped-decorator]
    def bootstrap(self, broker_name: str, master_id: int, epoch: int, reason: str) -> Outcome:
        current = self._groups.get(broker_name)
        return self._commit(control.bootstrap(current, broker_name, master_id, epoch, reason))

    @replicated  # type: ignore[untyped-decorator]
    def elect(
        self,
        broker_name: str,
        master_id: int,
        expected_epoch: int,
        in_sync_ids: tuple[int, ...],
        reason: str,
    ) -> Outcome:
        current = self._groups.get(broker_name)
        return self._commit(
            control.elect(current, broker_name, master_id, expected_epoch, in_sync_ids, reason)
        )

    @replicated  # type: ignore[untyped-decorator]
    def set_isr(
        self, broker_name: str, epoch: int, in_sync_ids: tuple[int, ...], reason: str
    ) -> Outcome:
        current = self._groups.get(broker_name)
        return self._commit(control.set_isr(current, broker_name, epoch, in_sync_ids, reason))

    @replicated  # type: ignore[untyped-decorator]
    def set_acl(self, text: str, version: int, expected_version: int) -> int | Refused:
        """Replace the cluster's ACL, if it is still at ``expected_version`` (a change made
        on a copy someone else changed meanwhile is refused, not lost)."""
        current = self._acl[0]
        if expected_version != current:
            return Refused(
                f"the cluster's ACL is at version {current}, not {expected_version}: "
                "someone changed it meanwhile; read it again and redo the change"
            )
        if version <= current:
            return Refused(f"ACL version {version} is not above the cluster's {current}")
        self._acl = (version, text)
        self._publish_if_changed()
        return version


@dataclass(frozen=True, slots=True)
class RaftStatus:
    """The Raft group as one member sees it: (address, connected) of itself first, then
    each peer; its term; whether it sees a majority."""

    members: tuple[tuple[str, bool], ...]
    term: int
    has_quorum: bool


class ControlRaft:
    """One nameserver's member of the controller's Raft group.

    ``address`` is this member's Raft address (host:port) and ``peers`` the others' (this
    member's own address may be among them). ``directory`` keeps the journal and dump;
    None keeps them in memory (a restarted member then catches up from the others, or, alone,
    starts from nothing and bootstraps again from what the brokers report). ``password``
    (required with peers, the same on every member) encrypts and authenticates every Raft
    message.
    """

    def __init__(
        self,
        address: str = "",
        peers: Sequence[str] = (),
        directory: Path | None = None,
        password: str | None = None,
    ) -> None:
        self.peers = tuple(p for p in peers if p != address)
        if self.peers and not address:
            raise ValueError("a controller with peers needs its own Raft address")
        if self.peers and not password:
            raise ValueError(
                "a controller with peers needs a Raft password (from the cluster secret): "
                "without one anybody who reaches the Raft port runs code in the nameserver"
            )
        self._password = password if self.peers else None
        self.address = address if self.peers else (address or LOCAL_NODE)
        self._directory = directory
        self._log: _ControlLog | None = None

    @property
    def networked(self) -> bool:
        return bool(self.peers)

    def start(
        self,
        on_change: Callable[[Snapshot], None],
        on_acl: Callable[[ClusterAclText], None] = lambda _acl: None,
    ) -> None:
        """Join the group. ``on_change`` gets each new committed state of the groups and
        ``on_acl`` each new cluster ACL, on pysyncobj's thread.

        Raises OSError when the Raft address cannot be bound.
        """
        if self._directory is not None:
            self._directory.mkdir(parents=True, exist_ok=True)
        conf = _conf(self.address, self.networked, self._directory, self._password)
        raft = _ControlLog(self.address, self.peers, conf, on_change, on_acl)
        if self.networked:
            try:
                raft.waitBinded()
            except SyncObjException as exc:
                raft.destroy()
                raise OSError(f"cannot listen for Raft on {self.address}") from exc
        self._log = raft

    async def stop(self) -> None:
        raft, self._log = self._log, None
        if raft is not None:
            # The tick thread ends at its next tick; wait for it off the loop.
            await asyncio.to_thread(_destroy, raft)

    def compact(self) -> None:
        """Dump the state and cut the journal now (pysyncobj does so every 5000 entries or
        300 s); for tests of recovery from a dump."""
        if self._log is not None:
            self._log.forceLogCompaction()

    def status(self) -> RaftStatus:
        """This member's view of the group (pysyncobj's status dump: read, not locked,
        which is good enough for a view)."""
        raft = self._log
        if raft is None:
            return RaftStatus(((self.address, False), *((p, False) for p in self.peers)), 0, False)
        dump = raft.getStatus()
        peers = tuple(
            (p, dump.get(f"partner_node_status_server_{p}") == _CONNECTED) for p in self.peers
        )
        return RaftStatus(
            ((self.address, True), *peers), int(dump.get("raft_term", 0)),
            bool(dump.get("has_quorum", False)),
        )  # fmt: skip

    @property
    def is_leader(self) -> bool:
        return self._log is not None and bool(self._log._isLeader())

    @property
    def leader(self) -> str:
        """The Raft address of the leader as this member knows it; empty when there is none."""
        node = self._log._getLeader() if self._log is not None else None
        return "" if node is None else str(node.id)

    async def propose(self, proposal: Proposal, timeout_s: float) -> Outcome:
        """Commit ``proposal`` and return the transition's outcome (applied or refused).

        Raises ControllerUnavailable when there is no leader, the leader changed before it
        committed, or nothing answered within ``timeout_s`` (the outcome is then unknown:
        the entry may still commit later).
        """
        raft = self._log
        if raft is None:
            raise ControllerUnavailable("the controller is not running")
        future, done = _settled_by_raft()
        if proposal.kind == "bootstrap":
            raft.bootstrap(
                proposal.broker_name,
                proposal.master_id,
                proposal.epoch,
                proposal.reason,
                callback=done,
            )
        elif proposal.kind == "elect":
            raft.elect(
                proposal.broker_name,
                proposal.master_id,
                proposal.epoch,
                proposal.in_sync_ids,
                proposal.reason,
                callback=done,
            )
        else:
            raft.set_isr(
                proposal.broker_name,
                proposal.epoch,
                proposal.in_sync_ids,
                proposal.reason,
                callback=done,
            )
        outcome: Outcome = await _within(future, timeout_s)
        return outcome

    async def propose_acl(
        self, text: str, version: int, expected_version: int, timeout_s: float
    ) -> int | Refused:
        """Commit the cluster's ACL (its JSON, its version) over ``expected_version``;
        ControllerUnavailable as :meth:`propose` raises it."""
        raft = self._log
        if raft is None:
            raise ControllerUnavailable("the controller is not running")
        future, done = _settled_by_raft()
        raft.set_acl(text, version, expected_version, callback=done)
        committed: int | Refused = await _within(future, timeout_s)
        return committed


def _settled_by_raft() -> tuple[asyncio.Future[Any], Callable[[Any, int], None]]:
    """A future on this loop and the pysyncobj callback (called on its thread) that
    settles it with a command's result, or ControllerUnavailable naming the failure."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: int) -> None:
        if future.done():
            return
        if error == FAIL_REASON.SUCCESS and result is not None:
            future.set_result(result)
        else:
            name = _FAILURES.get(error, str(error))
            future.set_exception(ControllerUnavailable(f"the controller could not commit: {name}"))

    def done(result: Any, error: int) -> None:  # on pysyncobj's thread
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    return future, done


async def _within(future: asyncio.Future[Any], timeout_s: float) -> Any:
    try:
        async with asyncio.timeout(timeout_s):
            return await future
    except TimeoutError:
        raise ControllerUnavailable(
            f"no Raft majority committed the change within {timeout_s:g} s (its outcome is unknown)"
        ) from None


def _destroy(raft: _ControlLog) -> None:
    if raft.tick_thread_alive():
        raft.destroy_synchronous()
    else:
        raft.destroy()
