"""Consumer group membership: sorted members, expiry, dropped connections, leaving."""

from __future__ import annotations

import pytest

from metaq.broker.consumers import ConsumerGroups
from metaq.common.errors import InvalidMessage
from metaq.common.model import ConsumeMode


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ids(groups: ConsumerGroups, group: str) -> list[str]:
    return [m.client_id for m in groups.members(group)]


def test_members_are_sorted_by_client_id_whoever_heartbeats_first() -> None:
    groups = ConsumerGroups(timeout_s=30)
    groups.heartbeat("g", "c-3", connection_id=1)
    groups.heartbeat("g", "c-1", connection_id=2, computer_room="hz", mode=ConsumeMode.CLUSTERING)

    groups.heartbeat("g", "c-2", connection_id=3, subscriptions=[("t", "*")])
    members = groups.members("g")

    assert [m.client_id for m in members] == ["c-1", "c-2", "c-3"]
    assert members[0].computer_room == "hz"
    assert members[1].subscriptions == (("t", "*"),)
    groups.heartbeat("g", "c-4", connection_id=4, host="10.0.0.7")
    assert groups.members("g")[-1].host == "10.0.0.7"


def test_a_member_silent_past_the_timeout_is_dropped() -> None:
    clock = FakeClock()
    groups = ConsumerGroups(timeout_s=30, clock=clock)
    groups.heartbeat("g", "quiet")
    groups.heartbeat("g", "chatty")

    clock.now += 20
    groups.heartbeat("g", "chatty")
    clock.now += 15

    assert ids(groups, "g") == ["chatty"]
    clock.now += 31
    groups.expire()
    assert groups.groups() == {}


def test_members_leave_with_their_connection_or_when_they_say_so() -> None:
    groups = ConsumerGroups(timeout_s=30)
    groups.heartbeat("g", "a", connection_id=1)
    groups.heartbeat("g", "b", connection_id=2)
    groups.heartbeat("h", "b", connection_id=2)

    assert groups.drop_connection(2) == 2
    assert ids(groups, "g") == ["a"]
    assert ids(groups, "h") == []
    groups.heartbeat("g", "a", leaving=True)
    assert groups.members("g") == []


def test_a_member_that_moved_to_another_connection_stays_when_the_old_one_closes() -> None:
    groups = ConsumerGroups(timeout_s=30)
    groups.heartbeat("g", "a", connection_id=1)
    groups.heartbeat("g", "a", connection_id=2)

    groups.drop_connection(1)

    assert ids(groups, "g") == ["a"]


@pytest.mark.parametrize(("group", "client"), [("bad group", "c"), ("g", ""), ("g", "x" * 256)])
def test_bad_names_are_refused(group: str, client: str) -> None:
    with pytest.raises(InvalidMessage):
        ConsumerGroups(timeout_s=30).heartbeat(group, client)


def test_a_queue_is_owned_by_the_live_member_that_pulled_it_last() -> None:
    clock = FakeClock()
    groups = ConsumerGroups(timeout_s=30, clock=clock)
    groups.heartbeat("g", "c-1", connection_id=1)
    groups.heartbeat("g", "c-2", connection_id=2)
    assert groups.owner("g", "t", 0) is None  # nobody pulled it yet
    groups.pulled("g", "t", 0, connection_id=1)
    assert groups.owner("g", "t", 0) == "c-1"
    groups.pulled("g", "t", 0, connection_id=2)  # a rebalance gave it to c-2
    assert groups.owner("g", "t", 0) == "c-2"
    groups.drop_connection(2)
    assert groups.owner("g", "t", 0) is None  # its reader is gone
    groups.pulled("g", "t", 1, connection_id=1)
    clock.now += 31
    groups.heartbeat("g", "c-1", connection_id=1)
    assert groups.owner("g", "t", 1) is None  # not pulled for longer than the timeout
    groups.expire()
    assert groups._pulls == {}


def test_every_change_of_a_groups_member_set_is_heard_and_nothing_else() -> None:
    clock = FakeClock()
    groups = ConsumerGroups(timeout_s=30, clock=clock)
    heard: list[tuple[str, int]] = []
    groups.on_change = lambda group, cause: heard.append((group, cause))

    groups.heartbeat("g", "a", connection_id=1)
    groups.heartbeat("g", "b", connection_id=2)
    groups.heartbeat("g", "a", connection_id=1)  # a heartbeat: no change
    groups.heartbeat("g", "a", connection_id=3)  # moved connection: no change
    groups.heartbeat("g", "nobody", connection_id=4, leaving=True)  # not a member
    assert heard == [("g", 1), ("g", 2)]

    groups.heartbeat("g", "b", connection_id=2, leaving=True)
    groups.heartbeat("g", "c", connection_id=5)
    groups.drop_connection(5)
    clock.now += 31
    groups.expire()
    assert heard[2:] == [("g", 2), ("g", 5), ("g", 0), ("g", 0)]
    assert groups.groups() == {}


