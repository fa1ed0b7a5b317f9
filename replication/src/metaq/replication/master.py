"""The master's side of replication: serving slaves' fetches and waiting for their copies.

Slaves pull (as Kafka followers do): each keeps one REPLICA_FETCH in flight asking for the
log from where its own ends, and that offset, with the ``acked_offset`` it reports, is all
the master learns of a slave, and only once the slave's epoch history agrees with the
master's up to that offset: before that it may hold an old master's tail. A fetch
finding nothing new is parked until the next append or its ``wait_ms``, so a slave gets
new bytes one hop after they are written.

In-sync set: a slave is in sync while it has been caught up (asked for the log from the
end the master had when it last answered it) within ``max_lag_s``; a slave the controller
kept in sync across the election counts as caught up when the term began. The group's
electable set is the controller's committed copy of this set; the master reports its own
and the controller commits changes.

Slow members: a slave that, over a window of ``slow_s``, held back sends which
``min_in_sync`` copies already held (each by more than ``slow_s / 10``) for half the
window or more leaves this master's in-sync set (if enough copies stay in sync without
it, and another slave stays in sync), and the master
re-announces at once so the controller commits the smaller set; sends then stop waiting
for it. It counts as in sync again only after it
has been caught up at every fetch for ``rejoin_s``, so a slave slower than the writes
does not flap in and out. A slave that gates every write never lags by the
``max_lag_s`` rule (the writes wait for it, so it keeps catching up): this is the rule
that takes it out.

Sync replication: a send is answered once every slave that is in sync, here or in the
committed set, holds it. Counting the committed members too means a slave the master
dropped keeps being waited for until the controller has agreed to drop it, so the
controller never elects a slave lacking an acknowledged message. Under a controller, a
slave the master has seen in sync counts as well until the next commit: the controller
may already have committed it in while that commit is still on its way here (a master
paused right then finds the slave lagging on waking, though it was promoted). With fewer than
``min_in_sync`` copies in sync, writes are refused up front, and a write already waiting
is never confirmed with fewer copies than that.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Final

from metaq.common.errors import EpochMismatch, InvalidMessage, NotEnoughReplicas
from metaq.common.framing import Buffer
from metaq.common.v1.data_pb2 import EpochEntry, ReplicaFetchRequest, ReplicaFetchResponse
from metaq.replication.epochs import Epoch, EpochHistory, divergence
from metaq.replication.log import ReplicaLog

log = logging.getLogger(__name__)

Clock = Callable[[], float]

NO_CONNECTION: Final = -1
"""A slave's connection before its first fetch in this term."""

CONFIRMED_NOTICE_S: Final = 0.01
"""How long a confirmed offset that moved waits to reach slaves whose fetch is parked.
An append within that time carries it with its bytes; after the last one of a burst, the
slaves' reads trail the master's by about this much, not by a parked fetch's wait.

A slave answered within this time is not told yet: in a run of sends one at a time each
answer carries the offset the send before confirmed, and an empty answer in between
would leave the link busy with its round trip when the next send's bytes are due (they
then wait for it). The notice goes to it this long after its last answer instead."""


class _Wait:
    """One caller waiting for the slaves' copies of an offset, answered once."""

    __slots__ = ("done", "finished", "quorum_at", "timer")

    def __init__(self, done: Callable[[bool], None]) -> None:
        self.done = done
        self.timer: asyncio.TimerHandle | None = None
        self.finished = False
        self.quorum_at: float | None = None
        """When ``min_in_sync`` copies first held its offset (this master's clock)."""

    def finish(self, replicated: bool) -> None:
        if not self.finished:
            self.finished = True
            if self.timer is not None:
                self.timer.cancel()
            self.done(replicated)


Answer = Callable[[ReplicaFetchResponse, Buffer], None]
"""Takes the answer to one fetch: writes it to the slave."""


class _Parked:
    """A slave's fetch waiting for new bytes: its request, who answers it, its timeout."""

    __slots__ = ("answer", "request", "timer")

    def __init__(self, request: ReplicaFetchRequest, answer: Answer) -> None:
        self.request = request
        self.answer = answer
        self.timer: asyncio.TimerHandle | None = None


