"""The role machine in-process: each event's state change and commands, with times passed
in. The failover-safety rules are here: stale epochs ignored, promotion only once the
store is a writer, the controller's lease and a switchover's fence refusing writes, a
controlled slave reading no further than its master confirmed, and demotion."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import pytest

from metaq.broker.role_machine import (
    Announce,
    ApplyInTurn,
    BecomeWriter,
    CommitInSync,
    Follow,
    Heard,
    HoldOffQueueLocks,
    HoldUnjournaled,
    Log,
    Role,
    RoleMachine,
    RoleSettings,
    StopServingSlaves,
    TookUp,
    WriteJournal,
    restored_confirmed,
)
from metaq.common.errors import NotMaster
from metaq.common.model import GroupControl

ME = 1
LEASE_MS = 3000
MASTER_ADDRESS = "10.0.0.2:10911"
OTHER_ADDRESS = "10.0.0.3:10911"


@dataclasses.dataclass
class Slaves:
    """A master's replica set as the lease rule sees it."""

    electable_ids: frozenset[int] = frozenset({ME})
    fetched_within_lease: bool = False

    def electable(self) -> Collection[int]:
        return self.electable_ids

    def followed_within(self, seconds: float) -> bool:
        assert seconds == LEASE_MS / 1e3
        return self.fetched_within_lease


def machine(
    *, controlled: bool = True, sync: bool = False, configured_master: bool = True, epoch: int = 0
) -> RoleMachine:
    settings = RoleSettings(
        broker_name="broker-a",
        broker_id=ME,
        controlled=controlled,
        sync=sync,
        master_lease_ms=LEASE_MS,
    )
    return RoleMachine(settings, configured_master=configured_master, epoch=epoch)


def control(
    epoch: int, master_id: int, address: str = "", in_sync: tuple[int, ...] = ()
) -> GroupControl:
    return GroupControl(
        "broker-a", epoch, master_id, in_sync_ids=in_sync, master_data_address=address
    )


def answer(
    ctl: GroupControl | None, *, sent_at: float | None = 100.0, lease_granted: bool = True
) -> Heard:
    return Heard(control=ctl, lease_granted=lease_granted, master_address="", sent_at=sent_at)


def promoted(m: RoleMachine, epoch: int, *, end: int = 0) -> list[object]:
    """Elect ``m`` in ``epoch`` and report its store caught up; the commands of both."""
    commands: list[object] = list(m.on_control(control(epoch, ME, in_sync=(ME,))))
    commands += m.on_caught_up(epoch, end, crashed=False)
    return commands


def following(m: RoleMachine, epoch: int, address: str = MASTER_ADDRESS) -> RoleMachine:
    m.on_control(control(epoch, 2, address))
    return m


# --- starting ---------------------------------------------------------------------------


def test_a_deployed_master_without_failover_becomes_writer_in_its_last_epoch_on_start() -> None:
    m = machine(controlled=False, epoch=0)
    assert m.role is Role.MASTER
    assert m.on_start() == [Follow("", 0), BecomeWriter(0, ())]
    assert not BecomeWriter(0, ()).begins_epoch  # epoch 0 was never elected: no history entry
    assert BecomeWriter(4, ()).begins_epoch


def test_a_deployed_slave_starts_following_no_one_and_holds_commits() -> None:
    m = machine(controlled=False, configured_master=False, epoch=3)
    assert m.on_start() == []
    assert (m.role, m.epoch, m.master_address) == (Role.SLAVE, 3, "")
    assert m.holds_commits


def test_a_controlled_broker_starts_as_a_slave_taking_no_writes_whatever_its_config() -> None:
    m = machine(controlled=True, configured_master=True, epoch=7)
    assert m.on_start() == []
    assert m.role is Role.SLAVE
    with pytest.raises(NotMaster, match=r"not the master of its group \(epoch 7\)"):
        m.check_master(0.0, Slaves())


# --- what the nameservers say ---------------------------------------------------------------


