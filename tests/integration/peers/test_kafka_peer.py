"""The Kafka peer of ``make bench-compare`` (``bench/peer_kafka.py``): one broker starts
from the jars of ``make peers-kafka``, takes a message through each Python client the
benchmark drives, gives both back to a consumer, reports its servers' CPU, and is gone
with its data afterwards. So the harness cannot rot between benchmark runs."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from compare_harness import cpu_seconds
from confluent_kafka import Consumer, TopicPartition
from metaq_load import Budget
from peer_kafka import PARTITIONS, STAMP, TOPIC, KafkaAio, KafkaConfluent, kafka_running

READ_BACK_S = 60.0


def _read_back(bootstrap: str, wanted: set[bytes]) -> set[bytes]:
    """The bodies of ``wanted`` found in the topic, reading it from the start."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "smoke",
                         "enable.auto.commit": False})  # fmt: skip
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    found: set[bytes] = set()
    deadline = time.monotonic() + READ_BACK_S
    try:
        while found != wanted and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            body = None if message is None else message.value()
            if body in wanted:
                found.add(body)
    finally:
        consumer.close()
    return found


async def _send_one_each(systems: list[KafkaConfluent | KafkaAio], bodies: list[bytes]) -> None:
    for system, body in zip(systems, bodies, strict=True):
        await system.open()
        try:
            budget = Budget(30.0, max_messages=1)
            latencies = await system.one_at_a_time(body, budget)
            assert budget.sent == 1 and len(latencies) == 1, system.key
        finally:
            await system.close()


def test_one_broker_takes_a_message_through_each_client_and_gives_it_back(
    tmp_path: Path,
) -> None:
    if not STAMP.exists():
        why = f"Kafka's jars are missing ({STAMP}): run `make peers-kafka`"
        if os.environ.get("CI"):
            pytest.fail(why)  # make test resolves them; CI must not pass without the peer
        pytest.skip(why)
    work = tmp_path / "kafka"
    with kafka_running(work) as cluster:
        pids = cluster.pids
        assert len(pids) == 1 and cluster.replicas == 1
        # A JVM that started and formed its quorum has used CPU; the cost cell reads it so.
        assert cpu_seconds(pids) > 0
        bodies = [b"smoke through confluent-kafka", b"smoke through aiokafka"]
        asyncio.run(_send_one_each([KafkaConfluent(cluster), KafkaAio(cluster)], bodies))
        assert _read_back(cluster.bootstrap, set(bodies)) == set(bodies)
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids), "a Kafka process outlived it"
    assert not work.exists(), "the peer's data directory was left behind"
