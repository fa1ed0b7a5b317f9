"""The controller's decisions against a seeded simulation of one broker group: three
brokers under sync replication with ``min_in_sync_replicas = 2``, killed and restarted
at random, a master elected by the real :class:`Decider` and committed through the real
transitions of :mod:`metaq.nameserver.control`.

The group is modelled as the broker side behaves (docs/replication.md): a master starts
its term with the controller's in-sync set in sync; it stores a send only while that
many copies are in sync and acknowledges it once every slave in sync by its view or the
controller's holds it; a slave following a new master first cuts what the master never
had, and is in sync once caught up; a dead slave leaves the master's view two rounds
later. A broker takes over as master one or two rounds after its election, so it may
die elected but before it does.

Checked every round: every member of the committed in-sync set, and every master that
takes over, holds every acknowledged message; and while a broker that was in sync when
the last master stopped is alive, the group has a master again within a few rounds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from metaq.common.model import BrokerKey, BrokerState, BrokerView, GroupControl, Role
from metaq.nameserver import control as transitions
from metaq.nameserver.control import Refused
from metaq.nameserver.decisions import Decider, Proposal

GROUP = "broker-a"
BROKERS = (0, 1, 2)
MIN_IN_SYNC = 2
ROUND_S = 0.1
ROUNDS = 400
# Rounds from the last death to a master taking over: the leader decides and commits in
# the round of the death, and the successor takes over in that round or the next.
OUTAGE_ROUNDS = 2


@dataclass
class Broker:
    log: list[int] = field(default_factory=list)
    alive: bool = True
    epoch: int = 1
    master_in: int = 0
    """The epoch this broker took over as master in (0: a slave)."""
    following: int = -1
    """The epoch of the master it follows; -1: not following anyone yet."""
    catching_up: int = 0
    """Rounds left until it has caught up with its master."""


@dataclass
class Group:
    rng: random.Random
    brokers: dict[int, Broker]
    control: GroupControl
    view: set[int] = field(default_factory=set)
    """The master's own in-sync view (itself included)."""
    dead_for: dict[int, int] = field(default_factory=dict)
    acked: set[int] = field(default_factory=set)
    pending_take_over: int = 0
    next_message: int = 0

    def master(self) -> int | None:
        """The broker taking writes now: elected, taken over, alive."""
        broker = self.brokers[self.control.master_id]
        if broker.alive and broker.master_in == self.control.epoch:
            return self.control.master_id
        return None

    # --- the brokers' side ------------------------------------------------------------

    def apply_control(self) -> None:
        """Every live broker acts on the committed state (the elected one maybe late)."""
        c = self.control
        elected = self.brokers[c.master_id]
        if elected.alive and elected.master_in != c.epoch:
            if self.pending_take_over > 0:
                self.pending_take_over -= 1
            else:
                assert self.acked <= set(elected.log), (
                    f"broker {c.master_id} takes over at epoch {c.epoch} without "
                    f"{sorted(self.acked - set(elected.log))[:5]}, acknowledged"
                )
                elected.master_in = elected.epoch = c.epoch
                self.view = set(c.in_sync_ids)  # in sync from the start, as ReplicaSet
                self.dead_for.clear()
        master = self.master()
        for broker_id, broker in self.brokers.items():
            if broker_id == c.master_id or not broker.alive:
                continue
            if broker.master_in:
                broker.master_in = 0  # demoted
            if master is not None and broker.following != c.epoch:
                # Follow the new master: cut what it never had, then copy.
                master_log = self.brokers[master].log
                common = 0
                while (
                    common < min(len(broker.log), len(master_log))
                    and broker.log[common] == master_log[common]
                ):
                    common += 1
                del broker.log[common:]
                broker.following = broker.epoch = c.epoch
                broker.catching_up = 0 if broker_id in self.view else self.rng.randint(1, 4)

    def replicate(self) -> None:
        master = self.master()
        if master is None:
            return
        for broker_id, broker in self.brokers.items():
            if broker_id == master:
                continue
            if not broker.alive:
                self.dead_for[broker_id] = self.dead_for.get(broker_id, 0) + 1
                if self.dead_for[broker_id] >= 2:
                    self.view.discard(broker_id)
                continue
            if broker.following != self.control.epoch:
                continue
            if broker.catching_up > 0:
                broker.catching_up -= 1
                continue
            broker.log[:] = self.brokers[master].log
            self.view.add(broker_id)

    def send(self) -> None:
        master = self.master()
        if master is None or len(self.view) < MIN_IN_SYNC:
            return  # no master, or NOT_ENOUGH_REPLICAS: nothing stored
        message = self.next_message
        self.next_message += 1
        self.brokers[master].log.append(message)
        required = (self.view | set(self.control.in_sync_ids)) - {master}
        for broker_id in self.view - {master}:
            broker = self.brokers[broker_id]
            if broker.alive and broker.following == self.control.epoch and not broker.catching_up:
                broker.log.append(message)
        holders = [i for i in required if message in self.brokers[i].log]
        if len(holders) == len(required) and 1 + len(required) >= MIN_IN_SYNC:
            self.acked.add(message)

    # --- what the controller's leader sees --------------------------------------------

    def members(self) -> list[BrokerView]:
        views = []
        for broker_id, broker in self.brokers.items():
            if not broker.alive:
                continue  # its session ended
            is_master = broker.master_in == broker.epoch and broker.master_in > 0
            in_sync = tuple(sorted(self.view)) if self.master() == broker_id else ()
            state = BrokerState(
                cluster="c1",
                key=BrokerKey(GROUP, broker_id),
                role=Role.MASTER if is_master else Role.SLAVE,
                data_address=f"127.0.0.1:{9000 + broker_id}",
                epoch=broker.epoch,
                commitlog_max_offset=len(broker.log),
                controlled=True,
                in_sync_ids=in_sync,
            )
            views.append(BrokerView(state, 0.1, session_open=True, topic_count=1))
        return views

    def commit(self, proposal: Proposal) -> None:
        c = self.control
        if proposal.kind == "elect":
            outcome = transitions.elect(
                c, GROUP, proposal.master_id, proposal.epoch, proposal.in_sync_ids, "sim"
            )
        else:
            assert proposal.kind == "set_isr", proposal
            outcome = transitions.set_isr(c, GROUP, proposal.epoch, proposal.in_sync_ids, "sim")
        assert not isinstance(outcome, Refused), outcome.why
        if outcome.epoch != c.epoch:
            self.pending_take_over = self.rng.randint(0, 1)
        self.control = outcome


