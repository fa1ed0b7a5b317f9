"""The broker's place in its group: master or slave, in which epoch, and the switch.

A master serves its slaves' fetches through a :class:`ReplicaSet` and, under sync
replication, answers sends once they are replicated. A slave runs a :class:`Follower`
copying its master's log. Without failover the role is the deployed one (broker id 0 is
the master) for good. With failover the nameservers' controller decides: the broker
starts as a slave that takes no writes, and every GroupControl it hears (the answer to a
heartbeat, or news pushed at once when the controller moves the master) may promote it,
or demote it and point it at another master. Changes are applied one at a time.

Promotion stops the copying first, dispatches everything copied (so its queue offsets
continue the old master's), starts a new epoch at its log's end, and only then takes
writes, with the slaves the controller kept in sync already counted in sync. Demotion
refuses writes at once and fails the sends still waiting for slaves (they were never
acknowledged), then follows the new master, cutting whatever tail the new master never
had.

What to do on each event is decided by :class:`~metaq.broker.role_machine.RoleMachine`,
which does no I/O; :class:`GroupRole` carries its commands out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Final, assert_never

from metaq.broker.config import BrokerConfig
from metaq.broker.confirmed_mark import ConfirmedMark
from metaq.broker.connection import Responder
from metaq.broker.journal import Journal
from metaq.broker.log_check import LogCheck
from metaq.broker.queue_locks import QueueLocks
from metaq.broker.replica_auth import ReplicaGate
from metaq.broker.replica_log import StoreLog
from metaq.broker.role_machine import (
    Announce,
    ApplyInTurn,
    BecomeWriter,
    Command,
    CommitInSync,
    Follow,
    Heard,
    HoldOffQueueLocks,
    HoldUnjournaled,
    Log,
    RoleMachine,
    RoleSettings,
    StopServingSlaves,
    TookUp,
    WriteJournal,
    restored_confirmed,
)
from metaq.broker.store import MessageStore
from metaq.broker.store.flush import AsyncDurability
from metaq.common.auth import ClusterSecret
from metaq.common.errors import MetaqError, NotEnoughReplicas
from metaq.common.framing import FLAG_RESPONSE, Buffer, Frame, FrameType, encode_error, encode_frame
from metaq.common.model import GroupControl, ReplicationMode, Role
from metaq.common.service import cancel_and_wait, spawn
from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1.data_pb2 import ReplicaFetchRequest, ReplicaFetchResponse
from metaq.replication.channel import DataPlaneChannel, SlaveIdentity
from metaq.replication.epochs import EpochHistory
from metaq.replication.follower import Follower
from metaq.replication.master import Answer, ReplicaSet

log = logging.getLogger(__name__)

TAKE_UP_WAIT_S: Final = 1.0
"""How long a fetch in an epoch this broker has not taken up yet waits for it to."""


class GroupRole:
    """Carries out the :class:`RoleMachine`'s commands with the broker's collaborators:
    the store, its epoch history, the follower (as slave), the replica set (as master),
    the journal and the queue locks. Built by :func:`open_group_role`."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        replica_log: StoreLog,
        history: EpochHistory,
        *,
        gate: ReplicaGate,
        connect: Callable[[str], Awaitable[DataPlaneChannel]],
        mark: ConfirmedMark | None = None,
    ) -> None:
        self.config = config
        self.gate = gate
        """As master: which connections' slaves proved the cluster secret."""
        self.connect = connect
        """A connection to the master at an address as this slave: with a cluster secret
        the master proves it before we take, cut or adopt anything it says, and we prove
        it before it serves us (raises NotAuthenticated otherwise)."""
        self._store = store
        self.log = replica_log
        self.history = history
        self.controlled = config.controlled
        self.sync = config.replication_mode is ReplicationMode.SYNC
        self.machine = RoleMachine(
            RoleSettings(
                broker_name=config.broker_name,
                broker_id=config.broker_id,
                controlled=self.controlled,
                sync=self.sync,
                master_lease_ms=config.master_lease_ms,
            ),
            configured_master=config.is_master,
            epoch=history.last_epoch,
        )
        self.replicas: ReplicaSet | None = None
        self.follower = Follower(
            self.log,
            self.history,
            self.connect,
            broker_name=config.broker_name,
            broker_id=config.broker_id,
            epoch=self.machine.epoch,
            on_confirmed=self._follower_confirmed,
        )
        self._mark = mark
        """Under a controller: the confirmed offset kept on disk across restarts."""
        if mark is not None:
            self.follower.confirmed = restored_confirmed(mark.offset, store.commitlog.write_offset)
        self.on_change: Callable[[], None] = lambda: None
        """Called after every change of role or epoch (the registrar re-announces)."""
        self.on_confirmed: Callable[[], None] = lambda: None
        """Called when the slaves' copies let consumers read further (parked pulls)."""
        self.journal: Journal | None = None
        """Applied to the end before a promotion; written in full after it."""
        self.queue_locks = QueueLocks(config.queue_lock_ttl_ms / 1e3)
        """Ordered consumers' locks; granted by the master only."""
        self._changes: asyncio.Queue[GroupControl] = asyncio.Queue()
        self._took_up = asyncio.Event()
        """Set (and replaced) whenever this broker has taken up a role in a new epoch."""
        self._worker: asyncio.Task[None] | None = None
        self._fetches: set[asyncio.Task[None]] = set()
        self.check: LogCheck | None = None
        """A controlled broker's check of its log since this start (see log_check)."""

    @property
    def role(self) -> Role:
        return self.machine.role

    @property
    def epoch(self) -> int:
        return self.machine.epoch

    @property
    def master_address(self) -> str:
        return self.machine.master_address

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        if self.check is not None:
            self.check.start()
        self.follower.start()
        await self._execute(self.machine.on_start())
        self._worker = asyncio.get_running_loop().create_task(self._apply_changes())

    async def stop(self) -> None:
        await cancel_and_wait(self._worker)
        await self.follower.stop()
        if self.check is not None:
            await self.check.stop()
        if self.replicas is not None:
            self.replicas.close()
        for task in list(self._fetches):
            task.cancel()
        if self._mark is not None:
            await self._mark.close()

    def _follower_confirmed(self) -> None:
        if self._mark is not None:
            self._mark.note(self.follower.confirmed)
        self.on_confirmed()

    # --- writes -------------------------------------------------------------------------

    @property
    def takes_writes(self) -> bool:
        """Master now (not fenced, lease held); sync replication's copies aside."""
        try:
            self._check_master()
        except MetaqError:
            return False
        return True

    @property
    def holds_commits(self) -> bool:
        """A slave: consumers' offset commits here are held for the master (see
        metaq.broker.held_offsets), not journaled."""
        return self.machine.holds_commits

    def check_writable(self) -> None:
        """Raise unless this broker may take a client's write now."""
        replicas = self._check_master()
        if self.sync:
            replicas.check_writable()

    def _check_master(self) -> ReplicaSet:
        return self.machine.check_master(time.monotonic(), self.replicas)

    async def handover(self, target: int, timeout_s: float, fence_s: float) -> int:
        """A planned switchover's first step: stop taking writes and wait until slave
        ``target`` holds the whole log; return the log's end.

        Writes resume by themselves after ``fence_s`` (or :meth:`resume`) unless the
        controller moved the master meanwhile, so a switchover abandoned half-way does
        not leave the group without a writer.
        """
        replicas = self._check_master()
        if target not in replicas.slaves:
            raise NotEnoughReplicas(
                f"broker {target} is not replicating from this master; it cannot take over"
            )
        self.machine.fence(target, time.monotonic() + fence_s)
        end = self._store.commitlog.write_offset
        try:
            async with asyncio.timeout(timeout_s):
                while replicas.slaves[target].acked < end:
                    await asyncio.sleep(0.002)
        except TimeoutError:
            self.resume()
            raise NotEnoughReplicas(
                f"broker {target} did not catch up to offset {end} within {timeout_s} s "
                f"(it holds {replicas.slaves[target].acked}); writes resumed here"
            ) from None
        return end

    def resume(self) -> None:
        self.machine.resume()

    def appended(self) -> None:
        if self.replicas is not None:
            self.replicas.appended()

    async def wait_replicated(self, offset: int) -> bool:
        replicas = self.replicas
        if replicas is None:
            return False
        return await replicas.wait_replicated(offset, self.config.replication_timeout_ms / 1e3)

    def when_replicated(self, offset: int, done: Callable[[bool], None]) -> None:
        """``done(replicated)`` as :meth:`wait_replicated` returns it, called back."""
        replicas = self.replicas
        if replicas is None:
            done(False)
            return
        replicas.when_replicated(offset, self.config.replication_timeout_ms / 1e3, done)

    # --- slaves' fetches ----------------------------------------------------------------

    def handle_fetch(self, responder: Responder, frame: Frame) -> None:
        request = ReplicaFetchRequest.FromString(frame.header)
        # Before anything counts it: no bytes, no in-sync set, no acked offset for strangers.
        self.gate.check_fetch(responder.connection_id, request)
        answer = _fetch_answerer(responder, frame.request_id)
        if self.replicas is not None:
            # Answered or parked in this turn: a refusal raises to the connection, which
            # answers it with an ERROR frame.
            self.replicas.serve_fetch(request, answer, responder.connection_id)
            return
        if request.epoch <= self.epoch:
            self._check_master()  # raises NotMaster, naming the master if known
            return
        spawn(
            self._fetches, self._answer_when_taken_up(responder, frame.request_id, request, answer)
        )

    async def _answer_when_taken_up(
        self,
        responder: Responder,
        request_id: int,
        request: ReplicaFetchRequest,
        answer: Answer,
    ) -> None:
        try:
            replicas = await self._taken_up(request.epoch, TAKE_UP_WAIT_S)
            replicas.serve_fetch(request, answer, responder.connection_id)
        except MetaqError as exc:
            responder.respond(
                encode_error(
                    exc.code,
                    str(exc),
                    request_id=request_id,
                    frame_type=FrameType.REPLICA_FETCH,
                    retriable=exc.retriable,
                )
            )

    async def _taken_up(self, epoch: int, timeout_s: float) -> ReplicaSet:
        """This broker's ReplicaSet once it has taken up ``epoch``, or NotMaster.

        A slave fetching in an epoch this broker has not taken up yet heard the
        controller's news first (a push reaches the group's brokers in any order, and a
        promotion takes a few ms): answering NotMaster would send it into its back-off
        while the new master's first sends wait for its copy.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self.epoch < epoch:
                    await self._took_up.wait()
        return self.replicas if self.replicas is not None else self._check_master()

    # --- what the nameservers say -------------------------------------------------------

    def on_answer(self, registered: pb.RegisterBrokerResponse, sent_at: float | None) -> None:
        """Every event from every nameserver comes here (answers and pushed news);
        ``sent_at`` is when the heartbeat it answers was sent (None for news)."""
        heard = Heard(
            control=(
                GroupControl.from_proto(registered.control)
                if registered.HasField("control")
                else None
            ),
            lease_granted=registered.lease_granted,
            master_address=registered.master_data_address,
            sent_at=sent_at,
        )
        for command in self.machine.on_heard(heard):
            self._do(command)

    async def _apply_changes(self) -> None:
        while True:
            control = await self._changes.get()
            try:
                await self._execute(self.machine.on_control(control))
            except Exception:
                log.exception("applying the controller's decision %s failed", control)

    # --- carrying out the machine's commands --------------------------------------------

    async def _execute(self, commands: Iterable[Command]) -> None:
        """Carry out ``commands`` in order; one that fails stops the rest."""
        for command in commands:
            if isinstance(command, BecomeWriter):
                await self._become_writer(command)
            elif isinstance(command, WriteJournal):
                if self.journal is not None:
                    self.journal.write_all()
                    await self.journal.persist_held()
            else:
                self._do(command)

    def _do(self, command: Command) -> None:
        """Carry out one command that waits for nothing."""
        match command:
            case Follow(address, epoch):
                self.follower.follow(address, self.follower.epoch if epoch is None else epoch)
            case ApplyInTurn(control):
                self._changes.put_nowait(control)
            case CommitInSync(in_sync_ids):
                if self.replicas is not None:
                    self.replicas.commit(in_sync_ids)
            case StopServingSlaves():
                if self.replicas is not None:
                    self.follower.learn_confirmed(self.replicas.confirmed_offset())
                    self.replicas.close()
                    self.replicas = None
            case HoldUnjournaled():
                if self.journal is not None:
                    self.journal.hold_unjournaled()
            case HoldOffQueueLocks():
                self.queue_locks.hold_off()
            case TookUp():
                took_up, self._took_up = self._took_up, asyncio.Event()
                took_up.set()
            case Announce():
                self.on_change()
            case Log(message):
                log.info("%s", message)
            case BecomeWriter() | WriteJournal():
                raise AssertionError(f"{command} waits; it runs through _execute")
            case _:
                assert_never(command)

    async def _become_writer(self, command: BecomeWriter) -> None:
        await asyncio.to_thread(self._store.become_writer)
        if self.journal is not None:
            self.journal.apply()
        end = self._store.commitlog.write_offset
        if command.begins_epoch:
            self.history.begin(command.epoch, end)
        config = self.config
        self.replicas = ReplicaSet(
            self.log,
            self.history,
            self_id=config.broker_id,
            epoch=command.epoch,
            min_in_sync=config.min_in_sync_replicas if self.sync else 1,
            max_lag_s=config.replica_lag_max_ms / 1e3,
            on_confirmed=lambda: self.on_confirmed(),
            controlled=self.controlled,
            in_sync=command.in_sync_ids,
            slow_s=config.replica_slow_ms / 1e3,
            rejoin_s=config.replica_lag_max_ms / 1e3,
            on_in_sync_change=lambda: self.on_change(),
        )
        recovery = self._store.recovery
        crashed = recovery is not None and recovery.crashed
        await self._execute(self.machine.on_caught_up(command.epoch, end, crashed=crashed))

    # --- views --------------------------------------------------------------------------

    @property
    def verified(self) -> bool:
        """Whether this broker's log is checked and whole since it started (see log_check)."""
        return self.check is None or self.check.verified

    def readable_end(self) -> int | None:
        """The commitlog offset consumers may read up to, None for no limit (see
        :meth:`RoleMachine.readable_end`)."""
        replicas = self.replicas
        check = self.check
        return self.machine.readable_end(
            replicas.confirmed_offset() if replicas is not None else None,
            self.follower.confirmed,
            check.checked_to if check is not None and not check.done else None,
        )

    def in_sync_ids(self) -> tuple[int, ...]:
        """Master: its own view of the in-sync set."""
        if self.replicas is None:
            return ()
        return tuple(sorted(self.replicas.in_sync()))

    def electable_ids(self) -> tuple[int, ...]:
        """Master: the in-sync set the controller committed (who could be elected)."""
        if self.replicas is None:
            return ()
        return tuple(sorted(self.replicas.committed))

    def lag_seconds(self) -> dict[int, float]:
        """Master: seconds each slave is behind (see ReplicaSet.lag_seconds); else empty."""
        return self.replicas.lag_seconds() if self.replicas is not None else {}

    def replica_count(self) -> int:
        """Master: itself and every slave that fetched (or was in sync) this term; else 0."""
        return 1 + len(self.replicas.slaves) if self.replicas is not None else 0

    def lag_bytes(self) -> dict[int, int]:
        """Master: bytes each slave is behind. Slave: {own id: bytes behind the master}."""
        if self.replicas is not None:
            return self.replicas.lag()
        return {self.config.broker_id: self.follower.lag_bytes}


