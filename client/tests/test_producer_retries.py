"""The producer against in-process fake brokers: retries go to another broker group and
skip groups that failed recently (fake clock, no real back-off sleeps); errors that are
not retriable surface at once; sharded sends never move; one bad message in a coalesced
batch fails alone."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from typing import cast

import pytest

from metaq.client.errors import BrokerError, ConnectionLost
from metaq.client.producer import Producer
from metaq.client.results import SendStatus
from metaq.client.routes import RouteCache
from metaq.client.selection import RoundRobinSelector
from metaq.common.errors import ErrorCode
from metaq.common.model import QueueRoute, TopicRoute
from metaq.testing.client_fakes import Drop, Fail, FakeBroker, SendSeen, StaticRoutes
from metaq.testing.waiting import run_async


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Sleeps:
    """Records back-off sleeps instead of sleeping."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.seen.append(seconds)


def _always_fail(code: ErrorCode, retriable: bool = True) -> Callable[[SendSeen], Fail]:
    return lambda _seen: Fail(code, f"{code.name} from the script", retriable)


async def _with_producer(
    brokers: list[FakeBroker],
    queues: int,
    body: Callable[[Producer, FakeClock, Sleeps], Awaitable[None]],
    **settings: object,
) -> None:
    for broker in brokers:
        await broker.start()
    routes = StaticRoutes({"t": [(b.name, b.address, queues) for b in brokers]})
    clock, sleeps = FakeClock(), Sleeps()
    producer = Producer(
        [],
        routes=cast(RouteCache, routes),
        clock=clock,
        sleep=sleeps,
        **settings,  # type: ignore[arg-type]
    )
    try:
        await producer.start()
        await body(producer, clock, sleeps)
    finally:
        await producer.close()
        for broker in brokers:
            await broker.stop()


def test_a_retriable_failure_is_retried_at_once_on_another_broker_group() -> None:
    a = FakeBroker("broker-a", _always_fail(ErrorCode.STORE_UNAVAILABLE))
    b = FakeBroker("broker-b")

    async def body(producer: Producer, _clock: FakeClock, sleeps: Sleeps) -> None:
        result = await producer.send("t", b"hello")  # round robin starts on broker-a

        assert result.broker == "broker-b" and result.status is SendStatus.OK
        assert [s.queue_id for s in a.sends] == [0]
        assert len(b.sends) == 1 and b.records()[0].body == b"hello"
        assert sleeps.seen == []  # the first retry does not back off

    run_async(_with_producer([a, b], 2, body))


def test_a_broker_that_failed_recently_is_skipped_until_its_isolation_ends() -> None:
    a = FakeBroker("broker-a", _always_fail(ErrorCode.BUSY))
    b = FakeBroker("broker-b")

    async def body(producer: Producer, clock: FakeClock, _sleeps: Sleeps) -> None:
        await producer.send("t", b"first")
        assert len(a.sends) == 1

        for _ in range(10):
            assert (await producer.send("t", b"more")).broker == "broker-b"
        assert len(a.sends) == 1  # not even tried while isolated

        clock.now += producer.config.failure_isolation_s + 1
        for _ in range(4):
            await producer.send("t", b"later")
        assert len(a.sends) == 2  # tried again (and isolated again)

    run_async(_with_producer([a, b], 2, body))


def test_retries_back_off_and_end_with_the_last_error() -> None:
    a = FakeBroker("broker-a", _always_fail(ErrorCode.STORE_UNAVAILABLE))
    b = FakeBroker("broker-b", _always_fail(ErrorCode.STORE_UNAVAILABLE))

    async def body(producer: Producer, _clock: FakeClock, sleeps: Sleeps) -> None:
        with pytest.raises(BrokerError) as caught:
            await producer.send("t", b"doomed")

        assert caught.value.code is ErrorCode.STORE_UNAVAILABLE and caught.value.retriable
        assert len(a.sends) + len(b.sends) == 1 + 3  # the send and three retries
        assert len(sleeps.seen) == 2  # between retries, not before the first
        assert all(0 <= s <= producer.config.retry_backoff_max_s for s in sleeps.seen)

    run_async(_with_producer([a, b], 1, body, retries=3))


def test_without_retries_a_failure_surfaces_and_the_next_send_fetches_the_route() -> None:
    a = FakeBroker("broker-a", _always_fail(ErrorCode.NOT_MASTER))

    async def body(producer: Producer, _clock: FakeClock, _sleeps: Sleeps) -> None:
        routes = cast(StaticRoutes, producer.routes)
        with pytest.raises(BrokerError):
            await producer.send("t", b"to a replaced master")
        fetched = routes.fetches
        # Its group's new master is routed now: the next send must not use the old route.
        b = FakeBroker("broker-a")
        await b.start()
        try:
            routes.set("t", [("broker-a", b.address, 1)])
            assert (await producer.send("t", b"to the new master")).status is SendStatus.OK
            assert routes.fetches == fetched + 1 and len(b.sends) == 1
        finally:
            await b.stop()

    run_async(_with_producer([a], 1, body, retries=0))


