"""The controller's replicated transitions: what applies, and stale proposals as no-ops."""

from __future__ import annotations

from metaq.common.model import GroupControl
from metaq.nameserver import control
from metaq.nameserver.control import Refused

START = GroupControl("broker-a", 3, 0, (0, 1, 2), "bootstrap")


def test_bootstrap_makes_the_master_alone_in_sync_and_only_once() -> None:
    first = control.bootstrap(None, "broker-a", 1, 4, "configured")
    assert isinstance(first, GroupControl)
    assert first == GroupControl("broker-a", 4, 1, (1,), "configured")
    again = control.bootstrap(first, "broker-a", 0, 9, "a second leader's bootstrap")
    assert isinstance(again, Refused)
    assert "already has a master (epoch 4)" in again.why
    assert isinstance(control.bootstrap(None, "broker-a", 0, 0, "no epoch"), Refused)


def test_an_election_bumps_the_epoch_by_one_and_sets_the_new_in_sync_set() -> None:
    elected = control.elect(START, "broker-a", 2, 3, [2], "failover")

    assert elected == GroupControl("broker-a", 4, 2, (2,), "failover")


def test_an_election_keeps_members_of_the_in_sync_set_and_refuses_outsiders() -> None:
    kept = control.elect(START, "broker-a", 2, 3, [1, 2], "failover, slave 1 kept")
    outsider = control.elect(START, "broker-a", 2, 3, [2, 3], "broker 3 was never in sync")
    outside_master = control.elect(START, "broker-a", 3, 3, [3], "not in sync either")

    assert kept == GroupControl("broker-a", 4, 2, (1, 2), "failover, slave 1 kept")
    assert isinstance(outsider, Refused) and "outside the committed one" in outsider.why
    assert isinstance(outside_master, Refused)


def test_an_election_decided_on_an_older_epoch_is_a_no_op() -> None:
    stale = control.elect(START, "broker-a", 1, 2, [1], "a stale leader's failover")

    assert isinstance(stale, Refused)
    assert "is at epoch 3, not 2" in stale.why


def test_an_election_of_the_master_itself_or_outside_its_in_sync_set_is_refused() -> None:
    same = control.elect(START, "broker-a", 0, 3, [0], "again")
    outside = control.elect(START, "broker-a", 1, 3, [2], "bad set")
    unmanaged = control.elect(None, "broker-b", 1, 0, [1], "unknown group")

    assert isinstance(same, Refused) and "already the master" in same.why
    assert isinstance(outside, Refused) and "must be in its in-sync set" in outside.why
    assert isinstance(unmanaged, Refused) and "no controller state" in unmanaged.why


def test_the_in_sync_set_changes_only_at_its_epoch_and_keeps_the_master() -> None:
    shrunk = control.set_isr(START, "broker-a", 3, [2, 0, 2], "slave 1 fell behind")
    stale = control.set_isr(START, "broker-a", 2, [0], "old report")
    masterless = control.set_isr(START, "broker-a", 3, [1, 2], "no master")
    unchanged = control.set_isr(START, "broker-a", 3, [0, 1, 2], "same")

    assert shrunk == GroupControl("broker-a", 3, 0, (0, 2), "slave 1 fell behind")
    assert isinstance(stale, Refused) and "not 2" in stale.why
    assert isinstance(masterless, Refused) and "must hold the master 0" in masterless.why
    assert isinstance(unchanged, Refused)