@dataclass(slots=True)
class SlaveState:
    broker_id: int
    offset: int = 0
    """Where its log ends, as of its last fetch."""
    acked: int = 0
    """How far it holds the log, as of its last fetch."""
    caught_up: float = -1e18
    """When it last held everything the master had (monotonic seconds)."""
    answered_end: int = 0
    answered_at: float = 0.0
    answered_confirmed: int = 0
    """The confirmed offset its last answer carried."""
    fetched_at: float = -1e18
    """When it last asked this master for the log (monotonic seconds)."""
    connection: int = NO_CONNECTION
    slow: bool = False
    """Taken out of the in-sync set for holding back sends a quorum already held."""
    steady_since: float | None = None
    """While slow: since when every fetch found it caught up."""
    held_back: float = 0.0
    """Seconds this window that sends a quorum held waited for it alone, by more than
    ``slow_s / 10`` each."""
    held_until: float = -1e18
    """The end of the last stretch counted in ``held_back`` (stretches never overlap)."""
    parked: _Parked | None = field(default=None, repr=False)
    """Its fetch that found nothing new, until the next append or its ``wait_ms``."""


class ReplicaSet:
    """The slaves of one master, in one epoch: a new ReplicaSet per term as master.

    ``in_sync`` is the set the controller made this term with: the slaves in sync when
    the previous master stopped. They start in sync here, not at the first fetch: a
    send then needs no round trip of theirs to be admitted (only their copies to be
    confirmed), and they stay electable while this master reports its view. Until their
    first fetch says how far they hold the log, consumers read nothing here: this
    master's log may run past theirs, and one of them may be elected next.
    """

    def __init__(
        self,
        replica_log: ReplicaLog,
        history: EpochHistory,
        *,
        self_id: int,
        epoch: int,
        min_in_sync: int = 1,
        max_lag_s: float = 3.0,
        max_fetch_bytes: int = 4 << 20,
        clock: Clock = time.monotonic,
        on_confirmed: Callable[[], None] | None = None,
        controlled: bool = False,
        in_sync: Iterable[int] = (),
        slow_s: float = 0.5,
        rejoin_s: float = 5.0,
        on_in_sync_change: Callable[[], None] | None = None,
    ) -> None:
        self.log = replica_log
        self.history = history
        self.self_id = self_id
        self.epoch = epoch
        self.min_in_sync = min_in_sync
        self.max_lag_s = max_lag_s
        self.max_fetch_bytes = max_fetch_bytes
        self._clock = clock
        self.slaves: dict[int, SlaveState] = {}
        self.committed: frozenset[int] = frozenset(in_sync) | {self_id}
        """The controller's in-sync set (everyone local when there is no controller)."""
        now = clock()
        self._term_started = now
        for broker_id in sorted(self.committed - {self_id}):
            # In sync when the controller made this term: each holds every acknowledged
            # record, so it stays in sync (counted for writes, waited for, electable)
            # as if caught up now, until max_lag_s says otherwise.
            self.slaves[broker_id] = SlaveState(broker_id, caught_up=now)
        self._controlled = controlled
        self._seen_in_sync: set[int] = set()
        """Under a controller: slaves seen in sync since its last commit."""
        self._on_confirmed = on_confirmed
        self._confirmed = 0
        self._notice: asyncio.TimerHandle | None = None
        self.slow_s = slow_s
        self.rejoin_s = rejoin_s
        self._on_in_sync_change = on_in_sync_change
        self._slow_check: asyncio.TimerHandle | None = None
        self._window_start = 0.0
        self._waits: list[tuple[int, int, _Wait]] = []
        self._order = itertools.count()
        self.closed = False

    # --- fetches ------------------------------------------------------------------------

    def serve_fetch(
        self, request: ReplicaFetchRequest, answer: Answer, connection: int = 0
    ) -> None:
        """Answer one fetch through ``answer``: bytes from the slave's end at once, or,
        with none there, parked until the next append or its ``wait_ms``. Raises a
        MetaqError for a fetch this master refuses, answering nothing.

        A parked fetch is answered inside :meth:`appended`, in the append's own loop
        turn: a sync-replicated send waits for the slave's copy, so its bytes leave
        before the master indexes them, with no task, future or timeout per fetch.

        ``connection`` tells the slave's connections apart: a slave that comes back on a
        new one (it restarted, or lost its link) is out of sync until it has caught up
        again, whatever it was before. Its first connection to this master keeps what
        the term started with (see the class).
        """
        if self.closed:
            raise EpochMismatch(
                f"broker {self.self_id} no longer serves epoch {self.epoch} as master"
            )
        if request.epoch > self.epoch:
            raise EpochMismatch(
                f"this master is at epoch {self.epoch} but the slave knows epoch "
                f"{request.epoch}: this broker was replaced; follow the new master"
            )
        if request.segment_bytes != self.log.segment_bytes:
            raise InvalidMessage(
                f"slave {request.broker_id} uses {request.segment_bytes}-byte commitlog "
                f"segments, this master {self.log.segment_bytes}: set "
                "store.commitlog_segment_bytes alike on every broker of the group"
            )
        if request.broker_id == self.self_id:
            raise InvalidMessage(f"slave reports broker id {request.broker_id}, the master's own")
        if request.repair:
            answer(*self._repair_copy(request))
            return
        now = self._clock()
        slave = self.slaves.get(request.broker_id)
        if slave is None:
            slave = self.slaves[request.broker_id] = SlaveState(request.broker_id)
        if slave.connection != connection:
            if slave.connection != NO_CONNECTION:
                slave.caught_up = -1e18
            slave.connection = connection
            log.info("slave %d fetches from offset %d", request.broker_id, request.offset)
        end = self.log.end_offset
        theirs = [Epoch(e.epoch, e.start_offset) for e in request.epochs]
        agreed = divergence(theirs, request.offset, self.history.entries, end) == request.offset
        if agreed:
            slave.fetched_at = now
            self._note(slave, request, now)
            if request.offset == end and request.wait_ms and not self.closed:
                self._park(slave, _Parked(request, answer), request.wait_ms / 1e3)
                return
        answer(*self._answer(slave, request, agreed))

    async def fetch(
        self, request: ReplicaFetchRequest, connection: int = 0
    ) -> tuple[ReplicaFetchResponse, Buffer]:
        """:meth:`serve_fetch`, awaited (an in-process channel)."""
        answered: asyncio.Future[tuple[ReplicaFetchResponse, Buffer]]
        answered = asyncio.get_running_loop().create_future()

        def answer(response: ReplicaFetchResponse, payload: Buffer) -> None:
            if not answered.done():
                answered.set_result((response, payload))

        self.serve_fetch(request, answer, connection)
        return await answered

    def _answer(
        self, slave: SlaveState, request: ReplicaFetchRequest, agreed: bool
    ) -> tuple[ReplicaFetchResponse, Buffer]:
        end = self.log.end_offset
        payload: Buffer = b""
        if agreed and self.log.min_offset <= request.offset < end:
            payload = self.log.read(request.offset, min(request.max_bytes, self.max_fetch_bytes))
        slave.answered_end = end
        slave.answered_at = self._clock()
        slave.answered_confirmed = self._confirmed
        return self._response(request.offset), payload

    def _repair_copy(self, request: ReplicaFetchRequest) -> tuple[ReplicaFetchResponse, Buffer]:
        """This master's bytes for a slave's damaged record, answered at once.

        Only where the two epoch histories agree past the record are the bytes at that
        offset the same record; otherwise the answer is empty. The slave's progress and
        in-sync state are left alone: a repair says nothing of where its log ends.
        """
        end = self.log.end_offset
        stop = request.offset + request.max_bytes
        theirs = [Epoch(e.epoch, e.start_offset) for e in request.epochs]
        payload: Buffer = b""
        if (
            self.log.min_offset <= request.offset
            and stop <= end
            and divergence(theirs, stop, self.history.entries, end) == stop
        ):
            payload = self.log.read(request.offset, min(request.max_bytes, self.max_fetch_bytes))
        return self._response(request.offset), payload

    def _response(self, offset: int) -> ReplicaFetchResponse:
        return ReplicaFetchResponse(
            epoch=self.epoch,
            offset=offset,
            master_end=self.log.end_offset,
            epochs=[EpochEntry(epoch=e.epoch, start_offset=e.start_offset)
                    for e in self.history.entries],
            min_offset=self.log.min_offset,
            confirmed_offset=self._confirmed,
        )  # fmt: skip

    def _note(self, slave: SlaveState, request: ReplicaFetchRequest, now: float) -> None:
        slave.offset = request.offset
        slave.acked = min(request.acked_offset, request.offset)
        if slave.slow:
            if request.offset < self.log.end_offset:
                slave.steady_since = None
            elif slave.steady_since is None:
                slave.steady_since = now
            elif now - slave.steady_since >= self.rejoin_s:
                slave.slow = False
                slave.steady_since = None
                log.info("slave %d kept up for %.1f s: in sync again", slave.broker_id,
                         self.rejoin_s)  # fmt: skip
                self._in_sync_changed()
        if request.offset >= self.log.end_offset:
            slave.caught_up = now
        elif slave.answered_end and request.offset >= slave.answered_end:
            # It holds all the master had when last answered: caught up as of then.
            slave.caught_up = max(slave.caught_up, slave.answered_at)
        if self._controlled and now - slave.caught_up <= self.max_lag_s and not slave.slow:
            self._seen_in_sync.add(slave.broker_id)
        self._settle(slave, now)
        self._confirm()

    def _park(self, slave: SlaveState, parked: _Parked, timeout_s: float) -> None:
        if slave.parked is not None:
            # One fetch in flight per slave: one still parked came on a connection it
            # has left; answered now, it is dropped with that connection.
            self._release(slave, slave.parked)
        slave.parked = parked
        parked.timer = asyncio.get_running_loop().call_later(
            timeout_s, self._release, slave, parked
        )
        if slave.answered_confirmed < self._confirmed:
            # A notice that found this fetch still on its way told it nothing.
            self._notice_in(CONFIRMED_NOTICE_S)

    def _release(self, slave: SlaveState, parked: _Parked) -> None:
        if slave.parked is not parked:
            return
        slave.parked = None
        if parked.timer is not None:
            parked.timer.cancel()
        parked.answer(*self._answer(slave, parked.request, True))

    def appended(self) -> None:
        """New bytes are in the log: answer the parked fetches with them, now."""
        for slave in self.slaves.values():
            if slave.parked is not None:
                try:
                    self._release(slave, slave.parked)
                except Exception:
                    # Not the append's failure: the bytes are stored, and the caller's
                    # send must not be refused for them. The slave fetches again once its
                    # own wait for this answer runs out.
                    log.exception("answering slave %d's fetch failed", slave.broker_id)

    # --- in-sync set --------------------------------------------------------------------

    def in_sync(self) -> frozenset[int]:
        """This master's view of its in-sync set, itself included."""
        now = self._clock()
        ids = {
            s.broker_id
            for s in self.slaves.values()
            if now - s.caught_up <= self.max_lag_s and not s.slow
        }
        return frozenset(ids | {self.self_id})

    def commit(self, in_sync: Iterable[int]) -> None:
        """The controller committed this in-sync set."""
        self.committed = frozenset(in_sync) | {self.self_id}
        self._seen_in_sync = set(self.in_sync() - {self.self_id})
        self._settle()
        self._confirm()

    def check_writable(self) -> None:
        """Refuse a sync-replicated write that cannot reach ``min_in_sync`` copies."""
        in_sync = self.in_sync()
        if len(in_sync) < self.min_in_sync:
            slaves = sorted(in_sync - {self.self_id})
            raise NotEnoughReplicas(
                f"sync replication needs {self.min_in_sync} in-sync copies of the log but "
                f"{len(in_sync)} are in sync (the master's, and slaves {slaves}); nothing "
                "was stored. Retry once a slave has caught up (min_in_sync_replicas sets "
                "how many copies a send needs)"
            )

    def followed_within(self, seconds: float) -> bool:
        """Whether every slave that could be elected (in sync by either view) asked this
        master for the log within ``seconds``: none of them has been promoted, since a
        promoted slave stops copying at once."""
        now = self._clock()
        required = self._required()
        return bool(required) and all(
            i in self.slaves and now - self.slaves[i].fetched_at <= seconds for i in required
        )

    # --- what consumers may read ---------------------------------------------------------

    def confirmed_offset(self) -> int:
        """How far every slave that could be elected (in sync by either view) holds the
        log; all of it with no such slave. Consumers read no further (Kafka's high
        watermark): a record past it may be cut by a failover and its queue offset reused
        by another message, which a consumer that had read the first would skip."""
        offset = self.log.end_offset
        if not self.slaves and len(self.committed) == 1:
            return offset  # no slave at all (committed always holds this master)
        for broker_id in self._required():
            slave = self.slaves.get(broker_id)
            offset = min(offset, slave.acked if slave is not None else 0)
        return offset

    def _confirm(self) -> None:
        confirmed = self.confirmed_offset()
        if confirmed > self._confirmed:
            self._confirmed = confirmed
            if self._on_confirmed is not None:
                self._on_confirmed()
            self._notice_in(CONFIRMED_NOTICE_S)

    def _notice_in(self, delay_s: float) -> None:
        if self._notice is None and not self.closed:
            self._notice = asyncio.get_running_loop().call_later(delay_s, self._tell_confirmed)

    def _tell_confirmed(self) -> None:
        """Answer the parked fetches whose last answer carried an older confirmed offset
        (slaves serve consumers only what the master confirmed, see Follower.confirmed),
        unless that answer went out within CONFIRMED_NOTICE_S: then later."""
        self._notice = None
        now = self._clock()
        due = None
        for slave in self.slaves.values():
            parked = slave.parked
            if parked is None or slave.answered_confirmed >= self._confirmed:
                continue
            at = slave.answered_at + CONFIRMED_NOTICE_S
            if at > now:
                due = at if due is None else min(due, at)
            else:
                self._release(slave, parked)
        if due is not None:
            self._notice_in(due - now)

    # --- sync replication ---------------------------------------------------------------

    def electable(self) -> frozenset[int]:
        """Who the controller could elect, as far as this master can tell: in sync by its
        own view or the controller's, or seen in sync since the controller's last commit;
        itself included."""
        return self.in_sync() | self.committed | self._seen_in_sync

    def _required(self) -> Collection[int]:
        return self.electable() - {self.self_id}

    def replicated(self, offset: int) -> bool:
        """Whether every slave that must hold ``offset`` does, and they and the master
        make at least ``min_in_sync`` copies. A send admitted while a slave was in sync
        is not confirmed by that slave dropping out of both views: it then has fewer
        copies than it was promised (it times out as FLUSH_SLAVE_TIMEOUT instead)."""
        required = self._required()
        if 1 + len(required) < self.min_in_sync:
            return False
        for broker_id in required:
            slave = self.slaves.get(broker_id)
            if slave is None or slave.acked < offset:
                return False
        return True

    async def wait_replicated(self, offset: int, timeout_s: float) -> bool:
        """True once every required slave holds the log up to ``offset``; False on timeout."""
        if self.replicated(offset):
            return True
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def done(replicated: bool) -> None:
            if not future.done():
                future.set_result(replicated)

        self.when_replicated(offset, timeout_s, done)
        return await future

    def when_replicated(self, offset: int, timeout_s: float, done: Callable[[bool], None]) -> None:
        """Call ``done(True)`` once every required slave holds the log up to ``offset``
        (at once if they do), ``done(False)`` after ``timeout_s`` or when this term ends.

        ``done`` runs inside the handling of the slave's fetch that acknowledged the
        offset, so the send waiting on it is answered in that same loop turn, with no
        task or future of its own to wake.
        """
        if self.replicated(offset):
            done(True)
            return
        wait = _Wait(done)
        wait.timer = asyncio.get_running_loop().call_later(timeout_s, wait.finish, False)
        heapq.heappush(self._waits, (offset, next(self._order), wait))

    def _settle(self, acking: SlaveState | None = None, now: float = 0.0) -> None:
        """Answer the waits now replicated; ``acking``, whose fetch (at ``now``) got them
        there, is charged the time they waited for it after a quorum held them."""
        waits = self._waits
        while waits:
            offset, _, wait = waits[0]
            if not wait.finished and not self.replicated(offset):
                break
            heapq.heappop(waits)
            if acking is not None and wait.quorum_at is not None and not wait.finished:
                self._charge(acking, wait.quorum_at, now)
            wait.finish(True)
        if waits:
            self._watch_slow(waits[0][0], waits[0][2])

    # --- slow members -------------------------------------------------------------------

    def _copies(self, offset: int) -> int:
        """This master's copy and every connected slave's that holds ``offset``."""
        return 1 + sum(1 for s in self.slaves.values() if s.acked >= offset)

    def _charge(self, slave: SlaveState, quorum_at: float, now: float) -> None:
        if now - quorum_at >= self.slow_s / 10:
            held = now - max(quorum_at, slave.held_until)
            if held > 0:
                slave.held_back += held
                slave.held_until = now

    def _watch_slow(self, offset: int, wait: _Wait) -> None:
        """The oldest waiting send: note when a quorum held it, and make sure a window's
        end will look at who held sends back. Kept light: it runs on every acknowledgement."""
        if wait.quorum_at is None:
            if self._copies(offset) < self.min_in_sync:
                return
            wait.quorum_at = self._clock()
        if self._slow_check is None and not self.closed:
            now = self._clock()
            self._window_start = now
            self._slow_check = asyncio.get_running_loop().call_later(self.slow_s, self._check_slow)

    def _check_slow(self) -> None:
        """A window's end: a required slave that held back sends for half of it is slow."""
        self._slow_check = None
        if self.closed:
            return
        now = self._clock()
        if self._waits:  # the oldest send, still waiting: charge whoever it waits for
            offset, _, wait = self._waits[0]
            if wait.quorum_at is not None:
                for broker_id in self._required():
                    slave = self.slaves.get(broker_id)
                    if slave is not None and slave.acked < offset:
                        self._charge(slave, wait.quorum_at, now)
        elapsed = max(now - self._window_start, 1e-9)
        in_sync = self.in_sync()
        required = self._required()
        for slave in self.slaves.values():
            held, slave.held_back = slave.held_back, 0.0
            if (
                held / elapsed >= 0.5
                and not slave.slow
                and slave.broker_id in required
                # Never the last slave in sync (slow beats no one to elect), nor one
                # needed for min_in_sync copies (slow beats refused).
                and len(in_sync - {slave.broker_id}) >= max(2, self.min_in_sync)
            ):
                slave.slow = True
                slave.steady_since = None
                in_sync = in_sync - {slave.broker_id}
                log.warning(
                    "slave %d held back sends that %d copies held for %.0f%% of %.1f s: out "
                    "of the in-sync set until it keeps up for %.1f s", slave.broker_id,
                    self.min_in_sync, 100 * held / elapsed, elapsed, self.rejoin_s,
                )  # fmt: skip
                self._in_sync_changed()
        self._settle()

    def _in_sync_changed(self) -> None:
        # A slow slave stays waited for while the controller may still count it in sync
        # (committed, or seen in sync since its last commit): it may be elected until the
        # controller has agreed it is out, which this re-announcement asks for.
        if self._on_in_sync_change is not None:
            self._on_in_sync_change()

    def close(self) -> None:
        """No longer master: wake everyone; pending waits fail."""
        self.closed = True
        if self._notice is not None:
            self._notice.cancel()
            self._notice = None
        if self._slow_check is not None:
            self._slow_check.cancel()
            self._slow_check = None
        self.appended()
        waits, self._waits = self._waits, []
        for _, _, wait in waits:
            wait.finish(False)

    def lag_seconds(self) -> dict[int, float]:
        """Seconds since each connected slave last held all of this master's log (0 when
        it does as of its last fetch); one never caught up counts from this term's start."""
        now = self._clock()
        end = self.log.end_offset
        return {
            i: 0.0 if s.offset >= end else now - max(s.caught_up, self._term_started)
            for i, s in sorted(self.slaves.items())
            if s.connection != NO_CONNECTION
        }

    def lag(self) -> dict[int, int]:
        """Bytes each slave is behind this master's log end."""
        end = self.log.end_offset
        return {
            i: max(0, end - s.offset)
            for i, s in sorted(self.slaves.items())
            if s.connection != NO_CONNECTION
        }