def test_a_members_report_of_its_queues_replaces_the_last_and_is_refused_without_a_version() -> (
    None
):
    groups = ConsumerGroups(timeout_s=30)
    groups.heartbeat("g", "a", held=[("t", "b1", 0), ("t", "b1", 1)], holdings_version=1)
    groups.heartbeat("g", "b")
    groups.heartbeat("g", "a", held=[("t", "b1", 1)], holdings_version=2)
    members = groups.members("g")

    assert [(m.client_id, m.held, m.holdings_version) for m in members] == [
        ("a", (("t", "b1", 1),), 2),
        ("b", (), 0),
    ]
    with pytest.raises(InvalidMessage, match="holdings_version of 1 or more"):
        groups.heartbeat("g", "a", held=[("t", "b1", 1)])
    with pytest.raises(InvalidMessage, match="topic"):
        groups.heartbeat("g", "a", held=[("bad topic!", "b1", 1)], holdings_version=3)


def test_a_copy_at_a_sequence_number_gets_only_the_entries_and_departures_newer_than_it() -> None:
    clock = FakeClock()
    groups = ConsumerGroups(timeout_s=30, clock=clock, epoch=7)
    groups.heartbeat("g", "a", held=[("t", "b1", 0)], holdings_version=1)
    groups.heartbeat("g", "b", held=[("t", "b1", 1)], holdings_version=1)
    groups.heartbeat("g", "c")
    copy = groups.changes("g")
    assert copy.whole and copy.epoch == 7 and not copy.departed
    assert [m.client_id for m in copy.members] == ["a", "b", "c"]

    # Heartbeats that change nothing the answers list leave the copy up to date.
    groups.heartbeat("g", "a", held=[("t", "b1", 0)], holdings_version=1)
    groups.heartbeat("g", "c", subscriptions=[("t", "*")])
    unchanged = groups.changes("g", 7, copy.seq)
    assert (unchanged.whole, unchanged.members, unchanged.departed) == (False, [], [])
    assert unchanged.seq == copy.seq

    groups.heartbeat("g", "b", held=[("t", "b1", 1), ("t", "b1", 2)], holdings_version=2)
    groups.heartbeat("g", "c", leaving=True)
    groups.heartbeat("g", "d", computer_room="hz")
    delta = groups.changes("g", 7, copy.seq)
    assert not delta.whole
    assert [(m.client_id, m.holdings_version) for m in delta.members] == [("b", 2), ("d", 0)]
    assert delta.departed == ["c"]
    assert groups.changes("g", 7, delta.seq).members == []

    # A room change is a change; an expiry is a departure like a leave.
    groups.heartbeat("g", "a", computer_room="sh", held=[("t", "b1", 0)], holdings_version=1)
    clock.now += 20
    groups.heartbeat("g", "a", computer_room="sh", held=[("t", "b1", 0)], holdings_version=1)
    groups.heartbeat("g", "b", held=[("t", "b1", 1), ("t", "b1", 2)], holdings_version=2)
    clock.now += 15
    groups.expire()  # the broker's expiry service, every quarter of the timeout
    later = groups.changes("g", 7, delta.seq)
    assert [m.client_id for m in later.members] == ["a"]
    assert later.departed == ["d"]


def test_a_copy_from_another_epoch_or_older_than_the_departures_kept_gets_the_whole_list() -> None:
    clock = FakeClock()
    groups = ConsumerGroups(timeout_s=30, clock=clock, epoch=7)
    groups.heartbeat("g", "a", held=[("t", "b1", 0)], holdings_version=1)
    groups.heartbeat("g", "b")
    copy = groups.changes("g", 7, 0)
    assert copy.whole  # a first heartbeat names no copy

    restarted = ConsumerGroups(timeout_s=30, clock=clock, epoch=8)
    restarted.heartbeat("g", "a", held=[("t", "b1", 0)], holdings_version=1)
    assert restarted.changes("g", 7, copy.seq).whole
    assert [m.client_id for m in restarted.changes("g", 7, copy.seq).members] == ["a"]
    assert ConsumerGroups(timeout_s=30).epoch != ConsumerGroups(timeout_s=30).epoch

    # "b" leaves; once its departure is older than the timeout the broker forgets it, and
    # a copy that still lists "b" can only be answered whole.
    groups.heartbeat("g", "b", leaving=True)
    clock.now += 20
    groups.heartbeat("g", "a", held=[("t", "b1", 0)], holdings_version=1)
    assert groups.changes("g", 7, copy.seq).departed == ["b"]
    clock.now += 15
    groups.heartbeat("g", "a", held=[("t", "b1", 0)], holdings_version=1)
    groups.expire()
    stale = groups.changes("g", 7, copy.seq)
    assert stale.whole and [m.client_id for m in stale.members] == ["a"]

    # A group forgotten (every member gone) and formed again: copies from before it
    # lack the departures and get the whole list.
    before = groups.changes("g", 7, 0).seq
    groups.heartbeat("g", "a", leaving=True)
    clock.now += 31
    groups.expire()
    groups.heartbeat("g", "e")
    again = groups.changes("g", 7, before)
    assert again.whole and [m.client_id for m in again.members] == ["e"]
    assert groups.changes("g", 7, before + 1000).whole  # a copy from the future: whole