def test_a_slave_without_failover_follows_the_master_its_nameserver_names() -> None:
    m = machine(controlled=False, configured_master=False)
    heard = Heard(control=None, lease_granted=False, master_address=MASTER_ADDRESS, sent_at=1.0)
    assert m.on_heard(heard) == [Follow(MASTER_ADDRESS, None)]  # the follower's own epoch
    assert m.master_address == MASTER_ADDRESS
    assert m.followed
    empty = dataclasses.replace(heard, master_address="")
    assert m.on_heard(empty) == []
    assert m.master_address == MASTER_ADDRESS


def test_a_master_without_failover_ignores_the_master_address_in_answers() -> None:
    m = machine(controlled=False)
    heard = Heard(control=None, lease_granted=False, master_address=OTHER_ADDRESS, sent_at=1.0)
    assert m.on_heard(heard) == []
    assert (m.role, m.master_address, m.followed) == (Role.MASTER, "", False)


def test_a_controlled_broker_applies_every_control_it_hears_in_turn_and_nothing_else() -> None:
    m = machine()
    assert m.on_heard(answer(None)) == []
    stale = control(0, 2, MASTER_ADDRESS)
    assert m.on_heard(answer(stale)) == [ApplyInTurn(stale)]
    # Heard is not applied: the state moves only when the control's turn comes.
    assert (m.role, m.epoch, m.master_address) == (Role.SLAVE, 0, "")


def test_only_the_leaders_answer_to_a_heartbeat_naming_this_master_extends_the_lease() -> None:
    m = machine(epoch=4)
    mine = control(4, ME)
    m.on_heard(answer(mine, sent_at=None))  # pushed news: no heartbeat it answers
    m.on_heard(answer(mine, sent_at=100.0, lease_granted=False))  # not the Raft leader
    m.on_heard(answer(control(4, 2), sent_at=100.0))  # someone else is master
    m.on_heard(answer(control(3, ME), sent_at=100.0))  # an election older than ours
    assert m.lease_until == 0.0
    m.on_heard(answer(mine, sent_at=100.0))
    assert m.lease_until == 100.0 + LEASE_MS / 1e3
    m.on_heard(answer(control(5, ME), sent_at=90.0))  # an answer overtaken by a later one
    assert m.lease_until == 100.0 + LEASE_MS / 1e3  # never moves back


# --- promotion ------------------------------------------------------------------------------


def test_a_control_from_an_older_epoch_changes_nothing() -> None:
    m = following(machine(epoch=5), 5)
    assert m.on_control(control(4, ME, in_sync=(ME, 2))) == []
    assert m.on_control(control(4, 3, OTHER_ADDRESS)) == []
    assert (m.role, m.epoch, m.master_address) == (Role.SLAVE, 5, MASTER_ADDRESS)


def test_an_elected_slave_stops_copying_and_takes_no_writes_until_its_store_caught_up() -> None:
    m = following(machine(epoch=2), 2)
    commands = m.on_control(control(3, ME, in_sync=(ME, 2)))
    assert commands == [Follow("", 3), BecomeWriter(3, (ME, 2)), CommitInSync((ME, 2))]
    # While the copied records are dispatched it is still a slave of epoch 2.
    assert (m.role, m.epoch, m.master_address) == (Role.SLAVE, 2, MASTER_ADDRESS)
    with pytest.raises(NotMaster):
        m.check_master(0.0, Slaves())


def test_caught_up_makes_the_broker_master_of_the_new_epoch_then_journals_and_announces() -> None:
    m = machine(controlled=False, configured_master=False, epoch=2)
    commands = m.on_caught_up(3, 4096, crashed=False)
    assert (m.role, m.epoch, m.master_address) == (Role.MASTER, 3, "")
    assert not m.holds_commits
    assert commands == [
        Log("master of broker-a in epoch 3 from offset 4096"),
        TookUp(3),
        WriteJournal(),
        Announce(),
    ]
    assert m.check_master(0.0, Slaves()) is not None


def test_a_new_master_holds_off_queue_locks_after_following_another_or_a_crash() -> None:
    fresh = machine(controlled=False)
    assert HoldOffQueueLocks() not in fresh.on_caught_up(0, 0, crashed=False)
    crashed = machine(controlled=False)
    assert crashed.on_caught_up(0, 0, crashed=True)[0] == HoldOffQueueLocks()
    follower = following(machine(), 1)
    assert follower.followed
    assert follower.on_caught_up(2, 0, crashed=False)[0] == HoldOffQueueLocks()


