"""Rebalance diffing and membership merging."""

from __future__ import annotations

from metaq.client.rebalance import Holdings, Member, merge_holdings, merge_members, plan_rebalance


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


def test_each_members_latest_report_of_its_queues_wins_whatever_broker_answered_it() -> None:
    old = Holdings(1, (("t", "b", 0),))
    new = Holdings(2, (("t", "b", 1),))
    only_b = Holdings(1, (("t", "b", 2),))

    merged = merge_holdings([{"c1": old}, {"c1": new, "c2": only_b}])

    assert merged == merge_holdings([{"c1": new, "c2": only_b}, {"c1": old}])
    assert merged == {"c1": new, "c2": only_b}


def test_a_restarted_member_counting_from_one_again_merges_alike_everywhere() -> None:
    before = Holdings(1, (("t", "b", 0),))
    after = Holdings(1, (("t", "b", 3),))

    assert merge_holdings([{"c": before}, {"c": after}]) == {"c": after}
    assert merge_holdings([{"c": after}, {"c": before}]) == {"c": after}
