"""Idempotent producers with real brokers: a re-sent sequenced batch is stored once and
answered with where it was stored — on the same broker, after a kill -9 and restart
(the producer table rebuilt from its snapshot and the log), and on the slave promoted
after its master's kill -9 (the table built from the replicated log)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from metaq.client.admin import Admin, TopicSettings
from metaq.client.producer import Producer
from metaq.common.record import FLAG_SEQUENCED, encode, id_sequence, sequenced_id
from metaq.testing import BrokerProcess, DataClient
from metaq.testing.cluster import Cluster, ClusterBuilder
from metaq.testing.data_client import BrokerError
from metaq.testing.replica_group import read_records, start_group
from metaq.testing.waiting import run_async, wait_until, wait_until_async

TOPIC = "payments"
PRODUCER = 0x1234_5678_9ABC


def batch(first: int, count: int, producer: int = PRODUCER) -> list[bytearray]:
    return [
        encode(
            TOPIC,
            f"pay {seq}".encode(),
            flags=FLAG_SEQUENCED,
            msg_id=sequenced_id(producer, 0, 0, seq),
        )
        for seq in range(first, first + count)
    ]


async def send(broker: BrokerProcess, records: list[bytearray]) -> tuple[list[int], list[int]]:
    client = await DataClient.connect(broker.data_host, broker.data_port)
    try:
        answer = await client.send(TOPIC, 0, records)
    finally:
        await client.close()
    return list(answer.queue_offsets), list(answer.commitlog_offsets)


def bodies(broker: BrokerProcess, count: int) -> list[bytes]:
    found: list[bytes] = []

    def enough() -> bool:
        found[:] = [r.body for r in run_async(read_records(broker, TOPIC))]
        return len(found) >= count

    wait_until(enough, 30.0, f"{count} messages are readable")
    return found


def create_topic(broker: BrokerProcess) -> None:
    settings = TopicSettings(read_queues=1, write_queues=1)
    run_async(Admin().put_topic(broker.http_url, TOPIC, settings))


def test_a_resent_batch_is_stored_once_and_answered_where_it_was(tmp_path: Path) -> None:
    broker = BrokerProcess.start(tmp_path / "broker")
    try:
        create_topic(broker)
        first = run_async(send(broker, batch(0, 3)))
        # Another producer's records come between; then the first batch again, and one
        # overlapping its end.
        run_async(send(broker, batch(0, 2, producer=99)))
        again = run_async(send(broker, batch(0, 3)))
        assert again == first
        overlapping = run_async(send(broker, batch(2, 3)))
        assert overlapping[0][0] == first[0][2]
        assert overlapping[0][1:] == [5, 6]
        with pytest.raises(BrokerError, match="sequences 5-9 are missing"):
            run_async(send(broker, batch(10, 1)))
        expected = [b"pay 0", b"pay 1", b"pay 2", b"pay 0", b"pay 1", b"pay 3", b"pay 4"]
        assert bodies(broker, 7) == expected
    finally:
        broker.kill()


def test_a_broker_killed_and_restarted_still_knows_what_it_stored(tmp_path: Path) -> None:
    broker = BrokerProcess.start(tmp_path / "broker")
    try:
        create_topic(broker)
        first = run_async(send(broker, batch(0, 100)))
        broker.terminate()  # a clean stop: the table is saved with the checkpoint
        broker = BrokerProcess.start(tmp_path / "broker")
        second = run_async(send(broker, batch(100, 100)))
        broker.kill()  # kill -9: the second batch is only in the log
        broker = BrokerProcess.start(tmp_path / "broker")
        assert run_async(send(broker, batch(0, 100))) == first
        assert run_async(send(broker, batch(100, 100))) == second
        assert run_async(send(broker, batch(200, 1)))[0] == [200]
        assert len(bodies(broker, 201)) == 201
    finally:
        broker.kill()


def test_a_batch_resent_to_the_new_master_after_a_failover_is_stored_once(
    tmp_path: Path,
) -> None:
    group = start_group(tmp_path, brokers=2, mode="sync", min_in_sync=1)
    try:
        master = group.brokers[group.master()]
        create_topic(master)
        group.wait_caught_up(1 - group.master())
        first = run_async(send(master, batch(0, 50)))
        old = group.master()
        master.kill()  # the producer never heard the answer, say
        new = group.brokers[group.master(15.0, other_than=old)]
        again = run_async(send(new, batch(0, 50)))
        assert again == first
        run_async(send(new, batch(50, 10)))
        assert len(bodies(new, 60)) == 60
    finally:
        group.stop()


def test_an_idempotent_producer_whose_reply_was_lost_stores_once(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    cluster = cluster_factory(ClusterBuilder())
    broker = cluster.broker("broker-a")
    run_async(cluster.create_topic(TOPIC, queues=1))

    async def scenario() -> None:
        async with Producer(
            cluster.nameserver_addresses, send_timeout_s=0.5, retries=4, idempotent=True
        ) as producer:
            await producer.send(TOPIC, b"warm-up")
            # The broker hangs: the send and its retries wait unanswered in its socket.
            broker.pause()
            sending = asyncio.ensure_future(producer.send(TOPIC, b"pay 10 EUR"))

            async def retried() -> bool:
                return producer.sender.batches_sent >= 3

            await wait_until_async(retried, 10, "the send was retried")
            broker.resume()
            result = await sending
            assert result.queue_offset == 1
            batch = await producer.send_batch(TOPIC, [b"a", b"b", b"c"])
            assert [r.queue_offset for r in batch] == [2, 3, 4]

    run_async(scenario(), timeout_s=60)
    assert bodies(broker, 5) == [b"warm-up", b"pay 10 EUR", b"a", b"b", b"c"]
    stored = run_async(read_records(broker, TOPIC))
    assert [id_sequence(r.msg_id)[2] for r in stored] == [0, 1, 2, 3, 4]
    assert all(r.flags & FLAG_SEQUENCED for r in stored)
