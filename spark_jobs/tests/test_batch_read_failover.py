"""A batch read while the master of a sync pair is down (kill -9): the partitions read
from the slave, and the read returns every acknowledged message once.

The read starts right after the kill, while the nameserver still routes the dead master:
planning and the executors must follow the route to the slave, as a job started by a
scheduler at that moment would."""

from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

import metaq.testing.replica_group as rg
from metaq.client.admin import Admin
from metaq.client.errors import UnknownTopic
from metaq.client.message import OutgoingMessage
from metaq.client.producer import Producer
from metaq.client.results import SendStatus
from metaq.client.routes import RouteCache
from metaq.testing.waiting import run_async, wait_until

MESSAGES = 2_000


async def send_all(nameserver: str, topic: str) -> list[bytes]:
    """Send MESSAGES unique bodies; the ones the pair acknowledged (master and slave)."""
    bodies = [b"msg-%06d" % n for n in range(MESSAGES)]
    acked: list[bytes] = []
    async with Producer([nameserver]) as producer:
        for at in range(0, MESSAGES, 100):
            chunk = bodies[at : at + 100]
            results = await producer.send_batch(topic, [OutgoingMessage(b) for b in chunk])
            acked += [b for b, r in zip(chunk, results, strict=True) if r.status is SendStatus.OK]
    return acked


async def read_addresses(nameserver: str, topic: str) -> set[str]:
    """Where the route sends the topic's readers (empty while it is not routed)."""
    async with RouteCache([nameserver]) as routes:
        with contextlib.suppress(UnknownTopic):
            return {q.address for q in (await routes.route(topic, refresh=True)).read_queues}
    return set()


def wait_routed_to(nameserver: str, topic: str, broker: Any, what: str) -> None:
    address = f"{broker.data_host}:{broker.data_port}"
    wait_until(
        lambda: run_async(read_addresses(nameserver, topic)) == {address}, 30.0, what, poll_s=0.1
    )


def test_a_batch_read_while_the_master_is_down_returns_every_acknowledged_message(
    spark: Any, tmp_path: Path
) -> None:
    # No failover (the slave must stay a slave); the nameserver drops the dead master from
    # the route within 2 s, after which the route names the slave.
    group = rg.start_pair_without_failover(tmp_path, queues=4)
    nameserver, master, slave = group.nameservers[0], group.brokers[0], group.brokers[1]
    try:
        wait_routed_to(nameserver.grpc_address, rg.TOPIC, master, "the route names the master")
        acked = run_async(send_all(nameserver.grpc_address, rg.TOPIC))
        assert len(acked) == MESSAGES, "sync sends to a healthy pair are all acknowledged"

        master.kill()
        rows = (
            spark.read.format("metaq")
            .option("nameservers", nameserver.grpc_address)
            .option("topic", rg.TOPIC)
            .option("minPartitions", "8")
            .load()
            .select("body")
            .collect()
        )
        pulled_from_slave = sum(
            value
            for (name, labels), value in run_async(Admin().metrics(slave.http_url)).items()
            if name == "metaq_messages_out_total" and ("topic", rg.TOPIC) in labels
        )
    finally:
        group.stop()
    seen = Counter(bytes(r.body) for r in rows)
    missing = set(acked) - set(seen)
    assert not missing, f"{len(missing)} acknowledged messages not read, e.g. {min(missing)!r}"
    assert not [b for b, n in seen.items() if n > 1], "messages read twice"
    assert len(seen) == MESSAGES
    assert pulled_from_slave >= MESSAGES, "the rows did not come from the slave"
