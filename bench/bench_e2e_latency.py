"""End-to-end latency, send → handler, at a fixed offered rate over loopback.

A real nameserver and a real broker (ASYNC flush) run as processes; one Producer sends
1 KiB messages open-loop at ``--rate`` messages per second (each message has a
scheduled send time, kept whether or not earlier sends were answered, so a stall shows
up as latency instead of a lower rate), and one PushConsumer in the same process
long-polls the topic's queues. A message's latency is from its scheduled send time to
the moment its handler is called. The first ``--warmup-s`` are left out of the figures.
The schedule is :class:`compare_harness.OpenLoop`'s, the one every system of
``make bench-compare`` is driven by: it wakes every millisecond to send what came due.

The client runs on uvloop when installed and calls ``gc.freeze()`` once set up (both
can be turned off): without the freeze, CPython's full collections walk every object
start-up left behind and pause the loop for 20-40 ms a few times in ten seconds, which
alone sets the p99.

Producer and consumer share one event loop, and the broker the machine's cores, so the
figures include all of their scheduling. The last line is a JSON object of the figures;
``e2e_p99_ms_at_5k`` is the p99 at the default 5,000 msgs/s (target: ≤ 10 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compare_harness import OpenLoop

from metaq.client.admin import Admin, TopicSettings
from metaq.client.consumer import LAST, Message, PushConsumer
from metaq.client.producer import Producer
from metaq.client.routes import RouteCache
from metaq.common.tls import TlsConfig
from metaq.common.users import Credentials
from metaq.testing.cluster import ClusterBuilder

TOPIC = "BenchE2ELatency"


async def _wait_routed(nameserver: str, queues: int, tls: TlsConfig | None = None) -> None:
    routes = RouteCache([nameserver], tls=tls)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if len((await routes.route(TOPIC, refresh=True)).read_queues) == queues:
                    return
            except Exception:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise RuntimeError(f"{TOPIC} did not get {queues} routed queues in 20 s")
            await asyncio.sleep(0.05)
    finally:
        await routes.stop()


async def measure(
    nameserver: str, http_url: str, *, rate: float, seconds: float, warmup_s: float, size: int,
    queues: int, gc_freeze: bool = True, tls: TlsConfig | None = None,
    credentials: Credentials | None = None, trace: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Run the measurement against a running nameserver and broker (over TLS with
    ``tls``; the topic made as ``credentials``' user when auth is on, the clients finding
    theirs in the environment; with ``trace``, both clients write message trace); the
    figures."""
    await Admin(credentials=credentials, tls=tls).put_topic(
        http_url, TOPIC, TopicSettings(read_queues=queues, write_queues=queues)
    )
    await _wait_routed(nameserver, queues, tls)
    run = OpenLoop(rate, seconds, size, warmup_s=warmup_s, drain_timeout_s=30.0,
                   gc_freeze=gc_freeze)  # fmt: skip

    async def handle(message: Message) -> None:
        run.on_message(message.body)

    consumer = PushConsumer(
        [nameserver], "bench-e2e-latency", consume_from=LAST, tls=tls, trace=trace
    )
    consumer.subscribe(TOPIC, handle)

    def count_error(future: asyncio.Future[Any]) -> None:
        if future.exception() is not None:
            run.errors += 1

    async with Producer([nameserver], linger_ms=0.5, tls=tls, trace=trace) as producer:

        async def send(bodies: list[bytes]) -> None:
            for body in bodies:
                producer.send_async(TOPIC, body).add_done_callback(count_error)

        await consumer.start()
        try:
            deadline = time.monotonic() + 20
            while not (
                len(consumer.assigned_queues) == queues
                and all(
                    (q := consumer.queue_state(k)) is not None and q.committed is not None
                    for k in consumer.assigned_queues
                )
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the consumer did not take every queue in 20 s")
                await asyncio.sleep(0.01)
            cpu_before = time.process_time()
            result = await run.run(send)
            cpu_seconds = time.process_time() - cpu_before
        finally:
            await consumer.close()
    latency = result.latency
    return {
        "offered_msgs_per_s": rate,
        "sent_msgs_per_s": result.offered_msgs_s,
        "messages": result.sent,
        "measured": len(run.latencies),
        "delivered": result.delivered,
        "send_errors": run.errors,
        "message_bytes": size,
        "gc_freeze": gc_freeze,
        "client_cpu_us_per_msg": round(cpu_seconds / result.sent * 1e6, 1),
        "e2e_p50_ms": round(latency.p50_ms, 3),
        "e2e_p99_ms": round(latency.p99_ms, 3),
        "e2e_p999_ms": round(latency.p999_ms, 3),
        "e2e_max_ms": round(max(run.latencies, default=float("nan")) * 1e3, 3),
    }


def _loop_factory(use_uvloop: bool) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if not use_uvloop:
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=5000.0, help="offered msgs/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds")
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--size", type=int, default=1024, help="body bytes")
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--flush-mode", default="async", choices=["async", "sync"])
    parser.add_argument(
        "--broker-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a broker setting (as its --set), repeatable",
    )
    parser.add_argument(
        "--gc-freeze",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="gc.freeze() once set up, as a latency-sensitive service would",
    )
    parser.add_argument(
        "--uvloop", action=argparse.BooleanOptionalAction, default=True,
        help="run the client on uvloop when it is installed (the broker always does)",
    )  # fmt: skip
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    builder = ClusterBuilder(
        broker_args=(
            *("--flush-mode", args.flush_mode),
            *("--set", "store.commitlog_segment_bytes=134217728"),
            *(arg for setting in args.broker_set for arg in ("--set", setting)),
        ),
        small_store=False,
    )
    with (
        tempfile.TemporaryDirectory(prefix="metaq-bench-e2e-") as work,
        builder.start(Path(work)) as cluster,
    ):
        broker = cluster.broker("broker-a")
        with asyncio.Runner(loop_factory=_loop_factory(args.uvloop)) as runner:
            figures = runner.run(
                measure(
                    cluster.nameserver_addresses[0],
                    broker.http_url,
                    rate=args.rate,
                    seconds=args.seconds,
                    warmup_s=args.warmup_s,
                    size=args.size,
                    queues=args.queues,
                    gc_freeze=args.gc_freeze,
                )
            )
        broker.terminate()
    for key, value in figures.items():
        print(f"{key:>22}: {value}")
    if args.rate == 5000 and args.size == 1024:
        figures["e2e_p99_ms_at_5k"] = figures["e2e_p99_ms"]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
