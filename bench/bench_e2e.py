"""End-to-end producer throughput and send latency against a real broker over loopback.

Starts one nameserver and one broker (ASYNC flush) as processes, creates a topic of 8
queues, and measures, for 128 B and 1 KiB bodies:

- **one at a time** — one coroutine doing ``await producer.send`` in a loop;
- **pipelined** — many coroutines sending concurrently, so the accumulator coalesces
  their sends into batches per queue;
- **send_batch** — a few callers each sending lists of messages with ``send_batch``;
- **2 processes** — the pipelined and send_batch cells again with two producer
  processes at once (the broker's single core is then the limit);
- **send → handler** — ``bench_e2e_latency.py`` (its own nameserver and broker): a
  producer offering 5,000 msgs/s of 1 KiB for 10 s to a push consumer, latency from each
  message's scheduled send to its handler (``e2e_p99_ms_at_5k``, target ≤ 10 ms);

with p50 / p99 / p99.9 of the send latency (call to result) for the first two. The
one-at-a-time cells run first and the send → handler cell after a ``sync``, so that
neither carries the write-back of the gigabytes the throughput cells leave dirty. Client,
broker and nameserver share the machine's cores, so every figure includes their
contention. The client runs on uvloop and calls ``gc.freeze()`` after set-up.

The last line of the output is one JSON object with every figure; ``batch_1k_msgs_s``
and ``sync_one_at_a_time_msgs_s`` (1 KiB) are the headline ones.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from metaq_load import (
    Budget,
    batched,
    one_at_a_time,
    percentile_ms,
    pipelined,
    settle_disk,
)

from metaq.client.producer import Producer
from metaq.testing.cluster import ClusterBuilder

TOPIC: Final = "BenchE2E"
QUEUES: Final = 8
SIZES: Final = (128, 1024)
PIPELINE_SENDERS: Final = 512
BATCH_CALLERS: Final = 4
BATCH_MESSAGES: Final = 1024
TARGETS: Final = {
    ("send_batch", 1024): 200_000,
    ("one at a time", 1024): 6_000,
    ("one at a time", 128): 6_000,
}


async def _producer(nameserver: str) -> Producer:
    producer = Producer([nameserver])
    await producer.start()
    await producer.routes.route(TOPIC)
    await producer.send(TOPIC, b"warm-up")
    return producer


async def child(nameserver: str, mode: str, size: int, seconds: float, start_at: float) -> None:
    """One of the parallel producer processes: wait for the common start, measure, print."""
    producer = await _producer(nameserver)
    gc.freeze()
    try:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        body = bytes(size)
        rate = (
            (await pipelined(producer, TOPIC, body, Budget(seconds), PIPELINE_SENDERS))[0]
            if mode == "pipelined"
            else await batched(
                producer, TOPIC, body, Budget(seconds), BATCH_CALLERS, BATCH_MESSAGES
            )
        )
    finally:
        await producer.close()
    print(json.dumps({"rate": rate}))


def parallel(nameserver: str, mode: str, size: int, seconds: float, processes: int = 2) -> float:
    start_at = time.time() + 2.0  # every child connected and warm before the clock starts
    command = [
        sys.executable,
        __file__,
        "--child",
        nameserver,
        mode,
        str(size),
        str(seconds),
        str(start_at),
    ]
    children = [
        subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(processes)
    ]
    total = 0.0
    for proc in children:
        out, _ = proc.communicate(timeout=seconds + 60)
        if proc.returncode != 0:
            raise RuntimeError(f"producer process failed ({proc.returncode}): {out}")
        total += json.loads(out.strip().splitlines()[-1])["rate"]
    return total


async def measure(
    nameserver: str, seconds: float, figures: dict[str, Any], rows: list[list[str]]
) -> None:
    producer = await _producer(nameserver)
    gc.freeze()
    try:
        # The one-at-a-time cells first, after the broker's start-up writes (its first
        # commitlog segments, pre-faulted with zeros) are written back.
        settle_disk()
        for size in SIZES:
            body = bytes(size)
            tag = _tag(size)
            rate, lat = await one_at_a_time(producer, TOPIC, body, Budget(seconds))
            figures[f"one_at_a_time_{tag}_msgs_s"] = round(rate)
            figures[f"one_at_a_time_{tag}_p50_ms"] = round(percentile_ms(lat, 0.5), 3)
            figures[f"one_at_a_time_{tag}_p99_ms"] = round(percentile_ms(lat, 0.99), 3)
            figures[f"one_at_a_time_{tag}_p999_ms"] = round(percentile_ms(lat, 0.999), 3)
            rows.append(_row("one at a time", size, rate, lat))
        for size in SIZES:
            body = bytes(size)
            tag = _tag(size)
            rate, lat = await pipelined(producer, TOPIC, body, Budget(seconds), PIPELINE_SENDERS)
            figures[f"pipelined_{tag}_msgs_s"] = round(rate)
            figures[f"pipelined_{tag}_p50_ms"] = round(percentile_ms(lat, 0.5), 3)
            figures[f"pipelined_{tag}_p99_ms"] = round(percentile_ms(lat, 0.99), 3)
            figures[f"pipelined_{tag}_p999_ms"] = round(percentile_ms(lat, 0.999), 3)
            rows.append(_row(f"pipelined ({PIPELINE_SENDERS} senders)", size, rate, lat))

            rate = await batched(
                producer, TOPIC, body, Budget(seconds), BATCH_CALLERS, BATCH_MESSAGES
            )
            figures[f"batch_{tag}_msgs_s"] = round(rate)
            rows.append(_row("send_batch", size, rate, None))
            figures[f"records_per_frame_{tag}"] = round(
                producer.sender.records_sent / max(producer.sender.batches_sent, 1), 1
            )
    finally:
        await producer.close()


def _tag(size: int) -> str:
    return "1k" if size == 1024 else str(size)


def _row(cell: str, size: int, rate: float, lat: list[float] | None) -> list[str]:
    target = TARGETS.get((cell, size))
    met = (
        ""
        if target is None
        else f"{'≥' if rate >= target else '<'} {target:,} {'ok' if rate >= target else 'MISSED'}"
    )
    pcts = (
        ["-", "-", "-"]
        if lat is None
        else [f"{percentile_ms(lat, f):.2f}" for f in (0.5, 0.99, 0.999)]
    )
    return [cell, f"{size} B", f"{rate:,.0f}", *pcts, met]


def e2e_latency(seconds: float = 10.0) -> dict[str, Any]:
    """Send → handler latency at 5,000 msgs/s of 1 KiB for ``seconds``: the consumer's
    benchmark, ``bench_e2e_latency.py``, run with a nameserver and broker of its own."""
    script = Path(__file__).with_name("bench_e2e_latency.py")
    done = subprocess.run(
        [sys.executable, str(script), "--seconds", str(seconds)],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench_e2e_latency.py failed ({done.returncode}): {done.stderr}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def print_table(rows: list[list[str]]) -> None:
    headers = ["cell", "body", "msgs/s", "p50 ms", "p99 ms", "p99.9 ms", "target"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per cell (default 3)")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        import uvloop

        run: Callable[[Any], Any] = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is installed with the broker
        run = asyncio.run
    if args.child:
        nameserver, mode, size, seconds, start_at = args.child
        run(child(nameserver, mode, int(size), float(seconds), float(start_at)))
        return

    work = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    figures: dict[str, Any] = {}
    rows: list[list[str]] = []
    builder = ClusterBuilder(
        broker_args=("--flush-mode", "async", "--set", "store.commitlog_segment_bytes=268435456"),
        small_store=False,
        ready_timeout_s=60,
    )
    try:
        with builder.start(work) as cluster:
            nameserver = cluster.nameserver_addresses[0]
            run(cluster.create_topic(TOPIC, queues=QUEUES))
            run(measure(nameserver, args.seconds, figures, rows))
            for size in SIZES:
                tag = _tag(size)
                for mode in ("pipelined", "batch"):
                    rate = parallel(nameserver, mode, size, args.seconds)
                    figures[f"two_procs_{mode}_{tag}_msgs_s"] = round(rate)
                    name = "pipelined" if mode == "pipelined" else "send_batch"
                    rows.append(_row(f"2 processes, {name}", size, rate, None))
    finally:
        shutil.rmtree(work, ignore_errors=True)  # gigabytes of preallocated segments
    settle_disk()
    latency = e2e_latency()
    for name in ("p50", "p99", "p999"):
        figures[f"e2e_{name}_ms_at_5k"] = latency[f"e2e_{name}_ms"]
    p99 = latency["e2e_p99_ms"]
    rows.append(
        [
            "send → handler at 5,000/s",
            "1024 B",
            f"{latency['sent_msgs_per_s']:,.0f}",
            *(f"{latency[f'e2e_{name}_ms']:.2f}" for name in ("p50", "p99", "p999")),
            f"p99 {'≤' if p99 <= 10 else '>'} 10 ms {'ok' if p99 <= 10 else 'MISSED'}",
        ]
    )
    print_table(rows)
    figures["sync_one_at_a_time_msgs_s"] = figures["one_at_a_time_1k_msgs_s"]
    figures["seconds_per_cell"] = args.seconds
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
