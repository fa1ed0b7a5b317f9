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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Iterable
from typing import Final

from metaq.broker.config import BrokerConfig
from metaq.broker.confirmed_mark import ConfirmedMark
from metaq.broker.connection import Responder
from metaq.broker.journal import Journal
from metaq.broker.log_check import LogCheck
from metaq.broker.queue_locks import QueueLocks
from metaq.broker.replica_auth import ReplicaGate
from metaq.broker.replica_log import StoreLog
from metaq.broker.store import MessageStore
from metaq.broker.store.flush import AsyncDurability
from metaq.common.auth import ClusterSecret
from metaq.common.errors import MetaqError, NotEnoughReplicas, NotMaster
from metaq.common.framing import FLAG_RESPONSE, Buffer, Frame, FrameType, encode_error, encode_frame
from metaq.common.model import ReplicationMode, Role
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
    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        durability: AsyncDurability,
        secret: ClusterSecret | None = None,
        *,
        data_address: str,
        dial_tls: ssl.SSLContext | None = None,
    ) -> None:
        self.config = config
        self._dial_tls = dial_tls
        """How this broker, as a slave, dials its master (None: plain)."""
        self.gate = ReplicaGate(secret, config.broker_name, data_address)
        """As master: which connections' slaves proved the cluster secret."""
        self._identity = SlaveIdentity(config.broker_name, config.broker_id, data_address, secret)
        self._store = store
        self.log = StoreLog(store, durability)
        self.history = EpochHistory(config.data_dir / "epochs.json")
        self.history.trim_to(store.commitlog.write_offset)
        self.epoch = self.history.last_epoch
        self.controlled = config.controlled
        self.sync = config.replication_mode is ReplicationMode.SYNC
        self.role = Role.MASTER if config.is_master and not self.controlled else Role.SLAVE
        self.replicas: ReplicaSet | None = None
        self.master_address = ""
        self.follower = Follower(
            self.log,
            self.history,
            self.connect,
            broker_name=config.broker_name,
            broker_id=config.broker_id,
            epoch=self.epoch,
            on_confirmed=self._follower_confirmed,
        )
        self._mark: ConfirmedMark | None = None
        """Under a controller: the confirmed offset kept on disk across restarts."""
        if self.controlled:
            self._mark = ConfirmedMark(config.data_dir)
            self.follower.confirmed = min(self._mark.offset, store.commitlog.write_offset)
        self.on_change: Callable[[], None] = lambda: None
        """Called after every change of role or epoch (the registrar re-announces)."""
        self.on_confirmed: Callable[[], None] = lambda: None
        """Called when the slaves' copies let consumers read further (parked pulls)."""
        self.journal: Journal | None = None
        """Applied to the end before a promotion; written in full after it."""
        self.queue_locks = QueueLocks(config.queue_lock_ttl_ms / 1e3)
        self._followed = False
        """Ordered consumers' locks; granted by the master only."""
        self._fenced_until = 0.0
        self._handover_to = -1
        self._lease_s = config.master_lease_ms / 1e3
        self._lease_until = 0.0
        self._changes: asyncio.Queue[pb.GroupControl] = asyncio.Queue()
        self._took_up = asyncio.Event()
        """Set (and replaced) whenever this broker has taken up a role in a new epoch."""
        self._worker: asyncio.Task[None] | None = None
        self._fetches: set[asyncio.Task[None]] = set()
        self.check: LogCheck | None = None
        """A controlled broker's check of its log since this start (see log_check)."""
        if self.controlled:
            self.check = LogCheck(
                store,
                self.history,
                broker_name=config.broker_name,
                broker_id=config.broker_id,
                data_address=data_address,
                master=lambda: (self.master_address if self.role is Role.SLAVE else "", self.epoch),
                on_progress=lambda: self.on_confirmed(),
                on_verified=lambda: self.on_change(),
                secret=secret,
                dial_tls=dial_tls,
            )

    async def connect(self, address: str) -> DataPlaneChannel:
        """A connection to the master at ``address`` as this slave: with a cluster secret
        the master proves it before we take, cut or adopt anything it says, and we prove
        it before it serves us (raises NotAuthenticated otherwise)."""
        return await DataPlaneChannel.open(address, identity=self._identity, ssl=self._dial_tls)

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        if self.check is not None:
            self.check.start()
        self.follower.start()
        if self.role is Role.MASTER:
            await self._become_master(self.epoch)
        self._worker = asyncio.get_running_loop().create_task(self._apply_changes())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
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
        return self.role is Role.SLAVE

    def check_writable(self) -> None:
        """Raise unless this broker may take a client's write now."""
        replicas = self._check_master()
        if self.sync:
            replicas.check_writable()

    def _check_master(self) -> ReplicaSet:
        replicas = self.replicas
        if self.role is not Role.MASTER or replicas is None:
            where = f"; its master is {self.master_address}" if self.master_address else ""
            raise NotMaster(
                f"broker {self.config.broker_name} (id {self.config.broker_id}) is not the "
                f"master of its group (epoch {self.epoch}){where}; send to the master",
                self.master_address,
            )
        now = time.monotonic()
        if (
            self.controlled
            and now > self._lease_until
            and self._needs_lease(replicas)
            and not (self.sync and replicas.followed_within(self._lease_s))
        ):
            raise NotMaster(
                f"broker {self.config.broker_name} has not heard the controller confirm it "
                f"as master for {self.config.master_lease_ms} ms (nameservers unreachable, "
                "or this process was paused); not taking writes until it does, as a slave "
                "may have been promoted meanwhile"
            )
        if now < self._fenced_until:
            raise NotMaster(
                f"broker {self.config.broker_name} is handing its master role to broker "
                f"{self._handover_to}; retry in a moment"
            )
        return replicas

    def _needs_lease(self, replicas: ReplicaSet) -> bool:
        """Only a master someone else could replace must stop when cut off: with no
        other broker electable (:meth:`ReplicaSet.electable`), none can be elected.

        Under sync replication the slaves' fetches stand in for the controller: a send is
        acknowledged only once every slave that could be elected holds it, and one that
        is still copying from this master has not been promoted, so while all of them
        fetched within the lease this master goes on taking writes even with every
        nameserver down (see :meth:`_check_master`)."""
        return len(replicas.electable()) > 1

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
        self._handover_to = target
        self._fenced_until = time.monotonic() + fence_s
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
        self._fenced_until = 0.0

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
        task = asyncio.get_running_loop().create_task(
            self._answer_when_taken_up(responder, frame.request_id, request, answer)
        )
        self._fetches.add(task)
        task.add_done_callback(self._fetches.discard)

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

    def _took_up_epoch(self) -> None:
        took_up, self._took_up = self._took_up, asyncio.Event()
        took_up.set()

    # --- what the nameservers say -------------------------------------------------------

    def on_answer(self, registered: pb.RegisterBrokerResponse, sent_at: float | None) -> None:
        """Every event from every nameserver comes here (answers and pushed news);
        ``sent_at`` is when the heartbeat it answers was sent (None for news)."""
        if self.controlled:
            if registered.HasField("control"):
                control = registered.control
                if (
                    sent_at is not None
                    and registered.lease_granted
                    and control.master_id == self.config.broker_id
                    and control.epoch >= self.epoch
                ):
                    # The controller's leader still had us as master when that heartbeat
                    # left. Another nameserver's word is not enough: it may be cut off
                    # from the Raft majority that has elected someone else meanwhile.
                    self._lease_until = max(self._lease_until, sent_at + self._lease_s)
                self._changes.put_nowait(control)
        elif self.role is Role.SLAVE and registered.master_data_address:
            self.master_address = registered.master_data_address
            self._followed = True
            self.follower.follow(registered.master_data_address, self.follower.epoch)

    async def _apply_changes(self) -> None:
        while True:
            control = await self._changes.get()
            try:
                await self._apply(control)
            except Exception:
                log.exception("applying the controller's decision %s failed", control)

    async def _apply(self, control: pb.GroupControl) -> None:
        if control.epoch < self.epoch:
            return  # a nameserver that has not heard of the latest election yet
        me = self.config.broker_id
        if control.master_id == me:
            if self.role is not Role.MASTER or control.epoch != self.epoch:
                await self._become_master(control.epoch, control.in_sync_ids)
            if self.replicas is not None:
                self.replicas.commit(control.in_sync_ids)
            return
        address = control.master_data_address
        if (
            self.role is Role.MASTER
            or control.epoch != self.epoch
            or (address and address != self.master_address)
        ):
            self._become_slave(control.epoch, address or self.master_address)

    async def _become_master(self, epoch: int, in_sync_ids: Iterable[int] = ()) -> None:
        """Take writes in ``epoch``; ``in_sync_ids`` are the slaves the controller kept
        in sync across the election, in sync here from the start."""
        self.follower.follow("", epoch)  # no more copying: our log is the log now
        await asyncio.to_thread(self._store.become_writer)
        if self.journal is not None:
            self.journal.apply()
        end = self._store.commitlog.write_offset
        if epoch:
            self.history.begin(epoch, end)
        self.epoch = epoch
        config = self.config
        self._fenced_until = 0.0
        self.replicas = ReplicaSet(
            self.log,
            self.history,
            self_id=config.broker_id,
            epoch=epoch,
            min_in_sync=config.min_in_sync_replicas if self.sync else 1,
            max_lag_s=config.replica_lag_max_ms / 1e3,
            on_confirmed=lambda: self.on_confirmed(),
            controlled=self.controlled,
            in_sync=in_sync_ids,
            slow_s=config.replica_slow_ms / 1e3,
            rejoin_s=config.replica_lag_max_ms / 1e3,
            on_in_sync_change=lambda: self.on_change(),
        )
        self.master_address = ""
        recovery = self._store.recovery
        if self._followed or (recovery is not None and recovery.crashed):
            # Another master, or this one before its crash, may have granted queue locks
            # whose holders still process; let those lapse first.
            self.queue_locks.hold_off()
        self.role = Role.MASTER
        log.info("master of %s in epoch %d from offset %d", config.broker_name, epoch, end)
        self._took_up_epoch()
        if self.journal is not None:
            # Each term starts with the whole state, for slaves that start from here.
            self.journal.write_all()
            await self.journal.persist_held()
        self.on_change()

    def _become_slave(self, epoch: int, master_address: str) -> None:
        was_master = self.role is Role.MASTER
        self.role = Role.SLAVE
        if self.replicas is not None:
            # Its log may run past what the new master holds (records no slave had, taken
            # while it was paused, say): consumers read no further than they could here as
            # master until the new master confirms more.
            self.follower.learn_confirmed(self.replicas.confirmed_offset())
            self.replicas.close()
            self.replicas = None
        if was_master and self.journal is not None:
            self.journal.hold_unjournaled()
        self.epoch = epoch
        self.master_address = master_address
        self._followed = self._followed or bool(master_address)
        self.follower.follow(master_address, epoch)
        self._took_up_epoch()
        log.info(
            "%s of %s in epoch %d, following %s",
            "demoted to slave" if was_master else "slave",
            self.config.broker_name,
            epoch,
            master_address or "(master not known yet)",
        )
        self.on_change()

    # --- views --------------------------------------------------------------------------

    @property
    def verified(self) -> bool:
        """Whether this broker's log is checked and whole since it started (see log_check)."""
        return self.check is None or self.check.verified

    def readable_end(self) -> int | None:
        """The commitlog offset consumers may read up to, None for no limit: on a master
        what every slave that could be elected holds; on a slave under a controller what
        its master last confirmed (or it did itself as master), since another slave may
        be elected without its tail; and while the log check runs what it has checked.
        A slave without failover is never cut, and reads all it holds."""
        replicas = self.replicas
        limit: int | None = None
        if replicas is not None:
            limit = replicas.confirmed_offset()
        elif self.controlled:
            limit = self.follower.confirmed
        if self.check is not None and not self.check.done:
            limit = self.check.checked_to if limit is None else min(limit, self.check.checked_to)
        return limit

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