def test_an_error_that_is_not_retriable_surfaces_at_once_with_the_brokers_message() -> None:
    a = FakeBroker("broker-a", _always_fail(ErrorCode.NO_PERMISSION, retriable=False))
    b = FakeBroker("broker-b")

    async def body(producer: Producer, _clock: FakeClock, _sleeps: Sleeps) -> None:
        with pytest.raises(BrokerError, match="NO_PERMISSION from the script") as caught:
            await producer.send("t", b"x")

        assert not caught.value.retriable
        assert len(a.sends) == 1 and not b.sends

    run_async(_with_producer([a, b], 1, body))


def test_a_sharded_send_is_retried_on_its_own_queue_only() -> None:
    a = FakeBroker("broker-a", lambda _seen: Drop())
    b = FakeBroker("broker-b")

    async def body(producer: Producer, _clock: FakeClock, _sleeps: Sleeps) -> None:
        key = next(k for k in map(str, range(100)) if producer_queue(producer, k) == "broker-a")
        with pytest.raises(ConnectionLost):
            await producer.send("t", b"ordered", sharding_key=key)

        assert len(a.sends) == 3 and not b.sends  # the send and two retries, all on a

    run_async(_with_producer([a, b], 1, body))


def producer_queue(producer: Producer, key: str) -> str:
    from metaq.client.selection import shard_queue

    route = producer.routes.cached("t")
    assert route is not None
    return shard_queue(route, key).broker_name


def test_concurrent_sends_to_one_queue_travel_in_one_frame() -> None:
    a = FakeBroker("broker-a")

    async def body(producer: Producer, _clock: FakeClock, _sleeps: Sleeps) -> None:
        results = await asyncio.gather(*(producer.send("t", b"%d" % n) for n in range(50)))

        assert len(a.sends) == 1 and len(a.sends[0].records) == 50
        assert [r.queue_offset for r in results] == list(range(50))
        assert [rec.body for rec in a.records()] == [b"%d" % n for n in range(50)]

    run_async(_with_producer([a], 1, body))


def test_a_burst_sticks_to_one_queue_and_the_next_burst_moves_on() -> None:
    a = FakeBroker("broker-a")

    async def body(producer: Producer, _clock: FakeClock, _sleeps: Sleeps) -> None:
        first = await asyncio.gather(*(producer.send("t", b"x") for _ in range(10)))
        second = await asyncio.gather(*(producer.send("t", b"y") for _ in range(10)))
        one = [(await producer.send("t", b"z")).queue_id for _ in range(4)]

        assert len({r.queue_id for r in first}) == 1
        assert len({r.queue_id for r in second}) == 1
        assert first[0].queue_id != second[0].queue_id
        assert [len(s.records) for s in a.sends[:2]] == [10, 10]
        assert sorted(one) == [0, 1, 2, 3], "lone sends still go round the queues"

    run_async(_with_producer([a], 4, body))


def test_one_refused_message_in_a_coalesced_batch_fails_alone() -> None:
    def refuse_bad(seen: SendSeen) -> Fail | None:
        if any(r.body == b"bad" for r in seen.records):
            return Fail(ErrorCode.INVALID_MESSAGE, "record 1 is bad", retriable=False)
        return None

    a = FakeBroker("broker-a", refuse_bad)

    async def body(producer: Producer, _clock: FakeClock, _sleeps: Sleeps) -> None:
        outcomes = await asyncio.gather(
            *(producer.send("t", body) for body in (b"good", b"bad", b"fine")),
            return_exceptions=True,
        )

        assert [type(o).__name__ for o in outcomes] == ["SendResult", "BrokerError", "SendResult"]
        assert len(a.sends[0].records) == 3  # coalesced first, then split

    run_async(_with_producer([a], 1, body))


def test_send_async_and_send_batch_report_every_result() -> None:
    a = FakeBroker("broker-a")
    b = FakeBroker("broker-b", _always_fail(ErrorCode.STORE_UNAVAILABLE))

    async def body(producer: Producer, _clock: FakeClock, _sleeps: Sleeps) -> None:
        futures = [producer.send_async("t", b"async-%d" % n) for n in range(10)]
        results = await asyncio.gather(*futures)
        assert all(r.broker == "broker-a" for r in results)

        batch = await producer.send_batch("t", [b"b%d" % n for n in range(600)])
        assert len(batch) == 600 and {r.broker for r in batch} == {"broker-a"}
        offsets = [r.queue_offset for r in batch]
        assert offsets == sorted(offsets) and len(set(offsets)) == 600

    run_async(_with_producer([a, b], 1, body, max_batch_records=256))


