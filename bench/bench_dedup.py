"""What telling a retried batch from a new one costs the broker: the id window's index probe
against the idempotent producers' sequence table, as the window grows.

The id window (``dedup_window_ms``) probes every index file written within the window for
each retried batch's ids (a hash summary per file, then the records behind matching
hashes). At 100,000 msgs/s an hour's window is 360 million ids, 900 index files of the
default 400,000 entries. This fills an index in process with ``--files`` full files of
random id hashes (default sizes, about 7 MB each on disk) and times ``maybe_stored`` for
a batch of 256 new ids (what every Spark write batch cost) at file counts up to it; the
cost per file is fitted and projected to 900 files. Beside it, the sequence table's check
of a batch of 256 re-sent sequences (each located) and of a new batch, with
``--producers`` producers of 8 queues each holding five runs.

    make bench-dedup
    uv run --frozen python bench/bench_dedup.py [--files 64] [--producers 10000]

The last line is one JSON object (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Final

import numpy as np

from metaq.broker.store.index import MessageIndex
from metaq.broker.store.producers import ProducerTable
from metaq.broker.store.segment import RealDisk

BATCH: Final = 256
SLOTS: Final = 100_000
ENTRIES: Final = 400_000
"""The store's default index file (StoreConfig.index_slots / index_entries)."""
HOUR_FILES: Final = 900
"""Index files an hour at 100,000 msgs/s fills: 360,000,000 / 400,000."""
TIMED: Final = 50


def _best_ms(call: object, repeat: int = TIMED) -> float:
    assert callable(call)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def window_probe(root: Path, files: int) -> dict[int, float]:
    """ms per ``maybe_stored`` of a batch of new ids, by index files in the window."""
    index = MessageIndex(root, SLOTS, ENTRIES, RealDisk())
    index.load()
    rng = np.random.default_rng(1)
    now_ms = time.time_ns() // 1_000_000
    steps = sorted({s for s in (1, 8, 16, 32, 64, 128, 256, 512, files) if s <= files})
    figures: dict[int, float] = {}
    offset = 0
    for step in steps:
        while len(index.files) < step or not index.files[-1].full:
            hashes = rng.integers(0, 2**32, ENTRIES, dtype=np.uint32)
            offsets = np.arange(offset, offset + ENTRIES, dtype=np.int64) * 1024
            times = np.full(ENTRIES, now_ms, np.int64)
            index.put_many(hashes, offsets, times)
            offset += ENTRIES
        ids = [os.urandom(16) for _ in range(BATCH)]
        for _ in range(len(index.files)):  # each call summarises one file: warm them all
            index.maybe_stored(ids, now_ms - 3_600_000)
        figures[len(index.files)] = round(
            _best_ms(lambda ids=ids: index.maybe_stored(ids, now_ms - 3_600_000)), 3
        )
        print(f"  {len(index.files):>4} index files: {figures[len(index.files)]:8.3f} ms")
    index.close()
    return figures


def sequence_check(producers: int) -> dict[str, float]:
    """ms per sequence-table check of a batch of 256: re-sent (located) and new."""
    table = ProducerTable()
    for pid in range(producers):
        for queue in range(8):
            for run in range(5):
                first = run * BATCH
                table.record((pid, b"orders", queue), 0, first, first + BATCH - 1, run * 10_000, 1)
    key = (producers // 2, b"orders", 3)
    return {
        "resent_batch_ms": round(_best_ms(lambda: table.check(key, 0, 3 * BATCH, BATCH)), 4),
        "new_batch_ms": round(_best_ms(lambda: table.check(key, 0, 5 * BATCH, BATCH)), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=64, help="index files filled (7 MB each)")
    parser.add_argument("--producers", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-dedup-") as tmp:
        print(f"id window: ms per probe of a batch of {BATCH} new ids (median of {TIMED})")
        probe = window_probe(Path(tmp), args.files)
    counts = sorted(probe)
    per_file = float(np.polyfit(counts, [probe[c] for c in counts], 1)[0]) if len(counts) > 1 else 0
    sequences = sequence_check(args.producers)
    print(f"sequence table ({args.producers} producers x 8 queues): {sequences}")
    figures = {
        "window_probe_ms_by_files": probe,
        "window_probe_ms_per_file": round(per_file, 4),
        "window_probe_ms_projected_hour_100k": round(per_file * HOUR_FILES, 1),
        "sequence_table_producers": args.producers * 8,
        **sequences,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
