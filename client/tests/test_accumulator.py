"""The accumulator's batching rules: lone sends go at once, piled-up sends coalesce for at
most the linger, full batches go at once, in-flight limits hold."""

from __future__ import annotations

import pytest

from metaq.client.accumulator import Accumulator
from metaq.common.model import QueueRoute

Q0 = QueueRoute("broker-a", "127.0.0.1:1", 0, "r1")
Q1 = QueueRoute("broker-a", "127.0.0.1:1", 1, "r1")


def test_a_lone_send_goes_at_once_without_waiting_for_the_linger() -> None:
    acc = Accumulator(linger_s=0.005)
    batch, index = acc.append("t", Q0, b"a", now=0.0)

    assert index == 0
    assert acc.ready(now=0.0) == [batch]
    assert acc.pending_records == 0


def test_sends_of_one_loop_turn_to_one_queue_share_a_batch() -> None:
    acc = Accumulator(linger_s=0.005)
    for n in range(10):
        batch, index = acc.append("t", Q0, b"x", now=0.0)
        assert index == n

    (ready,) = acc.ready(now=0.0)
    assert len(ready) == 10 and ready is batch


def test_different_queues_and_topics_get_different_batches() -> None:
    acc = Accumulator()
    a, _ = acc.append("t", Q0, b"x", now=0.0)
    b, _ = acc.append("t", Q1, b"x", now=0.0)
    c, _ = acc.append("u", Q0, b"x", now=0.0)

    assert {id(x) for x in acc.ready(now=0.0)} == {id(a), id(b), id(c)}


def test_sends_piling_up_behind_a_batch_in_flight_wait_at_most_the_linger() -> None:
    acc = Accumulator(linger_s=0.005)
    first, _ = acc.append("t", Q0, b"x", now=0.0)
    assert acc.ready(now=0.0) == [first]  # now in flight

    second, _ = acc.append("t", Q0, b"y", now=0.001)
    acc.append("t", Q0, b"z", now=0.002)

    assert acc.ready(now=0.003) == []  # held: the first is in flight, linger not over
    assert acc.next_deadline() == pytest.approx(0.006)
    assert acc.ready(now=0.006) == [second]
    assert len(second) == 2


def test_an_answer_releases_the_held_batch_before_the_linger_ends() -> None:
    acc = Accumulator(linger_s=1.0)
    first, _ = acc.append("t", Q0, b"x", now=0.0)
    acc.ready(now=0.0)
    second, _ = acc.append("t", Q0, b"y", now=0.0)
    assert acc.ready(now=0.001) == []

    acc.done(first)

    assert acc.ready(now=0.002) == [second]


def test_a_full_batch_goes_at_once_even_with_a_batch_in_flight() -> None:
    acc = Accumulator(max_records=3, linger_s=10.0)
    acc.append("t", Q0, b"x", now=0.0)
    acc.ready(now=0.0)

    batches = {id(acc.append("t", Q0, b"y", now=0.0)[0]) for _ in range(4)}

    ready = acc.ready(now=0.0)
    assert len(batches) == 2
    assert [len(b) for b in ready] == [3]  # the full one; the fourth record lingers


def test_max_bytes_closes_a_batch_before_it_would_overflow() -> None:
    acc = Accumulator(max_bytes=10, linger_s=10.0)
    acc.append("t", Q0, b"x", now=0.0)
    acc.ready(now=0.0)  # something in flight, so open batches linger

    a, _ = acc.append("t", Q0, b"123456", now=0.0)
    b, _ = acc.append("t", Q0, b"123456", now=0.0)

    assert a is not b
    assert acc.ready(now=0.0) == [a]


def test_in_flight_batches_per_queue_are_bounded() -> None:
    acc = Accumulator(max_records=1, max_in_flight=2)
    for _ in range(5):
        acc.append("t", Q0, b"x", now=0.0)

    first = acc.ready(now=0.0)
    assert len(first) == 2
    assert acc.ready(now=1.0) == []
    acc.done(first[0])
    assert len(acc.ready(now=1.0)) == 1


def test_flush_ignores_the_linger() -> None:
    acc = Accumulator(linger_s=10.0)
    acc.append("t", Q0, b"x", now=0.0)
    acc.ready(now=0.0)
    held, _ = acc.append("t", Q0, b"y", now=0.0)

    assert acc.ready(now=0.0, flush=True) == [held]


def test_one_way_batches_are_kept_apart_and_never_count_as_in_flight() -> None:
    acc = Accumulator(max_in_flight=1)
    normal, _ = acc.append("t", Q0, b"x", now=0.0)
    one_way, _ = acc.append("t", Q0, b"y", now=0.0, one_way=True)
    assert normal is not one_way

    assert len(acc.ready(now=0.0)) == 2
    again, _ = acc.append("t", Q0, b"z", now=0.0, one_way=True)
    assert acc.ready(now=0.0) == [again]


def test_drain_all_takes_what_was_never_sent() -> None:
    acc = Accumulator(max_records=2, linger_s=10.0)
    acc.append("t", Q0, b"x", now=0.0)
    acc.ready(now=0.0)
    for _ in range(3):
        acc.append("t", Q0, b"y", now=0.0)

    assert sum(len(b) for b in acc.drain_all()) == 3
    assert acc.pending_records == 0
