"""Queue selection (round robin, sharding) and the broker health tracker (fake clock)."""

from __future__ import annotations

from collections import Counter

import pytest

from metaq.client.errors import NoWritableQueue
from metaq.client.selection import BrokerHealth, RoundRobinSelector, shard_queue
from metaq.testing.client_fakes import static_route

ROUTE = static_route("t", [("broker-a", "127.0.0.1:1", 4), ("broker-b", "127.0.0.1:2", 4)])


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_round_robin_spreads_messages_evenly_over_every_writable_queue() -> None:
    selector = RoundRobinSelector()
    chosen = Counter(selector.select(ROUTE) for _ in range(80))

    assert set(chosen) == set(ROUTE.write_queues)
    assert set(chosen.values()) == {10}


def test_round_robin_passes_over_brokers_to_avoid() -> None:
    selector = RoundRobinSelector()
    chosen = {selector.select(ROUTE, {"broker-a"}).broker_name for _ in range(20)}

    assert chosen == {"broker-b"}


def test_when_every_broker_is_to_be_avoided_a_send_still_goes_somewhere() -> None:
    selector = RoundRobinSelector()
    chosen = {selector.select(ROUTE, {"broker-a", "broker-b"}) for _ in range(8)}

    assert chosen == set(ROUTE.write_queues)


def test_a_route_without_writable_queues_is_a_retriable_error() -> None:
    empty = static_route("t", [])
    with pytest.raises(NoWritableQueue) as caught:
        RoundRobinSelector().select(empty)
    assert caught.value.retriable


def test_a_sharding_key_always_maps_to_the_same_queue() -> None:
    first = [shard_queue(ROUTE, f"order-{n}") for n in range(200)]
    again = [shard_queue(ROUTE, f"order-{n}".encode()) for n in range(200)]
    rebuilt = static_route("t", [("broker-a", "127.0.0.1:1", 4), ("broker-b", "127.0.0.1:2", 4)])

    assert first == again == [shard_queue(rebuilt, f"order-{n}") for n in range(200)]
    # Stable across processes: CRC-32, not Python's salted hash().
    assert shard_queue(ROUTE, "order-1") == ROUTE.write_queues[0xE0B37FEF % 8]
    assert len(set(first)) == 8  # and the keys spread over all queues


def test_a_failed_broker_is_isolated_until_the_isolation_runs_out() -> None:
    clock = FakeClock()
    health = BrokerHealth(failure_isolation_s=10.0, clock=clock)

    health.failed("broker-a")
    assert health.isolated() == {"broker-a"}
    clock.now += 9.9
    assert not health.available("broker-a")
    clock.now += 0.2
    assert health.isolated() == frozenset()


def test_a_slow_answer_isolates_a_broker_and_a_fast_one_ends_the_isolation() -> None:
    clock = FakeClock()
    health = BrokerHealth(clock=clock)

    health.answered("broker-a", 0.01)
    assert health.available("broker-a")
    health.answered("broker-a", 1.5)
    assert not health.available("broker-a")
    health.answered("broker-a", 0.002)
    assert health.available("broker-a")


def test_a_failed_groups_isolation_ends_when_the_route_shows_a_successor() -> None:
    clock = FakeClock()
    health = BrokerHealth(failure_isolation_s=10.0, clock=clock)
    health.failed("broker-a", "127.0.0.1:1")

    assert health.isolated(ROUTE) == {"broker-a"}  # the route still shows the dead master
    moved = static_route("t", [("broker-a", "127.0.0.1:9", 4), ("broker-b", "127.0.0.1:2", 4)])
    assert health.isolated(moved) == frozenset()


def test_a_failed_group_shown_without_a_master_is_back_with_whoever_is_routed_next() -> None:
    clock = FakeClock()
    health = BrokerHealth(failure_isolation_s=10.0, clock=clock)
    health.failed("broker-a", "127.0.0.1:1")
    masterless = static_route("t", [("broker-a", "", 4), ("broker-b", "127.0.0.1:2", 4)])

    assert masterless.masterless and not ROUTE.masterless
    assert health.isolated(masterless) == {"broker-a"}
    # The same broker master again (restarted, or re-elected): no longer the dead one.
    assert health.isolated(ROUTE) == frozenset()
