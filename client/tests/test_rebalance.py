"""Rebalance diffing and membership merging."""

from __future__ import annotations

from metaq.client.rebalance import Member, merge_members, plan_rebalance


def test_the_plan_starts_new_queues_stops_lost_ones_and_keeps_the_rest() -> None:
    current = {("t", "a", 0): "a:1", ("t", "a", 1): "a:1", ("t", "b", 0): "b:1"}
    target = {("t", "a", 1): "a:1", ("t", "b", 0): "b:1", ("t", "b", 1): "b:1"}

    plan = plan_rebalance(current, target)

    assert plan.added == {("t", "b", 1): "b:1"}
    assert plan.removed == (("t", "a", 0),)
    assert plan.rerouted == {}
    assert not plan.unchanged


def test_a_queue_whose_broker_moved_is_rerouted_not_restarted() -> None:
    plan = plan_rebalance({("t", "a", 0): "old:1"}, {("t", "a", 0): "new:1"})

    assert (plan.added, plan.removed) == ({}, ())
    assert plan.rerouted == {("t", "a", 0): "new:1"}


def test_the_same_assignment_changes_nothing() -> None:
    queues = {("t", "a", q): "a:1" for q in range(4)}

    assert plan_rebalance(queues, dict(queues)).unchanged


def test_losing_every_queue_stops_every_loop() -> None:
    plan = plan_rebalance({("t", "a", 0): "a:1", ("t", "a", 1): "a:1"}, {})

    assert set(plan.removed) == {("t", "a", 0), ("t", "a", 1)}
    assert plan.added == {}


def test_members_are_the_sorted_union_of_the_brokers_answers() -> None:
    broker_a = [Member("c1", "r1"), Member("c3", "r1")]
    broker_b = [Member("c2", "r2"), Member("c1", "r1")]

    assert merge_members([broker_a, broker_b]) == (
        Member("c1", "r1"),
        Member("c2", "r2"),
        Member("c3", "r1"),
    )


def test_a_member_reported_in_two_rooms_gets_the_same_room_whatever_the_order() -> None:
    one = [Member("c1", "r1")]
    other = [Member("c1", "r2")]

    assert merge_members([one, other]) == merge_members([other, one]) == (Member("c1", "r2"),)
