"""The broker's role in its group as a state machine: events in, commands out, no I/O.

:class:`RoleMachine` holds what the broker is (master or slave), in which epoch, whom it
follows, and until when it may take writes (the controller's lease, a switchover's
fence). Each event — the broker starting, a nameserver's answer, the controller's word
on the group, the store caught up as a writer — changes that state and returns the
commands that carry the change out, in order; :class:`~metaq.broker.role.GroupRole`
executes them against the store, the follower, the replica set and the journal. Nothing
here waits, dials, reads a file or a clock: times are passed in, so every transition is
tested in-process (``broker/tests/test_role_machine.py``).

A promotion is two events because the store must become a writer first (every copied
record dispatched, so queue offsets continue the old master's): :meth:`on_control`
stops the copying and asks for that, and only :meth:`on_caught_up`, once it is done,
makes this broker master. A failure between the two leaves the broker a slave, so the
next word from the controller tries again.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol, TypeVar

from metaq.common.errors import NotMaster
from metaq.common.model import GroupControl, Role


@dataclass(frozen=True, slots=True)
class RoleSettings:
    """What the machine needs of the broker's configuration."""

    broker_name: str
    broker_id: int
    controlled: bool
    """Under the nameservers' failover controller (it, not the config, picks the master)."""
    sync: bool
    """Sync replication: a send is answered once the slaves that could be elected hold it."""
    master_lease_ms: int


# --- events -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Heard:
    """One event from one nameserver: an answer to a heartbeat or pushed news."""

    control: GroupControl | None
    """The controller's word, when the answer carries one."""
    lease_granted: bool
    """The controller's leader answered, with this broker as master when the heartbeat left."""
    master_address: str
    """Without a controller: the deployed master's data address ("" if not known)."""
    sent_at: float | None
    """Monotonic time the answered heartbeat left (None for pushed news)."""


# --- commands -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Follow:
    """Point the follower at ``address`` ("": stop copying) in ``epoch``."""

    address: str
    epoch: int | None
    """None: the epoch the follower already knows."""


@dataclass(frozen=True, slots=True)
class ApplyInTurn:
    """Hand ``control`` to :meth:`RoleMachine.on_control` after the changes before it."""

    control: GroupControl


@dataclass(frozen=True, slots=True)
class BecomeWriter:
    """Make the store a writer (dispatch every copied record), apply the journal to the
    end, begin ``epoch`` in the epoch history at the log's end (not epoch 0, which no
    controller ever elected), serve slaves through a new replica set with ``in_sync_ids``
    in sync from the start; then report :meth:`RoleMachine.on_caught_up`."""

    epoch: int
    in_sync_ids: tuple[int, ...]

    @property
    def begins_epoch(self) -> bool:
        return self.epoch != 0


@dataclass(frozen=True, slots=True)
class HoldOffQueueLocks:
    """Grant no queue lock until the ones another master (or this one before a crash)
    granted have lapsed: their holders may still be processing."""


@dataclass(frozen=True, slots=True)
class TookUp:
    """This broker took up its role in ``epoch``: wake the fetches waiting for that."""

    epoch: int


@dataclass(frozen=True, slots=True)
class WriteJournal:
    """Journal the whole state and persist the commits held for an earlier master: each
    term starts with the whole state, for slaves that start from here."""


@dataclass(frozen=True, slots=True)
class Announce:
    """Role or epoch changed: tell the nameservers now, not at the next heartbeat."""


@dataclass(frozen=True, slots=True)
class CommitInSync:
    """The controller committed this in-sync set: the master's replica set takes it."""

    in_sync_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StopServingSlaves:
    """Demoted: keep what the replica set confirmed as the read limit (the log here may
    run past what the new master holds), then close it, failing the sends still waiting
    for copies (they were never acknowledged)."""


@dataclass(frozen=True, slots=True)
class HoldUnjournaled:
    """Demoted: offset commits taken as master but not journaled go to the new master."""


@dataclass(frozen=True, slots=True)
class Log:
    message: str


