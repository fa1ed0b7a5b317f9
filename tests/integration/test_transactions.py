"""Transactional messages with real processes: commit, rollback, and a producer that dies
between its half message and its commit being checked back through another process of
its group, the outcome applied once."""

from __future__ import annotations

from collections.abc import Callable

from metaq.client.message import Message
from metaq.client.results import SendResult
from metaq.client.transaction import TransactionProducer, TransactionState
from metaq.testing import BrokerProcess
from metaq.testing.cluster import Cluster, ClusterBuilder
from metaq.testing.replica_group import read_records
from metaq.testing.waiting import run_async, wait_until, wait_until_async

TOPIC = "orders"


async def bodies(broker: BrokerProcess) -> list[bytes]:
    return [r.body for r in await read_records(broker, TOPIC)]


def test_commit_delivers_rollback_does_not_and_a_lost_outcome_is_checked_back(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    builder = ClusterBuilder(
        broker_args=("--set", "txn_check_after_ms=1000", "--set", "txn_check_interval_ms=500")
    )
    cluster = cluster_factory(builder)
    broker = cluster.broker("broker-a")
    nameservers = cluster.nameserver_addresses
    run_async(cluster.create_topic(TOPIC, queues=1))
    committed_locally: set[str] = set()

    async def scenario() -> None:
        async def commit(result: SendResult) -> TransactionState:
            committed_locally.add(result.msg_id)
            return TransactionState.COMMIT

        async def rollback(_result: SendResult) -> TransactionState:
            return TransactionState.ROLLBACK

        async def crash_before_ending(result: SendResult) -> TransactionState:
            committed_locally.add(result.msg_id)  # the database write happened...
            return TransactionState.UNKNOWN  # ...and the process died before ending

        async def never_asked(_message: Message) -> TransactionState:
            raise AssertionError("the first producer is gone before any check")

        first = TransactionProducer(nameservers, "order-service", never_asked)
        async with first:
            await first.send(TOPIC, b"paid", commit)
            await first.send(TOPIC, b"cancelled", rollback)
            orphan, _ = await first.send(TOPIC, b"in doubt", crash_before_ending)
        # A restarted instance of the service answers the broker's check.
        asked: list[Message] = []

        async def check(message: Message) -> TransactionState:
            asked.append(message)
            if message.msg_id in committed_locally:
                return TransactionState.COMMIT
            return TransactionState.ROLLBACK

        second = TransactionProducer(nameservers, "order-service", check)
        async with second:
            await second.producer.send(TOPIC, b"plain")  # connects: now it can be asked

            async def answered() -> bool:
                return second.checks_answered > 0

            await wait_until_async(answered, 20, "the broker asked the restarted producer")
        assert [m.msg_id for m in asked] == [orphan.msg_id]
        assert asked[0].topic == TOPIC and asked[0].body == b"in doubt"

    run_async(scenario(), timeout_s=60)
    found: list[bytes] = []

    def delivered() -> bool:
        found[:] = run_async(bodies(broker))
        return len(found) >= 3

    wait_until(delivered, 10, "the committed messages are in the topic")
    assert sorted(found) == [b"in doubt", b"paid", b"plain"]