def test_a_master_confirmed_in_its_epoch_only_takes_the_committed_in_sync_set() -> None:
    m = machine()
    promoted(m, 3)
    assert m.on_control(control(3, ME, in_sync=(ME, 2))) == [CommitInSync((ME, 2))]
    assert m.on_control(control(3, ME)) == [CommitInSync(())]
    assert (m.role, m.epoch) == (Role.MASTER, 3)


def test_a_master_re_elected_in_a_newer_epoch_becomes_writer_again_in_it() -> None:
    m = machine()
    promoted(m, 3)
    assert m.on_control(control(4, ME, in_sync=(ME,))) == [
        Follow("", 4),
        BecomeWriter(4, (ME,)),
        CommitInSync((ME,)),
    ]
    assert (m.role, m.epoch) == (Role.MASTER, 3)  # until the store reports caught up


def test_a_promotion_that_fails_before_caught_up_is_retried_on_the_next_control() -> None:
    m = following(machine(epoch=2), 2)
    m.on_control(control(3, ME))  # BecomeWriter fails: on_caught_up never comes
    assert m.on_control(control(3, ME)) == [Follow("", 3), BecomeWriter(3, ()), CommitInSync(())]


# --- demotion -------------------------------------------------------------------------------


def test_a_demoted_master_refuses_writes_at_once_and_stops_serving_its_slaves() -> None:
    m = machine()
    promoted(m, 3)
    commands = m.on_control(control(4, 2, MASTER_ADDRESS))
    assert commands == [
        StopServingSlaves(),
        HoldUnjournaled(),
        Follow(MASTER_ADDRESS, 4),
        TookUp(4),
        Log(f"demoted to slave of broker-a in epoch 4, following {MASTER_ADDRESS}"),
        Announce(),
    ]
    assert (m.role, m.epoch, m.master_address) == (Role.SLAVE, 4, MASTER_ADDRESS)
    assert m.holds_commits
    with pytest.raises(NotMaster) as refused:
        m.check_master(0.0, Slaves())
    assert refused.value.master_address == MASTER_ADDRESS
    assert f"its master is {MASTER_ADDRESS}" in str(refused.value)


def test_a_master_deposed_in_its_own_epoch_steps_down_too() -> None:
    m = machine()
    promoted(m, 3)
    assert m.on_control(control(3, 2, MASTER_ADDRESS))[:2] == [
        StopServingSlaves(),
        HoldUnjournaled(),
    ]
    assert m.role is Role.SLAVE


def test_a_slave_follows_a_new_master_address_or_epoch_and_nothing_else() -> None:
    m = following(machine(epoch=1), 1)
    assert m.on_control(control(1, 2, MASTER_ADDRESS)) == []  # nothing new
    moved = m.on_control(control(1, 3, OTHER_ADDRESS))
    assert HoldUnjournaled() not in moved  # it journaled nothing as master
    assert Follow(OTHER_ADDRESS, 1) in moved
    assert Follow(OTHER_ADDRESS, 2) in m.on_control(control(2, 3, OTHER_ADDRESS))
    assert (m.epoch, m.master_address) == (2, OTHER_ADDRESS)


def test_with_the_master_lost_a_slave_keeps_its_last_master_in_the_new_epoch() -> None:
    m = following(machine(epoch=1), 1)
    commands = m.on_control(control(2, -1))  # no master named: none electable yet
    assert Follow(MASTER_ADDRESS, 2) in commands
    assert (m.role, m.epoch, m.master_address) == (Role.SLAVE, 2, MASTER_ADDRESS)


def test_a_master_told_there_is_no_master_stops_and_follows_no_one() -> None:
    m = machine()
    promoted(m, 3)
    commands = m.on_control(control(4, -1))
    assert Follow("", 4) in commands
    assert Log("demoted to slave of broker-a in epoch 4, following (master not known yet)") in (
        commands
    )
    assert (m.role, m.master_address, m.followed) == (Role.SLAVE, "", False)