def simulate(seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    clock = [100.0]
    decider = Decider(3.0, 5.0, lambda: clock[0])
    group = Group(
        rng,
        {i: Broker(master_in=1 if i == 0 else 0, following=1) for i in BROKERS},
        GroupControl(GROUP, 1, 0, BROKERS, "start"),
        view=set(BROKERS),
    )
    last_in_sync: set[int] = set(BROKERS)
    """The live members of the committed in-sync set when the last master that took
    over died."""
    masterless = 0
    figures = {"failovers": 0, "longest_outage_rounds": 0}
    for _ in range(ROUNDS):
        clock[0] += ROUND_S
        event = rng.random()
        alive = [i for i, b in group.brokers.items() if b.alive]
        dead = [i for i, b in group.brokers.items() if not b.alive]
        if event < 0.08 and alive:
            victim = rng.choice(alive)
            if victim == group.master():
                last_in_sync = {
                    i for i in group.control.in_sync_ids
                    if i != victim and group.brokers[i].alive
                }  # fmt: skip
                figures["failovers"] += 1
            group.brokers[victim].alive = False
            group.dead_for.pop(victim, None)
            masterless = 0  # the outage is counted from the last death
        elif event < 0.16 and dead:
            back = group.brokers[rng.choice(dead)]
            back.alive, back.following, back.master_in = True, -1, 0
        else:
            group.send()
        group.replicate()
        for proposal in decider.decide({GROUP: group.control}, {GROUP: group.members()}):
            group.commit(proposal)
        group.apply_control()
        for member in group.control.in_sync_ids:
            assert group.acked <= set(group.brokers[member].log), (
                f"seed {seed}: in-sync member {member} lacks acknowledged messages"
            )
        if group.master() is not None:
            last_in_sync = set(group.control.in_sync_ids)
            masterless = 0
        elif any(group.brokers[i].alive for i in last_in_sync):
            masterless += 1
            figures["longest_outage_rounds"] = max(figures["longest_outage_rounds"], masterless)
            assert masterless <= OUTAGE_ROUNDS, (
                f"seed {seed}: no master for {masterless} rounds although broker(s) "
                f"{sorted(i for i in last_in_sync if group.brokers[i].alive)}, in sync when "
                f"the last master stopped, are alive (state {group.control})"
            )
        else:
            masterless = 0
    figures["acknowledged"] = len(group.acked)
    return figures


@pytest.mark.parametrize("seed", range(100))
def test_a_live_replica_in_sync_at_the_masters_death_is_elected_and_nothing_acked_is_lost(
    seed: int,
) -> None:
    figures = simulate(seed)

    assert figures["acknowledged"] > 0  # the run did exercise sends
