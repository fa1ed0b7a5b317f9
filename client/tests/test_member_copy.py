"""A consumer's copy of a broker's member list, brought up to date by heartbeat answers."""

from __future__ import annotations

from metaq.client.membership import BrokerCopy
from metaq.client.rebalance import Holdings, Member
from metaq.common.v1.data_pb2 import ConsumerHeartbeatResponse, ConsumerMember, HeldQueue


def _member(client_id: str, version: int = 0, *queues: int) -> ConsumerMember:
    return ConsumerMember(
        client_id=client_id,
        computer_room="default",
        holdings_version=version,
        held=[HeldQueue(topic="t", broker_name="b", queue_id=q) for q in queues],
    )


def test_changes_apply_on_the_copy_and_a_whole_answer_replaces_it() -> None:
    copy = BrokerCopy()
    copy.apply(
        ConsumerHeartbeatResponse(
            members=[_member("a", 1, 0), _member("b"), _member("c", 1, 1)], epoch=7, seq=3
        ),
        0,
    )
    copy.apply(
        ConsumerHeartbeatResponse(
            members=[_member("c", 2, 1, 2), _member("d")],
            departed=["b"],
            epoch=7,
            seq=6,
            changes_only=True,
        ),
        3,
    )
    members, holdings = copy.listed()
    assert [m.client_id for m in members] == ["a", "c", "d"]
    assert holdings == {
        "a": Holdings(1, (("t", "b", 0),)),
        "c": Holdings(2, (("t", "b", 1), ("t", "b", 2))),
    }
    assert (copy.epoch, copy.seq) == (7, 6)

    # The broker restarted: its whole list, under a new epoch, replaces the copy.
    copy.apply(ConsumerHeartbeatResponse(members=[_member("a")], epoch=9, seq=1), 6)
    assert copy.listed() == ([Member("a", "default")], {})


def test_an_answer_older_than_the_copy_is_passed_over() -> None:
    copy = BrokerCopy()
    copy.apply(ConsumerHeartbeatResponse(members=[_member("a")], epoch=7, seq=5), 0)
    # Two heartbeats overlapped: the one asked from 5 answered first, to 8.
    copy.apply(
        ConsumerHeartbeatResponse(members=[_member("b")], epoch=7, seq=8, changes_only=True), 5
    )
    # The other, asked from 5 too, answers up to 7 only: older than the copy.
    copy.apply(ConsumerHeartbeatResponse(departed=["b"], epoch=7, seq=7, changes_only=True), 5)
    assert [m.client_id for m in copy.listed()[0]] == ["a", "b"]
    # Changes counted from a copy of another epoch are passed over too.
    copy.apply(ConsumerHeartbeatResponse(departed=["a"], epoch=3, seq=9, changes_only=True), 8)
    assert [m.client_id for m in copy.listed()[0]] == ["a", "b"]
