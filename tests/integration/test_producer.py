"""The producer against real nameservers and brokers: routing, placement, failover, bad
input. Every acknowledged message is read back from the broker it names."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from metaq.client.errors import BrokerError, NoNameServer, UnknownTopic
from metaq.client.producer import Producer, ProducerConfig
from metaq.client.results import SendResult, SendStatus
from metaq.common.errors import ErrorCode
from metaq.testing import Cluster, ClusterBuilder, run_async
from metaq.testing.read_back import read_until

TWO_BROKERS = ClusterBuilder(groups=("broker-a", "broker-b"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One nameserver and two brokers shared by the tests that kill nothing."""
    started = TWO_BROKERS.start(tmp_path_factory.mktemp("producer-cluster"))
    try:
        yield started
    finally:
        started.stop()


def test_a_producer_spreads_1000_messages_over_both_brokers_and_each_is_where_it_says(
    cluster: Cluster,
) -> None:
    async def scenario() -> None:
        await cluster.create_topic("spread", queues=4)
        async with Producer(cluster.nameserver_addresses) as producer:
            one_by_one = [await producer.send("spread", b"seq-%d" % n) for n in range(200)]
            together = await asyncio.gather(
                *(producer.send("spread", b"par-%d" % n, keys=(f"k{n}",)) for n in range(800))
            )
        results = [*one_by_one, *together]
        bodies = [b"seq-%d" % n for n in range(200)] + [b"par-%d" % n for n in range(800)]

        assert all(r.status is SendStatus.OK for r in results)
        every_queue = {(b, q) for b in ("broker-a", "broker-b") for q in range(4)}
        # One at a time: round robin, 25 in each queue.
        assert Counter((r.broker, r.queue_id) for r in one_by_one) == dict.fromkeys(every_queue, 25)
        # Together: sticky, full batches of 256 (the default limit), each to the next queue.
        burst = Counter((r.broker, r.queue_id) for r in together)
        assert sorted(burst.values()) == [32, 256, 256, 256]
        placement = Counter((r.broker, r.queue_id) for r in results)

        stored = {}
        for broker in ("broker-a", "broker-b"):
            count = sum(n for (b, _), n in placement.items() if b == broker)
            for message in await read_until(cluster.broker(broker), "spread", 4, count):
                stored[(broker, message.queue_id, message.queue_offset)] = message
        for result, body in zip(results, bodies, strict=True):
            message = stored.get((result.broker, result.queue_id, result.queue_offset))
            assert message is not None, f"{result} not found where it says"
            assert (message.msg_id, message.body) == (result.msg_id, body)
        assert len(stored) == 1000  # nothing stored twice

    run_async(scenario())


def test_send_batch_send_async_and_one_way_sends_are_stored(cluster: Cluster) -> None:
    async def scenario() -> None:
        await cluster.create_topic("modes", queues=2, groups=["broker-a"])
        async with Producer(cluster.nameserver_addresses) as producer:
            batch = await producer.send_batch("modes", [b"b%d" % n for n in range(300)])
            futures = [producer.send_async("modes", b"a%d" % n) for n in range(50)]
            async_results = await asyncio.gather(*futures)
            for n in range(20):
                await producer.send_oneway("modes", b"o%d" % n)
            compressed = await producer.send("modes", b"z" * 10_000, tags="big")
            await producer.flush()

        assert len({(r.queue_id, r.queue_offset) for r in batch}) == 300
        assert len({r.queue_id for r in batch}) == 1  # a batch goes to one queue
        assert all(isinstance(r, SendResult) for r in async_results)
        broker = cluster.broker("broker-a")
        stored = await read_until(broker, "modes", 2, 371)
        bodies = Counter(m.body[:1] for m in stored)
        assert bodies == Counter({b"b": 300, b"a": 50, b"o": 20, b"z": 1})
        where = {(m.queue_id, m.queue_offset): m for m in stored}
        for n, result in enumerate(batch):
            message = where[(result.queue_id, result.queue_offset)]
            assert (message.msg_id, message.body) == (result.msg_id, b"b%d" % n)
        (big,) = [m for m in stored if m.msg_id == compressed.msg_id]
        assert big.body == b"z" * 10_000 and big.tags == "big"
        assert big.size < 1000  # stored compressed, inflated on read

    run_async(scenario())


def test_sends_one_at_a_time_poll_for_their_answers_unless_turned_off(cluster: Cluster) -> None:
    async def scenario() -> tuple[float, float]:
        await cluster.create_topic("polled", queues=1, groups=["broker-a"])
        polled = []
        for window in (200, 0):
            config = ProducerConfig(answer_poll_us=window)
            async with Producer(cluster.nameserver_addresses, config=config) as producer:
                for n in range(100):
                    await producer.send("polled", b"%d-%d" % (window, n))
                polled.append(producer.sender.answer_poll.polled_s)
        stored = await read_until(cluster.broker("broker-a"), "polled", 1, 200)
        assert sorted(m.body for m in stored) == sorted(
            b"%d-%d" % (w, n) for w in (200, 0) for n in range(100)
        )
        return polled[0], polled[1]

    polling, turned_off = run_async(scenario())
    # The first send polls whatever the round trip; later ones while it stays quick.
    assert polling > 0
    assert turned_off == 0


