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

    members = groups.heartbeat("g", "c-2", connection_id=3, subscriptions=[("t", "*")])

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
    assert groups.heartbeat("g", "a", leaving=True) == []


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
    members = groups.heartbeat("g", "a", held=[("t", "b1", 1)], holdings_version=2)

    assert [(m.client_id, m.held, m.holdings_version) for m in members] == [
        ("a", (("t", "b1", 1),), 2),
        ("b", (), 0),
    ]
    with pytest.raises(InvalidMessage, match="holdings_version of 1 or more"):
        groups.heartbeat("g", "a", held=[("t", "b1", 1)])
    with pytest.raises(InvalidMessage, match="topic"):
        groups.heartbeat("g", "a", held=[("bad topic!", "b1", 1)], holdings_version=3)