class FirstQueueThenRoundRobin(RoundRobinSelector):
    """Picks ``first`` once, then round robin: puts a send where the test wants it."""

    def __init__(self, first: tuple[str, int]) -> None:
        super().__init__()
        self.first: tuple[str, int] | None = first

    def select(self, route: TopicRoute, avoid: Collection[str] = ()) -> QueueRoute:
        if self.first is not None:
            wanted, self.first = self.first, None
            return next(q for q in route.write_queues if (q.broker_name, q.queue_id) == wanted)
        return super().select(route, avoid)


def test_a_failed_send_batch_frame_is_resent_whole_to_another_broker() -> None:
    a = FakeBroker("broker-a", _always_fail(ErrorCode.STORE_UNAVAILABLE))
    b = FakeBroker("broker-b")

    async def body(producer: Producer, _clock: FakeClock, _sleeps: Sleeps) -> None:
        results = await producer.send_batch("t", [b"r%d" % n for n in range(40)])

        assert [s.queue_id for s in a.sends] == [1] and len(a.sends[0].records) == 40
        assert {(r.broker, r.queue_id) for r in results} == {("broker-b", 0)}
        assert [r.queue_offset for r in results] == list(range(40))
        stored = b.records()
        assert [r.body for r in stored] == [b"r%d" % n for n in range(40)]
        assert {r.queue_id for r in stored} == {0}  # every record re-aimed at the new queue

    selector = FirstQueueThenRoundRobin(("broker-a", 1))
    run_async(_with_producer([a, b], 2, body, queue_selector=selector))


def test_send_batch_on_a_route_cached_without_a_master_refetches_it_and_succeeds() -> None:
    # The route was cached while the topic's only group had no master (a failover); the
    # new master is routed by now.
    a = FakeBroker("broker-a")

    async def body(producer: Producer, _clock: FakeClock, _sleeps: Sleeps) -> None:
        routes = cast(StaticRoutes, producer.routes)
        routes.cache_until_fetched("t", [])  # what was cached while the group had no master
        fetched = routes.fetches
        results = await producer.send_batch("t", [b"one", b"two"])
        assert [r.status for r in results] == [SendStatus.OK, SendStatus.OK]
        assert routes.fetches == fetched + 1 and len(a.sends) == 1

    run_async(_with_producer([a], 1, body))


def _encoded(producer: Producer, queue: QueueRoute, bodies: list[bytes]) -> bytes:
    return b"".join(
        producer._encoder.encode("t", body, queue.queue_id, "", (), None) for body in bodies
    )


def test_send_encoded_sends_one_frame_flagged_as_a_retry_to_the_queue_it_names() -> None:
    a, b = FakeBroker("broker-a"), FakeBroker("broker-b")

    async def body(producer: Producer, _clock: FakeClock, _sleeps: Sleeps) -> None:
        route = await producer.writable_route("t")
        queue = next(q for q in route.write_queues if q.broker_name == "broker-b")
        results = await producer.send_encoded(
            "t", queue, _encoded(producer, queue, [b"x", b"y"]), 2
        )

        assert [r.queue_offset for r in results] == [0, 1]
        assert not a.sends and len(b.sends) == 1
        assert b.sends[0].retry  # the broker de-duplicates by id: a re-send stores nothing
        assert [r.body for r in b.records()] == [b"x", b"y"]

    run_async(_with_producer([a, b], 1, body))


def test_send_encoded_retries_a_failure_on_its_own_queue_only() -> None:
    failures = iter([Drop(), Fail(ErrorCode.BUSY, "busy", True)])
    a = FakeBroker("broker-a", lambda _seen: next(failures, None))
    b = FakeBroker("broker-b")

    async def body(producer: Producer, _clock: FakeClock, _sleeps: Sleeps) -> None:
        route = await producer.writable_route("t")
        queue = next(q for q in route.write_queues if q.broker_name == "broker-a")
        results = await producer.send_encoded("t", queue, _encoded(producer, queue, [b"z"]), 1)

        assert len(results) == 1 and results[0].broker == "broker-a"
        assert len(a.sends) == 3 and not b.sends  # dropped, refused, then stored
        assert all(seen.retry for seen in a.sends)

    run_async(_with_producer([a, b], 1, body))


def test_writable_route_refetches_a_route_cached_without_a_writable_queue() -> None:
    a = FakeBroker("broker-a")

    async def body(producer: Producer, _clock: FakeClock, _sleeps: Sleeps) -> None:
        routes = cast(StaticRoutes, producer.routes)
        routes.cache_until_fetched("t", [])
        fetched = routes.fetches
        route = await producer.writable_route("t")
        assert [q.broker_name for q in route.write_queues] == ["broker-a"]
        assert routes.fetches == fetched + 1

    run_async(_with_producer([a], 1, body))
