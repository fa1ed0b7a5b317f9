"""A broker under resource pressure: dead background threads, too many or idle
connections, peers that never read their answers, file descriptors running out."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

from metaq.broker.testing import BrokerError, BrokerProcess, DataClient, run_async, wait_until
from metaq.broker.testing.admin import put_topic
from metaq.common.errors import ErrorCode
from metaq.common.framing import FrameType, encode_frame
from metaq.common.record import encode
from metaq.common.v1.data_pb2 import PullRequest

StartBroker = Callable[..., BrokerProcess]


async def connect(broker: BrokerProcess) -> DataClient:
    return await DataClient.connect(broker.data_host, broker.data_port)


def not_writable(broker: BrokerProcess, needle: str) -> Callable[[], bool]:
    def check() -> bool:
        health = broker.health()
        return (
            health is not None
            and health["status"] == "not-writable"
            and needle in (health["reason"] or "")
        )

    return check


def refused_send(broker: BrokerProcess, topic: str) -> BrokerError:
    async def scenario() -> BrokerError:
        client = await connect(broker)
        try:
            await client.send(topic, 0, [encode(topic, b"after the death", queue_id=0)])
        except BrokerError as exc:
            return exc
        finally:
            await client.close()
        raise AssertionError("a send was answered OK by a broker whose background thread died")

    return run_async(scenario())


# ------------------------------------------------------------------------------------------
# background threads that die


def test_dead_dispatcher_takes_health_down_and_refuses_sends(start_broker: StartBroker) -> None:
    broker = start_broker("--set", "auto_create_topics=true")
    # The dispatcher creates a new queue's directory when the queue's first record comes;
    # a file in its place makes that fail, and the thread dies as on any I/O error.
    (broker.data_dir / "consumequeue").mkdir(exist_ok=True)
    (broker.data_dir / "consumequeue" / "Doomed").write_bytes(b"not a directory")

    async def first_send() -> None:
        await put_topic(broker.http_url, "Doomed", read_queues=1, write_queues=1)
        client = await connect(broker)
        try:
            await client.send("Doomed", 0, [encode("Doomed", b"never readable", queue_id=0)])
        finally:
            await client.close()

    run_async(first_send())
    wait_until(
        not_writable(broker, "dispatch"), 10.0, "/health reports the dead dispatcher", poll_s=0.05
    )
    error = refused_send(broker, "Doomed")
    assert error.code == ErrorCode.STORE_UNAVAILABLE, error
    assert "dispatch" in str(error), error
    assert "restart" in str(error), error


def test_dead_checkpointer_takes_health_down_and_refuses_sends(start_broker: StartBroker) -> None:
    broker = start_broker("--set", "store.checkpoint_interval_ms=50")
    run_async(put_topic(broker.http_url, "AfterCheckpoint", read_queues=1, write_queues=1))
    # The checkpoint is replaced through a temporary file: a directory there makes every
    # later checkpoint fail, and the thread that writes them dies.
    (broker.data_dir / "checkpoint.tmp").mkdir()
    wait_until(
        not_writable(broker, "checkpoint"),
        10.0,
        "/health reports the dead checkpointer",
        poll_s=0.05,
    )
    error = refused_send(broker, "AfterCheckpoint")
    assert error.code == ErrorCode.STORE_UNAVAILABLE, error
    assert "checkpoint" in str(error), error


# ------------------------------------------------------------------------------------------
# peers that never read their answers


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def pipelined_pulls(topic: str, count: int) -> bytes:
    frames: list[bytes] = []
    for request_id in range(1, count + 1):
        header = PullRequest(
            consumer_group="never-reads", topic=topic, queue_id=0, offset=0, max_messages=256
        ).SerializeToString()
        frames += (bytes(p) for p in encode_frame(FrameType.PULL, request_id, header))
    return b"".join(frames)


def test_peers_that_never_read_cannot_grow_the_broker_or_stall_others(
    start_broker: StartBroker,
) -> None:
    broker = start_broker()
    body = bytes(1024)

    async def fill() -> None:
        await put_topic(broker.http_url, "Unread", read_queues=1, write_queues=1)
        client = await connect(broker)
        try:
            for _ in range(4):
                batch = [encode("Unread", body, queue_id=0) for _ in range(64)]
                await client.send("Unread", 0, batch)
            await client.pull("Unread", 0, 255, long_poll_timeout_ms=5000)
        finally:
            await client.close()

    run_async(fill())
    pid = broker.proc.pid
    before = rss_bytes(pid)
    flood = pipelined_pulls("Unread", 2000)
    # Each pull answers with 256 KiB of records: 500 MiB if the broker buffered every
    # answer for peers that read none of them.
    hogs = [socket.create_connection((broker.data_host, broker.data_port)) for _ in range(3)]
    try:
        for hog in hogs:
            hog.sendall(flood)

        async def round_trips() -> float:
            client = await connect(broker)
            slowest = 0.0
            try:
                for _ in range(20):
                    started = time.monotonic()
                    await client.send("Unread", 0, [encode("Unread", b"meanwhile", queue_id=0)])
                    slowest = max(slowest, time.monotonic() - started)
            finally:
                await client.close()
            return slowest

        slowest = run_async(round_trips())
        grown = rss_bytes(pid, "VmHWM") - before
        assert grown < 64 * 1024 * 1024, f"the broker grew by {grown / 2**20:.0f} MiB"
        assert slowest < 1.0, f"a send took {slowest:.3f} s while others did not read"
    finally:
        for hog in hogs:
            hog.close()