# --- the controller's lease and a switchover's fence ----------------------------------------


def test_a_controlled_master_past_its_lease_refuses_writes_while_another_could_be_elected() -> None:
    m = machine()
    promoted(m, 3)
    m.on_heard(answer(control(3, ME), sent_at=100.0))
    slaves = Slaves(electable_ids=frozenset({ME, 2}))
    assert m.check_master(103.0, slaves) is slaves  # lease until 103.0
    with pytest.raises(NotMaster, match="has not heard the controller confirm it"):
        m.check_master(103.001, slaves)
    # Alone electable: no one can replace it, so it goes on writing cut off.
    assert m.check_master(1e6, Slaves()) is not None


def test_a_sync_master_whose_electable_slaves_still_fetch_needs_no_lease() -> None:
    sync = machine(sync=True)
    promoted(sync, 3)
    copying = Slaves(electable_ids=frozenset({ME, 2}), fetched_within_lease=True)
    assert sync.check_master(1e6, copying) is copying
    with pytest.raises(NotMaster):
        sync.check_master(1e6, dataclasses.replace(copying, fetched_within_lease=False))
    # Under async replication a slave's fetch proves nothing: it may hold less.
    asynchronous = machine(sync=False)
    promoted(asynchronous, 3)
    with pytest.raises(NotMaster):
        asynchronous.check_master(1e6, copying)


def test_a_master_without_failover_never_needs_a_lease() -> None:
    m = machine(controlled=False)
    m.on_caught_up(0, 0, crashed=False)
    assert m.check_master(1e9, Slaves(electable_ids=frozenset({ME, 2, 3}))) is not None


def test_a_switchover_fence_refuses_writes_until_it_ends_or_is_lifted() -> None:
    m = machine(controlled=False)
    m.on_caught_up(0, 0, crashed=False)
    m.fence(2, until=50.0)
    with pytest.raises(NotMaster, match="handing its master role to broker 2"):
        m.check_master(49.9, Slaves())
    assert m.check_master(50.0, Slaves()) is not None
    m.fence(2, until=60.0)
    m.resume()
    assert m.check_master(55.0, Slaves()) is not None


def test_a_new_term_lifts_a_switchover_fence_left_from_the_last() -> None:
    m = machine()
    promoted(m, 3)
    m.on_heard(answer(control(3, ME), sent_at=0.0))
    m.fence(2, until=100.0)
    promoted(m, 4)
    assert m.fenced_until == 0.0
    assert m.check_master(1.0, Slaves()) is not None


# --- what consumers may read ----------------------------------------------------------------


def test_a_master_serves_consumers_what_every_electable_slave_confirmed() -> None:
    m = machine()
    promoted(m, 3)
    assert m.readable_end(master_confirmed=700, slave_confirmed=900, checked_to=None) == 700


def test_a_controlled_slave_reads_no_further_than_its_master_confirmed() -> None:
    m = following(machine(epoch=1), 1)
    assert m.readable_end(master_confirmed=None, slave_confirmed=500, checked_to=None) == 500
    # Also with no master at all: records past it may be cut when another is elected.
    m.on_control(control(2, -1))
    assert m.readable_end(master_confirmed=None, slave_confirmed=500, checked_to=None) == 500


def test_a_slave_without_failover_reads_all_it_holds() -> None:
    m = machine(controlled=False, configured_master=False)
    assert m.readable_end(master_confirmed=None, slave_confirmed=0, checked_to=None) is None


def test_reads_stop_where_a_running_log_check_has_got_to() -> None:
    m = machine()
    assert m.readable_end(master_confirmed=None, slave_confirmed=500, checked_to=300) == 300
    assert m.readable_end(master_confirmed=None, slave_confirmed=200, checked_to=300) == 200
    unchecked = machine(controlled=False, configured_master=False)
    assert unchecked.readable_end(None, 0, checked_to=300) == 300


def test_a_restarted_slave_reads_its_kept_confirmed_offset_but_not_past_its_log() -> None:
    assert restored_confirmed(mark=800, log_end=1000) == 800
    assert restored_confirmed(mark=1200, log_end=1000) == 1000
