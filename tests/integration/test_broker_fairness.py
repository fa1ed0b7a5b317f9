"""One connection's burst of expensive requests does not stall the broker's others."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable

from metaq.client.admin import Admin, TopicSettings
from metaq.common.framing import FrameType, encode_frame
from metaq.common.record import encode
from metaq.common.v1.data_pb2 import PullRequest
from metaq.testing import BrokerProcess, DataClient, run_async

StartBroker = Callable[..., BrokerProcess]
PULLS = 2000


def test_a_burst_of_pipelined_pulls_leaves_other_connections_answered(
    start_broker: StartBroker,
) -> None:
    broker = start_broker()

    async def fill() -> None:
        await Admin().put_topic(
            broker.http_url, "Burst", TopicSettings(read_queues=1, write_queues=1)
        )
        client = await DataClient.connect(broker.data_host, broker.data_port)
        try:
            for _ in range(16):
                batch = [encode("Burst", bytes(200), queue_id=0) for _ in range(64)]
                await client.send("Burst", 0, batch)
        finally:
            await client.close()

    run_async(fill())
    header = PullRequest(
        consumer_group="heavy", topic="Burst", queue_id=0, offset=0, max_messages=1024
    ).SerializeToString()
    burst = b"".join(
        bytes(part) for n in range(PULLS) for part in encode_frame(FrameType.PULL, n + 1, header)
    )
    # A heavy but well-behaved reader: it sends every pull at once and reads every answer.
    reader = socket.create_connection((broker.data_host, broker.data_port))
    received = [0]
    done = threading.Event()

    def drain() -> None:
        try:
            while chunk := reader.recv(1 << 20):
                received[0] += len(chunk)
        finally:
            done.set()

    threading.Thread(target=drain, name="heavy-reader", daemon=True).start()

    async def round_trips() -> tuple[float, int]:
        client = await DataClient.connect(broker.data_host, broker.data_port)
        slowest, count = 0.0, 0
        try:
            await client.heartbeat()
            reader.sendall(burst)
            # While the broker works through the burst (each pull cuts 1,024 records).
            until = time.monotonic() + 3.0
            while time.monotonic() < until:
                started = time.monotonic()
                await client.heartbeat()
                slowest = max(slowest, time.monotonic() - started)
                count += 1
                await asyncio.sleep(0.005)  # pacing the probes, not a synchronisation
        finally:
            await client.close()
        return slowest, count

    try:
        slowest, count = run_async(round_trips(), 30.0)
        # The burst was real work: the reader got answers while the probes ran.
        assert received[0] > 10 * 1024 * 1024, f"the reader got only {received[0]} bytes"
        assert slowest < 0.5, (
            f"a heartbeat waited {slowest:.3f} s behind another connection's {PULLS} pulls "
            f"({count} probes)"
        )
    finally:
        reader.shutdown(socket.SHUT_RDWR)  # ends the reader's recv before the close
        done.wait(5.0)
        reader.close()
