"""The leader's decisions with a fake clock: bootstrap, failover from the in-sync set only,
waiting when no in-sync replica is live, in-sync updates, switchover checks."""

from __future__ import annotations

import logging

import pytest

from metaq.common.model import BrokerKey, BrokerState, BrokerView, GroupControl, Role
from metaq.nameserver import control
from metaq.nameserver.control import Refused
from metaq.nameserver.decisions import Decider, Proposal, switchover

DETECTION_S = 3.0
GRACE_S = 5.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def view(
    broker_id: int,
    *,
    role: Role = Role.SLAVE,
    epoch: int = 0,
    offset: int = 0,
    age_s: float = 0.1,
    configured_master: bool = False,
    in_sync: tuple[int, ...] = (),
    controlled: bool = True,
    name: str = "broker-a",
    unverified: bool = False,
) -> BrokerView:
    return BrokerView(
        state=BrokerState(
            cluster="c1",
            key=BrokerKey(name, broker_id),
            role=role,
            data_address=f"127.0.0.1:{9000 + broker_id}",
            epoch=epoch,
            commitlog_max_offset=offset,
            controlled=controlled,
            configured_master=configured_master,
            in_sync_ids=in_sync,
            unverified=unverified,
        ),
        last_heartbeat_age_s=age_s,
        session_open=True,
        topic_count=1,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def decider(clock: FakeClock) -> Decider:
    return Decider(DETECTION_S, GRACE_S, clock)


CONTROL = GroupControl("broker-a", 5, 0, (0, 1), "earlier")


# --- bootstrap ---------------------------------------------------------------------------


def test_bootstrap_picks_the_live_configured_master_at_the_next_epoch(decider: Decider) -> None:
    brokers = [view(0, epoch=2, configured_master=True), view(1, epoch=4, offset=999)]

    (proposal,) = decider.decide({}, {"broker-a": brokers})

    assert (proposal.kind, proposal.epoch, proposal.master_id, proposal.in_sync_ids) == (
        "bootstrap",
        5,
        0,
        (0,),
    )
    assert "configured master" in proposal.reason


def test_bootstrap_waits_for_the_configured_master_until_the_grace_passes(
    decider: Decider, clock: FakeClock
) -> None:
    brokers = {"broker-a": [view(1, epoch=2, offset=50), view(2, epoch=2, offset=70)]}

    assert decider.decide({}, brokers) == []
    clock.now += GRACE_S - 0.01
    assert decider.decide({}, brokers) == []
    clock.now += 0.01
    (proposal,) = decider.decide({}, brokers)

    assert (proposal.master_id, proposal.epoch) == (2, 3)
    assert "highest (epoch, offset) (2, 70)" in proposal.reason


def test_after_the_grace_the_highest_epoch_wins_over_offset_and_ties_go_to_the_lowest_id(
    decider: Decider, clock: FakeClock
) -> None:
    decider.decide({}, {"g1": [view(1, name="g1")], "g2": [view(1, name="g2")]})
    clock.now += GRACE_S
    brokers = {
        "g1": [view(1, epoch=3, offset=10, name="g1"), view(2, epoch=2, offset=99, name="g1")],
        "g2": [view(2, offset=7, name="g2"), view(1, offset=7, name="g2")],
    }

    first, second = decider.decide({}, brokers)

    assert (first.broker_name, first.master_id, first.epoch) == ("g1", 1, 4)
    assert (second.broker_name, second.master_id, second.epoch) == ("g2", 1, 1)


def test_bootstrap_keeps_a_broker_that_already_reigns_at_the_highest_epoch(
    decider: Decider,
) -> None:
    # The controller's state was lost (a nameserver alone, in memory, restarted).
    brokers = [view(0, configured_master=True, epoch=6), view(1, role=Role.MASTER, epoch=7)]

    (proposal,) = decider.decide({}, {"broker-a": brokers})

    assert (proposal.master_id, proposal.epoch) == (1, 8)
    assert "already reports master at epoch 7" in proposal.reason


def test_uncontrolled_brokers_are_never_managed(decider: Decider, clock: FakeClock) -> None:
    brokers = {"broker-a": [view(0, controlled=False, configured_master=True, role=Role.MASTER)]}

    assert decider.decide({}, brokers) == []
    clock.now += GRACE_S * 2
    assert decider.decide({}, brokers) == []


# --- failover ----------------------------------------------------------------------------


def test_a_master_that_left_is_replaced_at_once_by_the_in_sync_replica_with_most_data(
    decider: Decider,
) -> None:
    # The other live in-sync replica stays in sync; broker 3, never in sync, does not.
    control = GroupControl("broker-a", 5, 0, (0, 1, 2), "earlier")
    master = view(0, role=Role.MASTER, epoch=5)
    slaves = [view(1, epoch=5, offset=100), view(2, epoch=5, offset=300), view(3, offset=900)]
    assert decider.decide({"broker-a": control}, {"broker-a": [master, *slaves]}) == []

    (proposal,) = decider.decide({"broker-a": control}, {"broker-a": slaves})

    assert proposal == Proposal(
        "elect",
        "broker-a",
        5,
        2,
        (1, 2),
        proposal.reason,
    )
    assert "master broker-a/0 left" in proposal.reason


def test_an_in_sync_replica_that_is_not_live_is_not_kept_in_sync_by_an_election(
    decider: Decider,
) -> None:
    control = GroupControl("broker-a", 5, 0, (0, 1, 2), "earlier")
    decider.decide({"broker-a": control}, {"broker-a": [view(0, role=Role.MASTER, epoch=5)]})

    (proposal,) = decider.decide(
        {"broker-a": control}, {"broker-a": [view(1), view(2, age_s=DETECTION_S + 1)]}
    )

    assert (proposal.master_id, proposal.in_sync_ids) == (1, (1,))


def test_when_the_elected_slave_dies_before_taking_over_the_other_in_sync_one_is_elected(
    decider: Decider,
) -> None:
    three = GroupControl("broker-a", 5, 0, (0, 1, 2), "earlier")
    live = [view(0, role=Role.MASTER, epoch=5), view(1, epoch=5), view(2, epoch=5)]
    decider.decide({"broker-a": three}, {"broker-a": live})
    (first,) = decider.decide(
        {"broker-a": three}, {"broker-a": [view(1, epoch=5), view(2, epoch=5)]}
    )
    elected = control.elect(three, "broker-a", first.master_id, 5, first.in_sync_ids, "failover")
    assert isinstance(elected, GroupControl)
    survivor = 3 - first.master_id

    # The elected slave dies 10 ms later, before its first heartbeat as master.
    (second,) = decider.decide({"broker-a": elected}, {"broker-a": [view(survivor, epoch=5)]})

    assert (second.kind, second.epoch, second.master_id) == ("elect", 6, survivor)
    assert second.in_sync_ids == (survivor,)
    assert f"master broker-a/{first.master_id} left" in second.reason


def test_a_silent_master_is_replaced_once_its_heartbeat_is_older_than_the_detection(
    decider: Decider, clock: FakeClock
) -> None:
    slave = view(1, epoch=5)
    decider.decide({"broker-a": CONTROL}, {"broker-a": [view(0), slave]})
    clock.now += DETECTION_S + 1  # led for longer than the detection: silence counts

    quiet = decider.decide({"broker-a": CONTROL}, {"broker-a": [view(0, age_s=DETECTION_S), slave]})
    (proposal,) = decider.decide(
        {"broker-a": CONTROL}, {"broker-a": [view(0, age_s=DETECTION_S + 0.1), slave]}
    )

    assert quiet == []
    assert (proposal.kind, proposal.master_id, proposal.epoch) == ("elect", 1, 5)
    assert "silent for 3.1 s" in proposal.reason


def test_only_an_in_sync_replica_is_elected_and_without_one_the_group_waits_and_says_so_once(
    decider: Decider, caplog: pytest.LogCaptureFixture
) -> None:
    control = GroupControl("broker-a", 5, 0, (0, 1), "earlier")
    master = view(0, role=Role.MASTER, epoch=5)
    decider.decide({"broker-a": control}, {"broker-a": [master, view(1), view(2, offset=10**9)]})
    # The in-sync slave is silent too; the up-to-date-looking broker 2 is not in sync.
    left = {"broker-a": [view(1, age_s=DETECTION_S + 1), view(2, offset=10**9)]}

    with caplog.at_level(logging.WARNING, logger="metaq.nameserver.decisions"):
        first = decider.decide({"broker-a": control}, left)
        second = decider.decide({"broker-a": control}, left)

    assert first == second == []
    waits = [r for r in caplog.records if "waits for its master" in r.getMessage()]
    assert len(waits) == 1
    assert "[0, 1]" in waits[0].getMessage()


def test_an_elected_master_that_does_not_take_over_in_time_is_replaced(
    decider: Decider, clock: FakeClock
) -> None:
    elected = GroupControl("broker-a", 6, 1, (1, 2), "failover")
    # Live and heartbeating, but still a slave of epoch 5: its promotion is stuck.
    stuck = {"broker-a": [view(1, epoch=5), view(2, epoch=5)]}

    assert decider.decide({"broker-a": elected}, stuck) == []
    clock.now += decider.takeover_timeout_s - 0.1
    assert decider.decide({"broker-a": elected}, stuck) == []
    clock.now += 0.1
    (proposal,) = decider.decide({"broker-a": elected}, stuck)

    assert (proposal.kind, proposal.epoch, proposal.master_id) == ("elect", 6, 2)
    assert proposal.in_sync_ids == (2,)
    assert "has not taken over in 10.0 s" in proposal.reason


def test_a_master_that_took_over_is_never_replaced_by_the_take_over_timeout(
    decider: Decider, clock: FakeClock
) -> None:
    elected = GroupControl("broker-a", 6, 1, (1, 2), "failover")
    decider.decide({"broker-a": elected}, {"broker-a": [view(1, epoch=5), view(2, epoch=5)]})
    took_over = {"broker-a": [view(1, role=Role.MASTER, epoch=6, in_sync=(1, 2)), view(2)]}

    clock.now += decider.takeover_timeout_s * 3

    assert decider.decide({"broker-a": elected}, took_over) == []


def test_an_unverified_replica_is_not_elected_until_its_log_is_checked(
    decider: Decider,
) -> None:
    control = GroupControl("broker-a", 5, 0, (0, 1, 2), "earlier")
    master = view(0, role=Role.MASTER, epoch=5)
    decider.decide({"broker-a": control}, {"broker-a": [master, view(1), view(2)]})
    longest_unchecked = view(1, offset=2000, unverified=True)

    (proposal,) = decider.decide({"broker-a": control}, {"broker-a": [longest_unchecked, view(2)]})
    assert proposal.master_id == 2

    alone = {"broker-a": [longest_unchecked]}
    assert decider.decide({"broker-a": control}, alone) == []
    checked = {"broker-a": [view(1, offset=2000)]}
    (proposal,) = decider.decide({"broker-a": control}, checked)
    assert proposal.master_id == 1


def test_a_new_leader_waits_the_grace_for_a_master_it_never_saw(
    decider: Decider, clock: FakeClock
) -> None:
    slaves = {"broker-a": [view(1, epoch=5)]}

    assert decider.decide({"broker-a": CONTROL}, slaves) == []
    clock.now += GRACE_S
    (proposal,) = decider.decide({"broker-a": CONTROL}, slaves)

    assert proposal.master_id == 1
    assert "has not registered in 5.0 s of leadership" in proposal.reason


def test_a_new_leader_counts_a_masters_silence_from_its_own_election_at_the_earliest(
    decider: Decider, clock: FakeClock
) -> None:
    # Before the election the master beat this nameserver at the standby rate only: an
    # old last heartbeat is no silence yet.
    slave = view(1, epoch=5)
    master_heard_long_ago = view(0, role=Role.MASTER, epoch=5, age_s=DETECTION_S + 1)

    assert decider.decide({"broker-a": CONTROL}, {"broker-a": [master_heard_long_ago, slave]}) == []
    clock.now += DETECTION_S
    assert decider.decide({"broker-a": CONTROL}, {"broker-a": [master_heard_long_ago, slave]}) == []
    clock.now += 0.1
    (proposal,) = decider.decide(
        {"broker-a": CONTROL},
        {"broker-a": [view(0, role=Role.MASTER, epoch=5, age_s=DETECTION_S + 1.1), slave]},
    )

    assert (proposal.kind, proposal.master_id) == ("elect", 1)
    assert "silent for 4.1 s" in proposal.reason


def test_losing_leadership_forgets_what_was_seen(decider: Decider, clock: FakeClock) -> None:
    master = view(0, role=Role.MASTER, epoch=5)
    decider.decide({"broker-a": CONTROL}, {"broker-a": [master, view(1)]})

    decider.reset()

    assert decider.decide({"broker-a": CONTROL}, {"broker-a": [view(1)]}) == []


# --- the in-sync set ---------------------------------------------------------------------


def test_the_masters_in_sync_report_is_committed_when_it_differs(decider: Decider) -> None:
    master = view(0, role=Role.MASTER, epoch=5, in_sync=(2, 0, 1))

    (proposal,) = decider.decide({"broker-a": CONTROL}, {"broker-a": [master, view(1), view(2)]})

    assert (proposal.kind, proposal.epoch, proposal.master_id, proposal.in_sync_ids) == (
        "set_isr",
        5,
        0,
        (0, 1, 2),
    )


@pytest.mark.parametrize(
    "master",
    [
        view(0, role=Role.MASTER, epoch=5, in_sync=(0, 1)),  # no change
        view(0, role=Role.MASTER, epoch=4, in_sync=(0,)),  # not taken over yet
        view(0, role=Role.SLAVE, epoch=5, in_sync=(0,)),  # not taken over yet
        view(0, role=Role.MASTER, epoch=5, in_sync=(1,)),  # without itself: nonsense
        view(0, role=Role.MASTER, epoch=5),  # reports none
    ],
)
def test_in_sync_reports_not_about_the_current_epoch_or_without_the_master_are_ignored(
    decider: Decider, master: BrokerView
) -> None:
    assert decider.decide({"broker-a": CONTROL}, {"broker-a": [master, view(1)]}) == []


# --- switchover ----------------------------------------------------------------------------


def test_a_switchover_to_a_live_in_sync_replica_elects_it_at_the_next_epoch() -> None:
    checked = switchover("broker-a", CONTROL, [view(0), view(1)], 1, 5, DETECTION_S)

    assert isinstance(checked, Proposal)
    assert (checked.kind, checked.epoch, checked.master_id, checked.in_sync_ids) == (
        "elect",
        5,
        1,
        (1,),
    )


def test_a_switchover_keeps_the_other_live_in_sync_replicas_but_not_the_old_master() -> None:
    three = GroupControl("broker-a", 5, 0, (0, 1, 2, 3), "earlier")
    members = [view(0), view(1), view(2), view(3, age_s=DETECTION_S + 1)]

    checked = switchover("broker-a", three, members, 1, 5, DETECTION_S)

    assert isinstance(checked, Proposal)
    assert checked.in_sync_ids == (1, 2)


@pytest.mark.parametrize(
    ("control", "members", "target", "epoch", "why"),
    [
        (None, [view(1)], 1, 5, "not managed by the failover controller"),
        (CONTROL, [view(1)], 1, 4, "is at epoch 5, not the expected 4"),
        (CONTROL, [view(0)], 0, 5, "already the master at epoch 5"),
        (CONTROL, [view(2)], 2, 5, "not in the in-sync set [0, 1]"),
        (CONTROL, [view(0)], 1, 5, "broker-a/1 is not live"),
        (CONTROL, [view(1, age_s=DETECTION_S + 1)], 1, 5, "broker-a/1 is not live"),
    ],
)
def test_a_switchover_is_refused_with_the_reason(
    control: GroupControl | None, members: list[BrokerView], target: int, epoch: int, why: str
) -> None:
    checked = switchover("broker-a", control, members, target, epoch, DETECTION_S)

    assert isinstance(checked, Refused)
    assert why in checked.why
