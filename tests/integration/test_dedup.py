"""De-duplication of retried sends, with a real broker: a retry of something already
stored is answered from the log, and a producer whose reply was lost stores once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from metaq.client.admin import Admin, TopicSettings
from metaq.client.producer import Producer
from metaq.common.record import encode
from metaq.common.v1.data_pb2 import SendRequest
from metaq.testing import BrokerProcess, DataClient
from metaq.testing.cluster import Cluster, ClusterBuilder
from metaq.testing.replica_group import read_records
from metaq.testing.waiting import run_async, wait_until, wait_until_async

TOPIC = "payments"


async def stored_bodies(broker: BrokerProcess) -> list[bytes]:
    return [r.body for r in await read_records(broker, TOPIC)]


def dispatched(broker: BrokerProcess, count: int) -> list[bytes]:
    """The queue's bodies once at least ``count`` are readable (dispatch is asynchronous)."""
    found: list[bytes] = []

    def enough() -> bool:
        found[:] = run_async(stored_bodies(broker))
        return len(found) >= count

    wait_until(enough, 10.0, f"{count} messages are readable")
    return found


def test_a_retried_batch_stores_only_what_the_broker_lacks(tmp_path: Path) -> None:
    broker = BrokerProcess.start(tmp_path / "broker")
    try:
        run_async(
            Admin().put_topic(broker.http_url, TOPIC, TopicSettings(read_queues=1, write_queues=1))
        )
        first = encode(TOPIC, b"first")
        second = encode(TOPIC, b"second")

        async def scenario() -> None:
            client = await DataClient.connect(broker.data_host, broker.data_port)
            try:
                original = await client.send(TOPIC, 0, [first])
                again = await client.send(TOPIC, 0, [first, second], flags=SendRequest.FLAG_RETRY)
                assert again.queue_offsets[0] == original.queue_offsets[0]
                assert again.commitlog_offsets[0] == original.commitlog_offsets[0]
                assert again.queue_offsets[1] == original.queue_offsets[0] + 1
            finally:
                await client.close()

        run_async(scenario())
        assert dispatched(broker, 2) == [b"first", b"second"]
    finally:
        broker.kill()


def test_a_send_whose_reply_was_lost_is_stored_once(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    cluster = cluster_factory(ClusterBuilder())
    broker = cluster.broker("broker-a")
    run_async(cluster.create_topic(TOPIC, queues=1))

    async def scenario() -> None:
        async with Producer(
            cluster.nameserver_addresses, send_timeout_s=0.5, retries=4
        ) as producer:
            await producer.send(TOPIC, b"warm-up")
            # The broker hangs: the send and its retries wait unanswered in its socket,
            # and the producer's first tries time out.
            broker.pause()
            sending = asyncio.ensure_future(producer.send(TOPIC, b"pay 10 EUR"))

            # The warm-up, the send, and at least one retry after its timeout.
            async def retried() -> bool:
                return producer.sender.batches_sent >= 3

            await wait_until_async(retried, 10, "the send was retried")
            broker.resume()
            result = await sending
            assert result.status.value == "OK"

    run_async(scenario(), timeout_s=60)
    assert dispatched(broker, 2) == [b"warm-up", b"pay 10 EUR"]


def test_a_retried_send_of_an_id_stored_in_another_topic_is_stored(tmp_path: Path) -> None:
    """A replay copies messages, ids and all, into another topic: the id held by the first
    topic must not make the broker answer the copy from there."""
    broker = BrokerProcess.start(tmp_path / "broker")
    try:
        run_async(
            Admin().put_topic(broker.http_url, TOPIC, TopicSettings(read_queues=1, write_queues=1))
        )
        run_async(
            Admin().put_topic(
                broker.http_url, "payments-copy", TopicSettings(read_queues=1, write_queues=1)
            )
        )
        msg_id = bytes(range(16))

        async def scenario() -> None:
            client = await DataClient.connect(broker.data_host, broker.data_port)
            try:
                await client.send(TOPIC, 0, [encode(TOPIC, b"original", msg_id=msg_id)])
                copy = encode("payments-copy", b"original", msg_id=msg_id)
                await client.send("payments-copy", 0, [copy], flags=SendRequest.FLAG_RETRY)
                again = await client.send("payments-copy", 0, [copy], flags=SendRequest.FLAG_RETRY)
                assert again.queue_offsets[0] == 0
            finally:
                await client.close()

        run_async(scenario())

        async def copies() -> list[bytes]:
            return [r.body for r in await read_records(broker, "payments-copy")]

        wait_until(lambda: run_async(copies()) == [b"original"], 10.0, "the copy is readable")
    finally:
        broker.kill()


def test_a_retried_batch_of_new_ids_is_stored_whole_and_its_pipelined_retry_not_again(
    tmp_path: Path,
) -> None:
    """Every Spark write sends with the retry flag: a batch none of whose ids is stored
    is appended whole, and the same batch right behind it on the connection (before any
    dispatch turn) is answered from the log."""
    broker = BrokerProcess.start(tmp_path / "broker")
    try:
        run_async(
            Admin().put_topic(broker.http_url, TOPIC, TopicSettings(read_queues=1, write_queues=1))
        )
        batch = [encode(TOPIC, f"row {n}".encode()) for n in range(300)]

        async def scenario() -> None:
            client = await DataClient.connect(broker.data_host, broker.data_port)
            try:
                first, again = await asyncio.gather(
                    client.send(TOPIC, 0, batch, flags=SendRequest.FLAG_RETRY),
                    client.send(TOPIC, 0, batch, flags=SendRequest.FLAG_RETRY),
                )
                assert list(first.queue_offsets) == list(range(300))
                assert list(again.queue_offsets) == list(range(300))
                assert list(again.commitlog_offsets) == list(first.commitlog_offsets)
            finally:
                await client.close()

        run_async(scenario())
        assert dispatched(broker, 300) == [f"row {n}".encode() for n in range(300)]
    finally:
        broker.kill()
