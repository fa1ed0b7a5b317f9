"""What the controller's leader proposes, from its own registry view: pure, clock injected.

The leader calls :meth:`Decider.decide` every round with the committed state of every
group and the live controlled brokers it has registered; it gets back the proposals to
commit through Raft. Nothing here does I/O or waits, so tests drive it with a fake clock.

Rules, per group (see docs/nameserver.md, "The failover controller"):

- **Bootstrap** (no state yet): a live broker that already reports MASTER at the group's
  highest reported epoch (a controller state lost and rebuilt: keep the reigning master),
  else the live ``configured_master``, else — once ``bootstrap_grace_s`` has passed since
  the group was first seen — the live broker with the highest (epoch, commitlog offset),
  ties to the lowest id. Epoch: the highest reported plus one; in sync: the master alone.
- **Take-over**: a live master that has not reported MASTER at its epoch
  ``takeover_timeout_s`` after this leader first saw it elected is down too (its
  promotion is stuck), and replaced like a dead one.
- **Failover**: the master is down when its last heartbeat is older than
  ``master_detection_s`` and this leader has led for as long (before, brokers beat it
  only at the standby rate), or when it is gone from the registry (its session ended, it
  unregistered or expired) after this leader saw it live or elected it. A master this
  leader never saw counts as down only after ``bootstrap_grace_s`` of leadership, so a
  freshly started nameserver does not depose a master whose heartbeat has simply not
  reached it yet. The successor is a live in-sync replica (highest commitlog offset, then
  lowest id); with none the group waits for its master. The other live members of the
  in-sync set stay in it (:func:`kept_in_sync`): each holds every acknowledged record.
- **ISR**: the live master at the current epoch, reporting MASTER at that epoch, reports an
  in-sync set holding itself that differs from the committed one: commit it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from metaq.common.model import BrokerKey, BrokerState, BrokerView, GroupControl, Role
from metaq.nameserver.control import Refused, in_sync_set

log = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Proposal:
    """One transition to commit (see :mod:`metaq.nameserver.control`).

    ``epoch`` is the new epoch for a bootstrap and the expected (current) epoch for an
    election or an in-sync change; ``master_id`` the new master, or the current one for an
    in-sync change.
    """

    kind: Literal["bootstrap", "elect", "set_isr"]
    broker_name: str
    epoch: int
    master_id: int
    in_sync_ids: tuple[int, ...]
    reason: str


def _id(view: BrokerView) -> int:
    return view.state.key.broker_id


class Decider:
    """The leader's memory between rounds: when groups and masters were seen, what was said.

    None of it is replicated: a new leader starts afresh (:meth:`reset`), which is why a
    master it never saw gets the bootstrap grace before it counts as down.
    """

    def __init__(
        self,
        master_detection_s: float,
        bootstrap_grace_s: float,
        clock: Clock = time.monotonic,
        *,
        takeover_timeout_s: float = 10.0,
    ) -> None:
        self.master_detection_s = master_detection_s
        self.bootstrap_grace_s = bootstrap_grace_s
        self.takeover_timeout_s = takeover_timeout_s
        self._clock = clock
        self._since: float | None = None
        self._first_seen: dict[str, float] = {}
        self._master_seen: dict[str, tuple[int, int]] = {}
        self._elected: dict[str, tuple[int, int]] = {}
        """The (master, epoch) this leader last elected in each group, live when it did."""
        self._taking_over: dict[str, tuple[int, int, float]] = {}
        """(master, epoch, since when) of a live master not yet reporting it took over."""
        self._waiting: set[str] = set()

    def reset(self) -> None:
        """Leadership was lost: forget everything observed as leader."""
        self._since = None
        self._first_seen.clear()
        self._master_seen.clear()
        self._elected.clear()
        self._taking_over.clear()
        self._waiting.clear()

    def decide(
        self,
        controls: Mapping[str, GroupControl],
        members: Mapping[str, Sequence[BrokerView]],
    ) -> list[Proposal]:
        """The proposals for this round, by group name.

        ``members`` holds the live controlled brokers of each group this nameserver knows
        (groups with state but no live broker may be left out).
        """
        now = self._clock()
        if self._since is None:
            self._since = now
        proposals = []
        for name in sorted(set(controls) | set(members)):
            brokers = [b for b in members.get(name, ()) if b.state.controlled]
            control = controls.get(name)
            if control is None:
                proposal = self._bootstrap(name, brokers, now)
            else:
                proposal = self._watch(control, brokers, now)
            if proposal is not None:
                proposals.append(proposal)
        return proposals

    def _fresh(self, brokers: Sequence[BrokerView]) -> list[BrokerView]:
        return [b for b in brokers if b.last_heartbeat_age_s <= self.master_detection_s]

    def _bootstrap(self, name: str, brokers: list[BrokerView], now: float) -> Proposal | None:
        fresh = self._fresh(brokers)
        if not fresh:
            self._first_seen.pop(name, None)
            return None
        first = self._first_seen.setdefault(name, now)
        top_epoch = max(b.state.epoch for b in fresh)
        reigning = [b for b in fresh if b.state.role is Role.MASTER and b.state.epoch == top_epoch]
        configured = [b for b in fresh if b.state.configured_master]
        if reigning:
            master = reigning[0]
            why = f"it already reports master at epoch {top_epoch}"
        elif configured:
            master = configured[0]
            why = "it is the configured master"
        elif now - first >= self.bootstrap_grace_s:
            master = max(
                fresh, key=lambda b: (b.state.epoch, b.state.commitlog_max_offset, -_id(b))
            )
            state = master.state
            why = (
                f"no configured master came within {self.bootstrap_grace_s:g} s and it has the "
                f"highest (epoch, offset) ({state.epoch}, {state.commitlog_max_offset})"
            )
        else:
            return None
        return Proposal(
            "bootstrap",
            name,
            top_epoch + 1,
            _id(master),
            (_id(master),),
            f"bootstrap: broker {master.state.key} is master because {why}",
        )

    def _watch(
        self, control: GroupControl, brokers: list[BrokerView], now: float
    ) -> Proposal | None:
        name = control.broker_name
        by_id = {_id(b): b for b in brokers}
        master = by_id.get(control.master_id)
        key = BrokerKey(name, control.master_id)
        stuck = None
        # Silence counts from this leader's election at the earliest: until then brokers
        # beat this nameserver at the standby rate, so an older heartbeat proves nothing.
        led_s = now - (self._since if self._since is not None else now)
        if (
            master is not None
            and min(master.last_heartbeat_age_s, led_s) <= self.master_detection_s
        ):
            self._master_seen[name] = (control.master_id, control.epoch)
            stuck = self._not_taken_over(control, master, now)
            if stuck is None:
                self._waiting.discard(name)
                return self._isr(control, master.state)
        if stuck is not None:
            down = stuck
        elif master is not None:
            down = (
                f"master {key} silent for {master.last_heartbeat_age_s:.1f} s "
                f"(detection {self.master_detection_s:g} s)"
            )
        elif (control.master_id, control.epoch) in (
            self._master_seen.get(name),
            self._elected.get(name),
        ):
            down = f"master {key} left (session ended, unregistered or expired)"
        elif self._since is not None and now - self._since >= self.bootstrap_grace_s:
            down = f"master {key} has not registered in {now - self._since:.1f} s of leadership"
        else:
            return None
        # An unverified broker may hold a damaged record the old master alone had whole.
        candidates = [
            b
            for b in self._fresh(brokers)
            if _id(b) in control.in_sync_ids
            and _id(b) != control.master_id
            and not b.state.unverified
        ]
        if not candidates:
            if name not in self._waiting:
                self._waiting.add(name)
                log.warning(
                    "group %s waits for its master: %s, and no other in-sync replica of %s "
                    "is live and verified",
                    name,
                    down,
                    list(control.in_sync_ids),
                )
            return None
        self._waiting.discard(name)
        best = max(candidates, key=lambda b: (b.state.commitlog_max_offset, -_id(b)))
        # Seen live right now: should it die before it ever heartbeats as master (killed
        # with the old one, say), it counts as left at once, not after the grace.
        self._elected[name] = (_id(best), control.epoch + 1)
        return Proposal(
            "elect",
            name,
            control.epoch,
            _id(best),
            kept_in_sync(control, _id(best), self._fresh(brokers)),
            f"failover: {down}; broker {best.state.key} is in sync with offset "
            f"{best.state.commitlog_max_offset}",
        )

    def _not_taken_over(self, control: GroupControl, master: BrokerView, now: float) -> str | None:
        """Why a live master counts as down: elected ``takeover_timeout_s`` ago (as far
        as this leader knows) and still not reporting MASTER at its epoch; else None."""
        name = control.broker_name
        state = master.state
        if state.role is Role.MASTER and state.epoch == control.epoch:
            self._taking_over.pop(name, None)
            return None
        held = self._taking_over.get(name)
        if held is None or held[:2] != (control.master_id, control.epoch):
            held = self._taking_over[name] = (control.master_id, control.epoch, now)
        since = held[2]
        if now - since < self.takeover_timeout_s:
            return None
        return (
            f"master {state.key} has not taken over in {now - since:.1f} s since its "
            f"election (it reports {state.role.value} at epoch {state.epoch}, not master at "
            f"{control.epoch}; take-over timeout {self.takeover_timeout_s:g} s)"
        )

    @staticmethod
    def settled(control: GroupControl, master: BrokerState) -> bool:
        """Whether a group whose master, in state ``master``, was heard within
        ``master_detection_s`` needs nothing (:meth:`decide` proposes nothing for it and
        remembers nothing new): it reports MASTER at the committed epoch with no in-sync
        set to commit. It stays so while that master is heard in that state, whatever
        the other brokers do, so a round may leave such a group out."""
        return (
            master.role is Role.MASTER
            and master.epoch == control.epoch
            and Decider._isr(control, master) is None
        )

    @staticmethod
    def _isr(control: GroupControl, state: BrokerState) -> Proposal | None:
        if state.role is not Role.MASTER or state.epoch != control.epoch:
            return None  # not taken over yet: its report is not about this epoch
        reported = in_sync_set(state.in_sync_ids)
        if control.master_id not in reported or reported == control.in_sync_ids:
            return None
        return Proposal(
            "set_isr",
            control.broker_name,
            control.epoch,
            control.master_id,
            reported,
            f"in-sync set: master {state.key} reports {list(reported)} "
            f"(was {list(control.in_sync_ids)})",
        )


def kept_in_sync(
    control: GroupControl, master_id: int, live: Iterable[BrokerView]
) -> tuple[int, ...]:
    """The in-sync set an election starts the new master's term with: the new master and
    every other member of the committed set that is live, but not the old master.

    A send was acknowledged only once every committed member held it, so each holds every
    acknowledged record when the old master stops; keeping them in sync is what lets the
    new master take sends needing ``min_in_sync`` copies at once, and lets the controller
    elect one of them should the new master die before it has reported a view of its own.
    The old master is left out (its log may end in records only it had, cut when it
    follows), and so is a member not live, which the new master would wait for in vain.
    """
    live_ids = {_id(b) for b in live}
    kept = {i for i in control.in_sync_ids if i in live_ids and i != control.master_id}
    return in_sync_set(kept | {master_id})


def switchover(
    broker_name: str,
    control: GroupControl | None,
    members: Sequence[BrokerView],
    broker_id: int,
    expected_epoch: int,
    master_detection_s: float,
) -> Proposal | Refused:
    """The election a planned switchover asks for, or why it is refused."""
    key = BrokerKey(broker_name, broker_id)
    if control is None:
        return Refused(f"group {broker_name!r} is not managed by the failover controller")
    if control.epoch != expected_epoch:
        return Refused(
            f"group {broker_name!r} is at epoch {control.epoch}, not the expected {expected_epoch}"
        )
    if broker_id == control.master_id:
        return Refused(f"broker {key} is already the master at epoch {control.epoch}")
    if broker_id not in control.in_sync_ids:
        return Refused(
            f"broker {key} is not in the in-sync set {list(control.in_sync_ids)}; "
            "only an in-sync replica can take over"
        )
    live = [
        b for b in members if _id(b) == broker_id and b.last_heartbeat_age_s <= master_detection_s
    ]
    if not live:
        return Refused(f"broker {key} is not live on this nameserver")
    return Proposal(
        "elect",
        broker_name,
        control.epoch,
        broker_id,
        kept_in_sync(
            control, broker_id, [b for b in members if b.last_heartbeat_age_s <= master_detection_s]
        ),
        f"switchover requested: broker {key} takes over from master "
        f"{BrokerKey(broker_name, control.master_id)}",
    )
