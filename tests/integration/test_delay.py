"""Delayed delivery with real processes: on time, across a crash, across a failover."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from metaq.client.producer import Producer
from metaq.common.record import Record
from metaq.testing import BrokerProcess
from metaq.testing.cluster import Cluster, ClusterBuilder, Group
from metaq.testing.replica_group import TOPIC, read_records, start_group
from metaq.testing.waiting import run_async, wait_until


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def wait_for_bodies(broker: BrokerProcess, topic: str, queues: int, count: int) -> list[Record]:
    found: list[Record] = []

    def enough() -> bool:
        found[:] = run_async(read_records(broker, topic, queues))
        return len(found) >= count

    wait_until(enough, 20.0, f"{count} messages are in {topic}")
    return found


def test_delayed_messages_arrive_when_due_and_survive_a_crash(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    cluster = cluster_factory(ClusterBuilder())
    broker = cluster.broker("broker-a")
    run_async(cluster.create_topic("later", queues=2))
    due: dict[bytes, int] = {}

    async def send() -> None:
        async with Producer(cluster.nameserver_addresses) as producer:
            await producer.send("later", b"now")
            due[b"now"] = now_ms()
            await producer.send("later", b"level 1", delay_level=1)
            due[b"level 1"] = now_ms() + 1000
            at = now_ms() + 2500
            await producer.send("later", b"at +2.5s", deliver_at_ms=at)
            due[b"at +2.5s"] = at
            at = now_ms() + 4000
            await producer.send("later", b"after a crash", deliver_at_ms=at)
            due[b"after a crash"] = at

    run_async(send())
    found = wait_for_bodies(broker, "later", 2, 3)
    # The broker crashes with one message still pending, and comes back.
    broker.kill()
    broker = cluster.start_broker("broker-a")
    # Due while the broker was down or starting (a loaded machine starts it slowly):
    # it cannot be delivered before the broker is back.
    due[b"after a crash"] = max(due[b"after a crash"], now_ms())
    found = wait_for_bodies(broker, "later", 2, 4)

    assert sorted(r.body for r in found) == sorted(due)  # each exactly once
    for record in found:  # neither early nor more than a second late
        late_ms = record.store_timestamp_ms - due[record.body]
        assert -50 <= late_ms <= 1000, (record.body, late_ms)


def test_a_new_master_delivers_what_the_old_one_held_back_exactly_once(tmp_path: Path) -> None:
    group: Group = start_group(tmp_path, brokers=2, mode="sync", min_in_sync=1)
    try:
        bodies = [b"delayed-%d" % i for i in range(20)]
        at = now_ms() + 3000

        async def send() -> None:
            async with Producer(group.nameserver_addresses) as producer:
                await asyncio.gather(
                    *(producer.send(TOPIC, body, deliver_at_ms=at) for body in bodies)
                )

        run_async(send())
        old = group.master()
        group.brokers[old].kill()
        new = group.master(15.0, other_than=old)
        found = wait_for_bodies(group.brokers[new], TOPIC, 4, len(bodies))

        assert sorted(r.body for r in found) == sorted(bodies)
        assert all(r.store_timestamp_ms >= at - 50 for r in found)
    finally:
        group.stop()
