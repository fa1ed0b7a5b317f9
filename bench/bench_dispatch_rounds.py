"""The dispatcher's CPU per record by round size: one-at-a-time sends make rounds of one
record, batches and catching up make large ones.

Appends a log (one-message sends to several queues, or like records to one queue), then
dispatches it afresh, in process, into new consume queues and a new index, ``N``
records a round, and reports the thread CPU per record. Light: seconds of one core.

    make bench-dispatch
    uv run --frozen python bench/bench_dispatch_rounds.py [--workload sends|batch] [--repeat 3]
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path
from typing import Final

from metaq.broker.store.config import KIB, MIB, StoreConfig
from metaq.broker.store.consume_queue import QueueTable
from metaq.broker.store.dispatch import Dispatcher
from metaq.broker.store.index import MessageIndex
from metaq.broker.store.segment import RealDisk
from metaq.broker.store.store import MessageStore
from metaq.common.record import encode

ROUNDS: Final = (1, 2, 4, 8, 16, 64, 256, 1024)


def _no_disk_pressure(_path: Path) -> float:
    return 0.0


def _fill(store: MessageStore, records: int, workload: str) -> list[int]:
    """Append ``records`` of ``workload``; return where each record starts.

    ``sends``: one-message sends to two topics of four queues each, a key on every other.
    ``batch``: like records to one queue, no keys, as batched sends and a catch-up bring.
    """
    body = bytes(KIB)
    for n in range(records):
        if workload == "sends":
            keys = (f"order-{n:08d}",) if n % 2 else ()
            topic, queue_id = ("bench-a", "bench-b")[n % 2], n // 2 % 4
        else:
            keys, topic, queue_id = (), "bench-a", 0
        store.append([encode(topic, body, queue_id=queue_id, tags="TagA", keys=keys)])
    store.dispatcher.catch_up()
    log = store.commitlog
    return [offset for offset, _ in log.records(log.min_offset, log.write_offset)]


def _dispatch_cpu(store: MessageStore, starts: list[int], per_round: int, root: Path) -> float:
    """Thread CPU seconds to dispatch the log afresh, ``per_round`` records a round."""
    config = store.config
    queues = QueueTable(root / "queues", config.consume_queue_segment_entries, RealDisk())
    index = MessageIndex(root / "index", config.index_slots, config.index_entries, RealDisk())
    index.load()
    dispatcher = Dispatcher(store.commitlog, queues, index)
    bounds = [*starts[::per_round], store.commitlog.write_offset]
    dispatcher.dispatched = bounds[0]
    try:
        began = time.thread_time()
        for first, after in itertools.pairwise(bounds):
            dispatcher.dispatch(after - first)
        spent = time.thread_time() - began
        if dispatcher.dispatched != store.commitlog.write_offset:
            raise RuntimeError("the dispatcher stopped short of the log's end")
        return spent
    finally:
        queues.close()
        index.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many passes")
    parser.add_argument("--workload", choices=("sends", "batch"), default="sends")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-dispatch-") as tmp:
        root = Path(tmp)
        config = StoreConfig(
            data_dir=root / "store", commitlog_segment_bytes=64 * MIB,
            consume_queue_segment_entries=1024, index_slots=4096, index_entries=16_384,
        )  # fmt: skip
        store = MessageStore(config, disk_usage=_no_disk_pressure)
        store.start()
        try:
            starts = _fill(store, args.records, args.workload)
            print(f"{len(starts)} records of {args.workload}; µs of dispatch CPU per record, "
                  f"best of {args.repeat}")  # fmt: skip
            figures: dict[int, float] = {}
            for per_round in ROUNDS:
                best = min(
                    _dispatch_cpu(store, starts, per_round, root / f"run-{per_round}-{n}")
                    for n in range(args.repeat)
                )
                figures[per_round] = round(best / len(starts) * 1e6, 2)
                print(f"  rounds of {per_round:>4}: {figures[per_round]:7.1f}")
            print(json.dumps({"workload": args.workload, "us_per_record": figures}))
        finally:
            store.close()


if __name__ == "__main__":
    main()
