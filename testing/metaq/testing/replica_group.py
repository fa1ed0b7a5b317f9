"""One broker group (a master and its slaves) with nameservers hosting the controller, as
real processes (:class:`~metaq.testing.cluster.ClusterBuilder`), plus a steady producer
and a full read-back for the failover tests.

Brokers run with failover on; the controller picks the master. Every broker of the group
keeps its data directory across restarts, as a machine that reboots would.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metaq.client.producer import Producer
from metaq.client.results import SendStatus
from metaq.common.record import Record
from metaq.testing import BrokerProcess, DataClient
from metaq.testing.cluster import ClusterBuilder, Group

GROUP = "broker-g"
TOPIC = "orders"
QUEUES = 4


def health(broker: BrokerProcess) -> dict[str, Any]:
    state = broker.health()
    assert state is not None, "the broker is not reachable"
    return state


def start_pair_without_failover(work_dir: Path, *, queues: int) -> Group:
    """MetaQ 2.0's master and slave: sync replication and no failover (the slave stays a
    slave), behind a nameserver that drops a dead broker from routes within 2 s; the
    pair in sync, holding ``TOPIC`` with ``queues`` queues."""
    builder = ClusterBuilder(
        groups=(GROUP,), replicas=2, replication_mode="sync", min_in_sync=2,
        nameserver_args=("--broker-expiry-s", "2", "--expiry-scan-interval-s", "0.2"),
        broker_args=("--set", "failover=false"),
    )  # fmt: skip
    cluster = builder.start(work_dir)
    try:
        asyncio.run(cluster.create_topic(TOPIC, queues=queues))
        cluster.wait_in_sync(GROUP, [0, 1])
    except BaseException:
        cluster.stop()
        raise
    return cluster.group(GROUP)


def start_group(
    work_dir: Path,
    *,
    brokers: int = 2,
    nameservers: int = 1,
    mode: str = "sync",
    min_in_sync: int = 2,
    extra: Sequence[str] = (),
) -> Group:
    """``brokers`` of ``GROUP`` holding ``TOPIC``, every one in sync by the master's word
    and the controller's."""
    builder = ClusterBuilder(
        nameservers=nameservers, groups=(GROUP,), replicas=brokers, replication_mode=mode,
        min_in_sync=min_in_sync, broker_args=tuple(extra),
    )  # fmt: skip
    cluster = builder.start(work_dir)
    try:
        asyncio.run(cluster.create_topic(TOPIC, queues=QUEUES))
        cluster.wait_in_sync(GROUP, list(range(brokers)))
        cluster.wait_committed_in_sync(GROUP, list(range(brokers)))
    except BaseException:
        cluster.stop()
        raise
    return cluster.group(GROUP)


@dataclass
class History:
    """What a producer did: every body it tried, and which the group acknowledged."""

    attempted: list[bytes] = field(default_factory=list)
    acked: list[bytes] = field(default_factory=list)
    other_status: list[tuple[bytes, str]] = field(default_factory=list)
    failures: list[tuple[float, str]] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)


async def produce(
    nameservers: Sequence[str], history: History, stop: asyncio.Event, *, rate_hz: float = 200
) -> None:
    """Send one message at a time, each body unique, until ``stop`` is set."""
    async with Producer(nameservers, send_timeout_s=2.0, retries=1) as producer:
        n = 0
        while not stop.is_set():
            body = b"message-%08d" % n
            n += 1
            history.attempted.append(body)
            try:
                result = await producer.send(TOPIC, body)
            except Exception as exc:
                history.failures.append((time.monotonic(), f"{type(exc).__name__}: {exc}"))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.05):
                        await stop.wait()
                continue
            if result.status is SendStatus.OK:
                history.acked.append(body)
                history.ack_times.append(time.monotonic())
            else:
                history.other_status.append((body, result.status.value))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1 / rate_hz):
                    await stop.wait()


async def read_records(broker: BrokerProcess, topic: str, queues: int = 1) -> list[Record]:
    """Every record of queues ``0..queues-1`` of ``topic`` on ``broker``, queue by queue."""
    client = await DataClient.connect(broker.data_host, broker.data_port)
    try:
        return [r for q in range(queues) for r in await client.read_queue(topic, q)]
    finally:
        await client.close()


async def read_all(broker: BrokerProcess, queues: int = QUEUES) -> list[bytes]:
    """Every message body in the topic on ``broker``, queue by queue."""
    return [r.body for r in await read_records(broker, TOPIC, queues)]


def commitlog_bytes(broker: BrokerProcess, end: int) -> bytes:
    """The first ``end`` bytes of a broker's commitlog, read from its segment files."""
    out = bytearray()
    for path in sorted((broker.data_dir / "commitlog").iterdir()):
        out += path.read_bytes()
        if len(out) >= end:
            break
    return bytes(out[:end])