Command = (
    Follow
    | ApplyInTurn
    | BecomeWriter
    | HoldOffQueueLocks
    | TookUp
    | WriteJournal
    | Announce
    | CommitInSync
    | StopServingSlaves
    | HoldUnjournaled
    | Log
)


class Electorate(Protocol):
    """What a master's replica set tells the lease rule about its slaves."""

    def electable(self) -> Collection[int]:
        """Who could be elected, as far as this master can tell, itself included."""
        ...

    def followed_within(self, seconds: float) -> bool:
        """Whether every slave that could be elected fetched within ``seconds``."""
        ...


E = TypeVar("E", bound=Electorate)


class RoleMachine:
    """Master or slave, in which epoch, following whom, and whether writes are taken."""

    def __init__(self, settings: RoleSettings, *, configured_master: bool, epoch: int) -> None:
        self.settings = settings
        self.epoch = epoch
        """The group's epoch as this broker knows it."""
        # Without failover the role is the deployed one for good; under a controller the
        # broker starts as a slave that takes no writes until it is elected.
        self.role = Role.MASTER if configured_master and not settings.controlled else Role.SLAVE
        self.master_address = ""
        """The master this slave follows ("" as master, or while not known)."""
        self.followed = False
        """Whether this broker ever followed a master (whose queue locks may still hold)."""
        self.lease_s = settings.master_lease_ms / 1e3
        self.lease_until = 0.0
        """Monotonic time until which the controller's leader last confirmed this master."""
        self.fenced_until = 0.0
        """A switchover's fence: no writes until then (monotonic time)."""
        self.handover_to = -1

    # --- events -----------------------------------------------------------------------

    def on_start(self) -> list[Command]:
        """The broker starts: a deployed master takes writes in the epoch it last knew."""
        if self.role is Role.MASTER:
            return self._promote(self.epoch, ())
        return []

    def on_heard(self, heard: Heard) -> list[Command]:
        """Every event from every nameserver (answers and pushed news) comes here."""
        settings = self.settings
        if settings.controlled:
            control = heard.control
            if control is None:
                return []
            if (
                heard.sent_at is not None
                and heard.lease_granted
                and control.master_id == settings.broker_id
                and control.epoch >= self.epoch
            ):
                # The controller's leader still had us as master when that heartbeat
                # left. Another nameserver's word is not enough: it may be cut off from
                # the Raft majority that has elected someone else meanwhile.
                self.lease_until = max(self.lease_until, heard.sent_at + self.lease_s)
            return [ApplyInTurn(control)]
        if self.role is Role.SLAVE and heard.master_address:
            self.master_address = heard.master_address
            self.followed = True
            return [Follow(heard.master_address, None)]
        return []

    def on_control(self, control: GroupControl) -> list[Command]:
        """The controller's word, applied one at a time in the order heard."""
        if control.epoch < self.epoch:
            return []  # a nameserver that has not heard of the latest election yet
        if control.master_id == self.settings.broker_id:
            commands: list[Command] = []
            if self.role is not Role.MASTER or control.epoch != self.epoch:
                commands += self._promote(control.epoch, control.in_sync_ids)
            commands.append(CommitInSync(control.in_sync_ids))
            return commands
        address = control.master_data_address
        if (
            self.role is Role.MASTER
            or control.epoch != self.epoch
            or (address and address != self.master_address)
        ):
            # With no master named (the old one lost, none electable yet) a slave keeps
            # pointing at the last one it knew, in the new epoch.
            return self._demote(control.epoch, address or self.master_address)
        return []

    def on_caught_up(self, epoch: int, end: int, *, crashed: bool) -> list[Command]:
        """The store is a writer at log offset ``end`` and the replica set of ``epoch`` is
        open (:class:`BecomeWriter` done); ``crashed``: the store recovered from a crash."""
        self.epoch = epoch
        self.fenced_until = 0.0
        self.master_address = ""
        commands: list[Command] = []
        if self.followed or crashed:
            commands.append(HoldOffQueueLocks())
        self.role = Role.MASTER
        commands += [
            Log(f"master of {self.settings.broker_name} in epoch {epoch} from offset {end}"),
            TookUp(epoch),
            WriteJournal(),
            Announce(),
        ]
        return commands

    def fence(self, target: int, until: float) -> None:
        """A switchover to broker ``target`` began: no writes until ``until``."""
        self.handover_to = target
        self.fenced_until = until

    def resume(self) -> None:
        """Lift a switchover's fence."""
        self.fenced_until = 0.0

    def _promote(self, epoch: int, in_sync_ids: tuple[int, ...]) -> list[Command]:
        # No more copying first: our log is the log now.
        return [Follow("", epoch), BecomeWriter(epoch, in_sync_ids)]

    def _demote(self, epoch: int, master_address: str) -> list[Command]:
        was_master = self.role is Role.MASTER
        self.role = Role.SLAVE
        commands: list[Command] = [StopServingSlaves()]
        if was_master:
            commands.append(HoldUnjournaled())
        self.epoch = epoch
        self.master_address = master_address
        self.followed = self.followed or bool(master_address)
        kind = "demoted to slave" if was_master else "slave"
        following = master_address or "(master not known yet)"
        commands += [
            Follow(master_address, epoch),
            TookUp(epoch),
            Log(f"{kind} of {self.settings.broker_name} in epoch {epoch}, following {following}"),
            Announce(),
        ]
        return commands

    # --- views --------------------------------------------------------------------------

    @property
    def holds_commits(self) -> bool:
        """A slave: consumers' offset commits here are held for the master."""
        return self.role is Role.SLAVE

    def check_master(self, now: float, replicas: E | None) -> E:
        """``replicas`` if this broker may take writes at monotonic time ``now`` as master
        (not fenced, lease held); raise NotMaster otherwise."""
        settings = self.settings
        if self.role is not Role.MASTER or replicas is None:
            where = f"; its master is {self.master_address}" if self.master_address else ""
            raise NotMaster(
                f"broker {settings.broker_name} (id {settings.broker_id}) is not the "
                f"master of its group (epoch {self.epoch}){where}; send to the master",
                self.master_address,
            )
        if (
            settings.controlled
            and now > self.lease_until
            and self._needs_lease(replicas)
            and not (settings.sync and replicas.followed_within(self.lease_s))
        ):
            raise NotMaster(
                f"broker {settings.broker_name} has not heard the controller confirm it "
                f"as master for {settings.master_lease_ms} ms (nameservers unreachable, "
                "or this process was paused); not taking writes until it does, as a slave "
                "may have been promoted meanwhile"
            )
        if now < self.fenced_until:
            raise NotMaster(
                f"broker {settings.broker_name} is handing its master role to broker "
                f"{self.handover_to}; retry in a moment"
            )
        return replicas

    @staticmethod
    def _needs_lease(replicas: Electorate) -> bool:
        """Only a master someone else could replace must stop when cut off: with no
        other broker electable, none can be elected.

        Under sync replication the slaves' fetches stand in for the controller: a send is
        acknowledged only once every slave that could be elected holds it, and one that
        is still copying from this master has not been promoted, so while all of them
        fetched within the lease this master goes on taking writes even with every
        nameserver down (see :meth:`check_master`)."""
        return len(replicas.electable()) > 1

    def readable_end(
        self, master_confirmed: int | None, slave_confirmed: int, checked_to: int | None
    ) -> int | None:
        """The commitlog offset consumers may read up to, None for no limit.

        ``master_confirmed``: as master, what every slave that could be elected holds
        (None when not master). ``slave_confirmed``: what this broker's master last
        confirmed (or it did itself as master); a slave under a controller reads no
        further, since another slave may be elected without its tail. ``checked_to``: how
        far the log check has got while it runs (None once done, or without one). A
        slave without failover is never cut, and reads all it holds."""
        limit: int | None = None
        if master_confirmed is not None:
            limit = master_confirmed
        elif self.settings.controlled:
            limit = slave_confirmed
        if checked_to is not None:
            limit = checked_to if limit is None else min(limit, checked_to)
        return limit


def restored_confirmed(mark: int, log_end: int) -> int:
    """A restarted controlled slave's read limit: the confirmed offset it kept on disk,
    but never past its own log (a tail lost in the crash is not there to read)."""
    return min(mark, log_end)
