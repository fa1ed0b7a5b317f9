"""MetaQ 2.0's own performance table (2013, slide 26 of the talk), run against metaq here.

The original: one broker on 16 cores, 24 GB, SAS RAID, ext4; send TPS by flush mode,
partition count and message size. Here: one nameserver and one broker process, the
client in this process over loopback, on a 2-core machine shared by all three.

For each flush mode a broker is started with two topics, one of 1,024 queues and one of
10,240 (the partitions), and each row runs the producer load of ``bench_e2e.py``'s
send_batch cell: callers each sending lists with ``send_batch``, every list to the next
queue round robin. Lists are small (``--batch``) so that a cell spreads its writes over
the partitions the way many producers would, rather than filling one queue; before the
cells, one pass writes one list to every queue so no cell pays for creating files.
A 1,024-partition row at 512 B, which the original lacks, is the reference for the
10,240-partition row (``p10240_vs_p1024_ratio``, target ≥ 0.8).

Each row prints TPS beside the original's, and the send_batch call latency
p50/p99/p99.9 beside the original's mean send time. The last line is a JSON object
(``async_1024p_128b_tps``, …, ``p10240_vs_p1024_ratio``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import uvloop
from metaq_load import Budget, batched, percentile_ms, ready_producer, wait_routed

from metaq.client.admin import Admin, TopicSettings
from metaq.client.producer import Producer
from metaq.testing.cluster import ClusterBuilder

PARTITIONS: Final = (1024, 10240)
MAX_CELL_S: Final = 15.0


@dataclass(frozen=True)
class Row:
    flush: str
    partitions: int
    size: int
    seed_tps: int | None
    seed_send_ms: float | None

    @property
    def name(self) -> str:
        size = f"{self.size // 1024}k" if self.size >= 1024 else str(self.size)
        return f"{self.flush}_{self.partitions}p_{size}b"


# Slide 26: flush, partitions, size, send TPS, mean send time (ms). None: not in the table.
GRID: Final = (
    Row("async", 1024, 128, 53_000, 4.1),
    Row("async", 1024, 256, 46_000, 5.0),
    Row("async", 1024, 512, None, None),
    Row("async", 1024, 2048, 33_000, 3.66),
    Row("async", 1024, 4096, 29_000, 5.0),
    Row("async", 10240, 512, 36_000, 5.3),
    Row("sync", 1024, 128, 39_000, 2.9),
    Row("sync", 1024, 256, 38_000, 3.0),
    Row("sync", 1024, 512, None, None),
    Row("sync", 1024, 2048, 27_000, 4.31),
    Row("sync", 1024, 4096, 22_000, 7.5),
    Row("sync", 10240, 512, 28_000, 7.0),
)


@dataclass(frozen=True)
class Result:
    row: Row
    tps: float
    p50_ms: float
    p99_ms: float
    p999_ms: float


def topic(partitions: int) -> str:
    return f"MetaQ2P{partitions}"


async def prepare(nameserver: str, http_url: str, callers: int) -> None:
    """Both topics routed, and one list written to every queue (files created)."""
    for partitions in PARTITIONS:
        settings = TopicSettings(read_queues=partitions, write_queues=partitions)
        await Admin().put_topic(http_url, topic(partitions), settings)
        await wait_routed(nameserver, topic(partitions), partitions, timeout_s=60)
    producer = await ready_producer(nameserver, topic(PARTITIONS[0]))
    try:
        for partitions in PARTITIONS:
            budget = Budget(120, max_messages=partitions)
            await batched(producer, topic(partitions), b"warm-up", budget, callers, 1)
    finally:
        await producer.close()


async def measure(nameserver: str, rows: list[Row], seconds: float, callers: int,
                  batch: int) -> list[Result]:  # fmt: skip
    producer: Producer = await ready_producer(nameserver, topic(PARTITIONS[0]))
    gc.freeze()  # start-up's objects out of the collector's view, as bench_e2e does
    results = []
    try:
        for row in rows:
            body = os.urandom(row.size)  # incompressible
            latencies: list[float] = []
            tps = await batched(
                producer, topic(row.partitions), body, Budget(seconds), callers, batch, latencies
            )
            latencies.sort()
            result = Result(row, tps, *(percentile_ms(latencies, f) for f in (0.5, 0.99, 0.999)))
            results.append(result)
            print(f"  {row.name}: {tps:,.0f} msgs/s", file=sys.stderr, flush=True)
    finally:
        await producer.close()
    return results


def run_flush_mode(work: Path, flush: str, seconds: float, callers: int,
                   batch: int) -> list[Result]:  # fmt: skip
    rows = [row for row in GRID if row.flush == flush]
    builder = ClusterBuilder(
        broker_args=("--flush-mode", flush, "--set", "store.commitlog_segment_bytes=268435456"),
        small_store=False,
        ready_timeout_s=60,
    )
    with (
        builder.start(work) as cluster,
        asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
    ):
        nameserver = cluster.nameserver_addresses[0]
        runner.run(prepare(nameserver, cluster.broker("broker-a").http_url, callers))
        return runner.run(measure(nameserver, rows, seconds, callers, batch))


def _num(value: float | None, digits: int = 0) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def print_table(results: list[Result]) -> None:
    print("| flush | partitions | size | MetaQ 2.0 TPS | metaq TPS | ÷ MetaQ 2.0 | target "
          "| MetaQ 2.0 send ms | send_batch p50 | p99 | p99.9 ms |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for r in results:
        seed = r.row.seed_tps
        ratio = None if seed is None else r.tps / seed
        target = ""
        if seed is not None and r.row.flush == "async" and r.row.partitions == 1024:
            target = "≥ 1.0 ok" if r.tps >= seed else "≥ 1.0 **missed**"
        print(
            f"| {r.row.flush} | {r.row.partitions:,} | {r.row.size:,} B | {_num(seed)} "
            f"| {r.tps:,.0f} | {_num(ratio, 2)} | {target} | {_num(r.row.seed_send_ms, 2)} "
            f"| {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.p999_ms:.2f} |"
        )


def figures(results: list[Result], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    by_name = {r.row.name: r for r in results}
    for r in results:
        out[f"{r.row.name}_tps"] = round(r.tps)
        out[f"{r.row.name}_p99_ms"] = round(r.p99_ms, 3)
    for flush in ("async", "sync"):
        many, few = by_name.get(f"{flush}_10240p_512b"), by_name.get(f"{flush}_1024p_512b")
        if many is not None and few is not None:
            prefix = "" if flush == "async" else "sync_"
            out[f"{prefix}p10240_vs_p1024_ratio"] = round(many.tps / few.tps, 3)
    seeds = [r for r in results if r.row.flush == "async" and r.row.partitions == 1024
             and r.row.seed_tps is not None]  # fmt: skip
    out["async_1024p_rows_at_seed"] = sum(r.tps >= (r.row.seed_tps or 0) for r in seeds)
    out["async_1024p_rows"] = len(seeds)
    out["async_1024p_min_vs_seed_ratio"] = (
        round(min(r.tps / (r.row.seed_tps or 1) for r in seeds), 3) if seeds else None
    )
    ratio = out.get("p10240_vs_p1024_ratio")
    out["targets_met"] = {
        "async_1024p_at_least_seed": bool(seeds) and out["async_1024p_rows_at_seed"] == len(seeds),
        "p10240_vs_p1024_at_least_0_8": None if ratio is None else ratio >= 0.8,
    }
    out.update(seconds_per_cell=args.seconds, callers=args.callers, batch=args.batch)
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per row")
    parser.add_argument("--callers", type=int, default=32, help="concurrent send_batch callers")
    parser.add_argument("--batch", type=int, default=32, help="messages per send_batch")
    parser.add_argument("--flush", default="async,sync", help="flush modes to run")
    args = parser.parse_args(argv)
    if not 0 < args.seconds <= MAX_CELL_S:
        parser.error(f"a row takes at most {MAX_CELL_S:.0f} s")
    # A SIGTERM unwinds like Ctrl-C, so the broker and nameserver are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    work = Path(tempfile.mkdtemp(prefix="metaq-bench-metaq2-"))
    results: list[Result] = []
    try:
        for flush in args.flush.split(","):
            print(f"{flush} flush: starting", file=sys.stderr, flush=True)
            results += run_flush_mode(work / flush, flush, args.seconds, args.callers, args.batch)
            shutil.rmtree(work / flush, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(results)
    print(json.dumps(figures(results, args), sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
