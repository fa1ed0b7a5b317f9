"""End-to-end SEND throughput over loopback: a real ``metaq-broker`` process, the test client.

Two shapes, 1 KiB messages, ASYNC flush by default:

- one at a time: one record per SEND, each awaited before the next (latency-bound);
- pipelined batches: ``--batch`` records per SEND, ``--window`` SENDs in flight.

Client and broker share the machine's cores, so the figures are a floor for the broker.
The last line is a JSON object of the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from metaq.client.admin import Admin, TopicSettings
from metaq.common.framing import FrameType
from metaq.common.record import encode
from metaq.common.v1.data_pb2 import SendRequest
from metaq.testing import BrokerProcess, DataClient, Reply

TOPIC = "BenchE2E"
QUEUES = 8


def _records(size: int, count: int, queue_id: int) -> list[bytearray]:
    body = b"x" * max(size - 120, 1)
    return [encode(TOPIC, body, queue_id=queue_id) for _ in range(count)]


async def one_at_a_time(client: DataClient, size: int, count: int) -> dict[str, float]:
    records = [_records(size, 1, q) for q in range(QUEUES)]
    latencies = []
    start = time.perf_counter()
    for n in range(count):
        began = time.perf_counter()
        await client.send(TOPIC, n % QUEUES, records[n % QUEUES])
        latencies.append(time.perf_counter() - began)
    seconds = time.perf_counter() - start
    latencies.sort()
    return {
        "msgs_per_s": count / seconds,
        "p50_us": latencies[len(latencies) // 2] * 1e6,
        "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6,
    }


async def pipelined(
    client: DataClient, size: int, batch: int, frames: int, window: int
) -> dict[str, float]:
    """Keep ``window`` SENDs in flight; each answer releases the next request."""
    loop = asyncio.get_running_loop()
    batches = [_records(size, batch, q) for q in range(QUEUES)]
    headers = [
        SendRequest(topic=TOPIC, queue_id=q, record_count=batch).SerializeToString()
        for q in range(QUEUES)
    ]
    done = loop.create_future()
    issued = answered = 0
    errors: list[BaseException] = []

    def issue() -> None:
        nonlocal issued
        q = issued % QUEUES
        issued += 1
        client.request(FrameType.SEND, headers[q], batches[q]).add_done_callback(on_answer)

    def on_answer(future: asyncio.Future[Reply]) -> None:
        nonlocal answered
        answered += 1
        error = future.exception()
        if error is not None:
            errors.append(error)
        if issued < frames:
            issue()
        elif answered == frames and not done.done():
            done.set_result(None)

    start = time.perf_counter()
    for _ in range(min(window, frames)):
        issue()
    await done
    seconds = time.perf_counter() - start
    if errors:
        raise errors[0]
    messages = frames * batch
    return {
        "msgs_per_s": messages / seconds,
        "mb_per_s": messages * size / seconds / 1e6,
        "frames_per_s": frames / seconds,
    }


def _best(runs: list[dict[str, float]], key: str = "msgs_per_s") -> dict[str, float]:
    best = max(runs, key=lambda r: r[key])
    return {**best, "median_msgs_per_s": statistics.median(r[key] for r in runs)}


async def _measure(broker: BrokerProcess, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    await Admin().put_topic(
        broker.http_url, TOPIC, TopicSettings(read_queues=QUEUES, write_queues=QUEUES)
    )
    client = await DataClient.connect(broker.data_host, broker.data_port)
    try:
        await one_at_a_time(client, args.size, 500)  # warm up
        single = _best(
            [await one_at_a_time(client, args.size, args.single) for _ in range(args.rounds)]
        )
        frames = args.messages // args.batch
        batched = _best(
            [
                await pipelined(client, args.size, args.batch, frames, args.window)
                for _ in range(args.rounds)
            ]
        )
        unbatched = _best(
            [
                await pipelined(client, args.size, 1, args.messages // 8, args.window * 4)
                for _ in range(args.rounds)
            ]
        )
    finally:
        await client.close()
    return {"one_at_a_time": single, "pipelined_batches": batched, "pipelined_single": unbatched}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=1024, help="bytes per record")
    parser.add_argument("--single", type=int, default=10_000, help="one-at-a-time sends")
    parser.add_argument("--messages", type=int, default=640_000, help="pipelined messages")
    parser.add_argument("--batch", type=int, default=32, help="records per SEND")
    parser.add_argument("--window", type=int, default=64, help="SENDs in flight")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--flush", choices=["async", "sync"], default="async")
    args = parser.parse_args()
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    except ImportError:
        factory = asyncio.new_event_loop
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        broker = BrokerProcess.start(
            Path(tmp) / "data",
            "--flush-mode", args.flush,
            "--log-level", "WARNING",
            "--set", "store.commitlog_segment_bytes=268435456",
            small_store=False,
        )  # fmt: skip
        try:
            with asyncio.Runner(loop_factory=factory) as runner:
                figures = runner.run(_measure(broker, args))
        finally:
            broker.terminate()
    single = figures["one_at_a_time"]
    batched = figures["pipelined_batches"]
    unbatched = figures["pipelined_single"]
    print(
        f"one at a time, {args.size} B: {single['msgs_per_s']:,.0f} msgs/s "
        f"(p50 {single['p50_us']:.0f} µs, p99 {single['p99_us']:.0f} µs)"
    )
    print(
        f"pipelined, {args.batch} x {args.size} B per SEND, {args.window} in flight: "
        f"{batched['msgs_per_s']:,.0f} msgs/s ({batched['mb_per_s']:,.0f} MB/s, "
        f"{batched['frames_per_s']:,.0f} SENDs/s)"
    )
    print(
        f"pipelined, 1 x {args.size} B per SEND, {args.window * 4} in flight: "
        f"{unbatched['msgs_per_s']:,.0f} msgs/s"
    )
    print(json.dumps({"flush": args.flush, "size": args.size, **figures}))


if __name__ == "__main__":
    main()
