"""One broker group (a master and its slaves) with nameservers hosting the controller, as
real processes, plus a steady producer and a full read-back for the failover tests.

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

from metaq.client.admin import Admin, TopicSettings
from metaq.client.producer import Producer
from metaq.client.results import SendStatus
from metaq.common.record import Record
from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1 import control_pb2_grpc
from metaq.testing import BrokerProcess, DataClient
from metaq.testing.nameserver_process import (
    NameServerProcess,
    signed_channel,
    start_controller_group,
    start_nameserver,
)
from metaq.testing.waiting import wait_until

GROUP = "broker-g"
TOPIC = "orders"
QUEUES = 4


async def controller_state(address: str) -> pb.GetControllerStateResponse:
    # Signed with the cluster secret, as a cluster member's call: answered with auth on too.
    async with signed_channel(address) as channel:
        stub = control_pb2_grpc.NameServerStub(channel)
        response: pb.GetControllerStateResponse = await stub.GetControllerState(
            pb.GetControllerStateRequest(), timeout=5
        )
        return response


def health(broker: BrokerProcess) -> dict[str, Any]:
    state = broker.health()
    assert state is not None, "the broker is not reachable"
    return state


@dataclass
class ReplicaGroup:
    work_dir: Path
    nameservers: list[NameServerProcess]
    broker_args: list[str]
    brokers: dict[int, BrokerProcess] = field(default_factory=dict)

    @property
    def nameserver_addresses(self) -> list[str]:
        return [ns.grpc_address for ns in self.nameservers]

    def start_broker(self, broker_id: int, *extra: str) -> BrokerProcess:
        broker = BrokerProcess.start(
            self.work_dir / f"broker-{broker_id}",
            "--broker-name", GROUP, "--broker-id", str(broker_id), *self.broker_args, *extra,
        )  # fmt: skip
        self.brokers[broker_id] = broker
        return broker

    def master(self, timeout_s: float = 15.0, *, other_than: int | None = None) -> int:
        """The id of the broker that takes writes (waiting for one)."""
        found: list[int] = []

        def one_master() -> bool:
            found.clear()
            for broker_id, broker in self.brokers.items():
                state = broker.health()
                if state and state["role"] == "master" and broker_id != other_than:
                    found.append(broker_id)
            return len(found) == 1

        wait_until(one_master, timeout_s, f"one broker of {GROUP} is master")
        return found[0]

    def wait_in_sync(self, ids: Sequence[int], timeout_s: float = 20.0) -> None:
        def in_sync() -> bool:
            state = self.brokers[self.master()].health()
            return state is not None and sorted(state["in_sync_ids"]) == sorted(ids)

        wait_until(in_sync, timeout_s, f"the master has {sorted(ids)} in sync")

    def controller(self) -> pb.GetControllerStateResponse:
        return asyncio.run(controller_state(self.nameserver_addresses[0]))

    def wait_committed_in_sync(self, ids: Sequence[int], timeout_s: float = 20.0) -> None:
        """Until the controller agrees that ``ids`` are in sync (so any may be elected)."""

        def committed() -> bool:
            groups = self.controller().groups
            return any(g.broker_name == GROUP and sorted(g.in_sync_ids) == sorted(ids)
                       for g in groups)  # fmt: skip

        wait_until(committed, timeout_s, f"the controller has {sorted(ids)} in sync")

    def wait_caught_up(self, broker_id: int, timeout_s: float = 20.0) -> None:
        def caught_up() -> bool:
            master = self.brokers[self.master()].health()
            slave = self.brokers[broker_id].health()
            return (
                master is not None
                and slave is not None
                and slave["commitlog_write_offset"] == master["commitlog_write_offset"]
            )

        wait_until(caught_up, timeout_s, f"broker {broker_id} caught up with the master")

    def stop(self) -> None:
        for broker in self.brokers.values():
            broker.resume()
            broker.kill()
        for nameserver in self.nameservers:
            nameserver.resume()
            nameserver.stop()


def start_pair_without_failover(work_dir: Path, *, queues: int) -> ReplicaGroup:
    """MetaQ 2.0's master and slave: sync replication and no failover (the slave stays a
    slave), behind a nameserver that drops a dead broker from routes within 2 s; the
    pair in sync, holding ``TOPIC`` with ``queues`` queues."""
    nameserver = start_nameserver(
        work_dir / "ns0", "--broker-expiry-s", "2", "--expiry-scan-interval-s", "0.2"
    )
    group = ReplicaGroup(
        work_dir,
        [nameserver],
        ["--nameserver", nameserver.grpc_address, "--set", "failover=false",
         "--set", "replication_mode=sync", "--set", "min_in_sync_replicas=2"],
    )  # fmt: skip
    try:
        master = group.start_broker(0)
        group.start_broker(1)
        master.wait_master(20)
        asyncio.run(
            Admin().put_topic(
                master.http_url, TOPIC, TopicSettings(read_queues=queues, write_queues=queues)
            )
        )
        group.wait_in_sync([0, 1])
    except BaseException:
        group.stop()
        raise
    return group


def start_group(
    work_dir: Path,
    *,
    brokers: int = 2,
    nameservers: int = 1,
    mode: str = "sync",
    min_in_sync: int = 2,
    extra: Sequence[str] = (),
) -> ReplicaGroup:
    if nameservers == 1:
        servers = [start_nameserver(work_dir / "ns0")]
    else:
        servers = start_controller_group(work_dir, nameservers)
    args = [f for ns in servers for f in ("--nameserver", ns.grpc_address)]
    args += ["--set", f"replication_mode={mode}", "--set", f"min_in_sync_replicas={min_in_sync}"]
    group = ReplicaGroup(work_dir, servers, [*args, *extra])
    try:
        for broker_id in range(brokers):
            group.start_broker(broker_id)
        master = group.brokers[group.master()]
        asyncio.run(
            Admin().put_topic(
                master.http_url, TOPIC, TopicSettings(read_queues=QUEUES, write_queues=QUEUES)
            )
        )
        group.wait_in_sync(list(range(brokers)))
        group.wait_committed_in_sync(list(range(brokers)))
    except BaseException:
        group.stop()
        raise
    return group


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