def _fetch_answerer(responder: Responder, request_id: int) -> Answer:
    def answer(response: ReplicaFetchResponse, payload: Buffer) -> None:
        responder.respond(
            encode_frame(
                FrameType.REPLICA_FETCH,
                request_id,
                response.SerializeToString(),
                payload,
                FLAG_RESPONSE,
            )
        )

    return answer


def open_group_role(
    config: BrokerConfig,
    store: MessageStore,
    durability: AsyncDurability,
    secret: ClusterSecret | None = None,
    *,
    data_address: str,
    dial_tls: ssl.SSLContext | None = None,
) -> GroupRole:
    """This broker's GroupRole: the epoch history (cut back to the log's end) and, under a
    controller, the confirmed mark read from the data directory; slaves dial their master
    over the data plane (TLS with ``dial_tls``), and a controlled broker checks its log
    since this start."""
    identity = SlaveIdentity(config.broker_name, config.broker_id, data_address, secret)

    async def connect(address: str) -> DataPlaneChannel:
        return await DataPlaneChannel.open(address, identity=identity, ssl=dial_tls)

    history = EpochHistory(config.data_dir / "epochs.json")
    history.trim_to(store.commitlog.write_offset)
    role = GroupRole(
        config,
        store,
        StoreLog(store, durability),
        history,
        gate=ReplicaGate(secret, config.broker_name, data_address),
        connect=connect,
        mark=ConfirmedMark(config.data_dir) if config.controlled else None,
    )
    if config.controlled:
        role.check = LogCheck(
            store,
            history,
            broker_name=config.broker_name,
            broker_id=config.broker_id,
            data_address=data_address,
            master=lambda: (role.master_address if role.role is Role.SLAVE else "", role.epoch),
            on_progress=lambda: role.on_confirmed(),
            on_verified=lambda: role.on_change(),
            secret=secret,
            dial_tls=dial_tls,
        )
    return role