def test_an_unknown_topic_fails_at_once_and_is_not_retriable(cluster: Cluster) -> None:
    async def scenario() -> None:
        async with Producer(cluster.nameserver_addresses) as producer:
            with pytest.raises(UnknownTopic, match="no-such-topic") as caught:
                await producer.send("no-such-topic", b"x")
            assert not caught.value.retriable

    run_async(scenario(), timeout_s=5)


def test_a_message_over_the_brokers_limit_is_refused_and_nothing_is_stored(
    cluster: Cluster,
) -> None:
    async def scenario() -> None:
        await cluster.create_topic("limits", queues=2)
        async with Producer(cluster.nameserver_addresses) as producer:
            # Random bytes do not compress: 300 KiB over the brokers' 256 KiB limit.
            with pytest.raises(BrokerError) as caught:
                await producer.send("limits", os.urandom(300 * 1024))
            neighbours = await asyncio.gather(
                producer.send("limits", b"small", sharding_key="same"),
                producer.send("limits", os.urandom(300 * 1024), sharding_key="same"),
                producer.send("limits", b"small too", sharding_key="same"),
                return_exceptions=True,
            )

        assert caught.value.code is ErrorCode.INVALID_MESSAGE and not caught.value.retriable
        assert "262144" in str(caught.value)  # the broker says what its limit is
        assert [type(n).__name__ for n in neighbours] == ["SendResult", "BrokerError", "SendResult"]
        # The broker dispatches in log order: once the small neighbours (sent after the
        # refused ones) are readable, anything refused but stored would be too.
        stored = [
            m.body
            for name in sorted(cluster.builder.groups)
            for m in await read_until(
                cluster.broker(name), "limits", 2, 2 if name == neighbours[0].broker else 0
            )
        ]
        assert sorted(stored) == [b"small", b"small too"]

    run_async(scenario())


def test_killing_a_broker_mid_stream_is_invisible_to_the_callers(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    cluster = cluster_factory(TWO_BROKERS)

    async def scenario() -> None:
        await cluster.create_topic("failover", queues=4)
        results: list[SendResult] = []
        errors: list[BaseException] = []
        killed = asyncio.Event()
        after_kill: list[SendResult] = []

        async def worker(producer: Producer, n: int) -> None:
            sent = 0
            while len(after_kill) < 600:
                try:
                    result = await producer.send("failover", b"w%d-%d" % (n, sent))
                except Exception as exc:  # counted, not raised: the test reports all
                    errors.append(exc)
                    continue
                sent += 1
                (after_kill if killed.is_set() else results).append(result)

        async with Producer(cluster.nameserver_addresses) as producer:
            workers = [asyncio.create_task(worker(producer, n)) for n in range(16)]
            while len(results) < 400 and not errors:
                await asyncio.sleep(0.005)  # poll until enough sends went to both brokers
            await asyncio.to_thread(cluster.broker("broker-b").kill)
            killed.set()
            await asyncio.gather(*workers)

        assert errors == []
        assert {r.broker for r in results} == {"broker-a", "broker-b"}
        tail = after_kill[200:]  # once the producer knows, nothing goes to the dead broker
        assert {r.broker for r in tail} == {"broker-a"}
        on_a = sum(r.broker == "broker-a" for r in [*results, *after_kill])
        stored = {
            (m.queue_id, m.queue_offset): m.msg_id
            for m in await read_until(cluster.broker("broker-a"), "failover", 4, on_a)
        }
        for result in [*results, *after_kill]:
            if result.broker == "broker-a":
                assert stored[(result.queue_id, result.queue_offset)] == result.msg_id

    run_async(scenario(), timeout_s=40)


def test_a_dead_nameserver_is_passed_over_by_running_and_new_producers(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    cluster = cluster_factory(ClusterBuilder(groups=("broker-a",), nameservers=2))

    async def scenario() -> None:
        await cluster.create_topic("resilient", queues=2)
        first, second = cluster.nameservers
        async with Producer(cluster.nameserver_addresses) as producer:
            await producer.send("resilient", b"before")
            first.kill()
            await producer.routes.route("resilient", refresh=True)  # now from the second
            assert (await producer.send("resilient", b"after")).status is SendStatus.OK

            # A new producer lists the dead nameserver first and still gets going.
            async with Producer(cluster.nameserver_addresses) as newcomer:
                assert (await newcomer.send("resilient", b"new")).status is SendStatus.OK

            second.kill()
            async with Producer(cluster.nameserver_addresses) as stranded:
                with pytest.raises(NoNameServer) as caught:
                    await stranded.send("resilient", b"nowhere")
            assert caught.value.retriable
            assert first.grpc_address in str(caught.value)
            assert second.grpc_address in str(caught.value)

    run_async(scenario(), timeout_s=30)
