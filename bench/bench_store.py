"""Storage benchmark: in-process appends, dispatch, SYNC group commit, hot reads and recovery."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from metaq.broker.store.checkpoint import read_checkpoint
from metaq.broker.store.config import GIB, KIB, MIB, FlushMode, StoreConfig
from metaq.broker.store.flush import AsyncDurability
from metaq.broker.store.store import MessageStore
from metaq.common.errors import StoreUnavailable
from metaq.common.record import encode

REPO: Final = Path(__file__).resolve().parent.parent
RESULTS: Final = REPO / "bench" / "results"
TOPIC: Final = "BenchTopic"
FEW_QUEUES: Final = 16
BATCH: Final = 32
POOL: Final = 4096
BODY_SIZES: Final = {"128b": 128, "1k": KIB, "4k": 4 * KIB}
SYNC_APPENDERS: Final = (1, 16, 64)
MIN_FREE_FOR_RECOVERY: Final = 4 * GIB
TARGET_ASYNC_1K: Final = 150_000.0
TARGET_QUEUES_RATIO: Final = 0.80
TARGET_SYNC_RATIO: Final = 0.25
TARGET_RECOVERY_S: Final = 10.0

Figures = dict[str, float | int | str | bool | None]


@dataclass(frozen=True, slots=True)
class Plan:
    """How long and how big each cell is; ``--quick`` shrinks everything."""

    cell_s: float
    raw_cap_bytes: int
    segment_bytes: int
    many_queues: int
    new_queue_sample: int
    recovery_bytes: int
    drain_s: float
    quick: bool


FULL: Final = Plan(3.5, 2 * GIB, 1 * GIB, 10_000, 200, 1 * GIB, drain_s=8.0, quick=False)
QUICK: Final = Plan(0.25, 64 * MIB, 64 * MIB, 1_000, 20, 64 * MIB, drain_s=2.0, quick=True)


@dataclass(frozen=True, slots=True)
class Rate:
    msgs: int
    nbytes: int
    seconds: float

    @property
    def msgs_s(self) -> float:
        return self.msgs / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_s(self) -> float:
        return self.nbytes / self.seconds / 1e6 if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class AppendRun:
    """One timed append window and what the dispatcher did around it."""

    rate: Rate
    dispatched_msgs: int
    rejected: int
    max_backlog: int
    end_backlog: int
    catch_up_s: float
    abandoned: int
    segments: int
    throttled: bool

    @property
    def dispatched_msgs_s(self) -> float:
        """Messages appended and dispatched (visible to consumers) within the window."""
        return self.dispatched_msgs / self.rate.seconds

    @property
    def behind_s(self) -> float:
        """How many seconds of appends the dispatcher had still to do when the window closed."""
        return self.end_backlog / self.rate.nbytes * self.rate.seconds if self.rate.msgs else 0.0

    @property
    def kept_up(self) -> bool:
        """Under a quarter second behind at the end, and never pushed back on appenders."""
        return self.behind_s < 0.25 and not self.throttled and not self.abandoned


@dataclass(slots=True)
class Row:
    cell: str
    msgs_s: float | None = None
    mb_s: float | None = None
    vs_raw: float | None = None
    latency: str = ""
    note: str = ""
    target: str = ""


@dataclass(slots=True)
class Results:
    rows: list[Row] = field(default_factory=list)
    figures: Figures = field(default_factory=dict)
    raw_mb_s: dict[str, float] = field(default_factory=dict)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(f"  done: {row.cell}", file=sys.stderr, flush=True)


# --- records and stores -----------------------------------------------------------------


def make_records(body_size: int, queues: int, count: int, topic: str = TOPIC) -> list[bytearray]:
    """Producer-built records, queue ids round-robin; built before any timing starts."""
    body = os.urandom(body_size)
    return [encode(topic, body, queue_id=i % queues) for i in range(count)]


def batches_of(records: Sequence[bytearray], size: int) -> list[list[bytearray]]:
    return [list(records[i : i + size]) for i in range(0, len(records), size)]


def new_store(root: Path, name: str, mode: FlushMode, plan: Plan) -> MessageStore:
    """A started store whose first two commitlog segments are already prefaulted."""
    config = StoreConfig(root / name, flush_mode=mode, commitlog_segment_bytes=plan.segment_bytes)
    store = MessageStore(config)
    store.start()
    store.append([encode(TOPIC, b"warm-up")])  # creates and prefaults the first segment
    settle(store)
    return store


def warm_up(store: MessageStore, records: Sequence[bytearray]) -> None:
    """One untimed round: the first touches of queue and index pages are not steady state."""
    for batch in batches_of(records, BATCH):
        store.append(batch)
    settle(store)


def settle(store: MessageStore) -> None:
    """Between windows: let the dispatcher catch up and the next segment finish prefaulting."""
    prepared = store.commitlog.segments._next  # prefaulted in the background after a roll
    if prepared is not None:
        prepared.result()
    drain(store)


def drop_store(store: MessageStore) -> None:
    store.close()
    shutil.rmtree(store.config.data_dir, ignore_errors=True)


def drain(store: MessageStore, timeout_s: float = 60.0) -> float:
    """Wait until the dispatcher has caught up with the commitlog; return the seconds."""
    began = time.perf_counter()
    while store.dispatch_backlog_bytes > 0 and time.perf_counter() - began < timeout_s:
        time.sleep(0.0005)
    return time.perf_counter() - began


# --- baseline -------------------------------------------------------------------------------


def raw_write(root: Path, records: Sequence[bytearray], plan: Plan) -> Rate:
    """A buffered sequential os.write() per record into a fresh file: the floor to compare.

    The loop has the append loop's shape (a clock check per call) so the ratio is fair.
    """
    path = root / "raw-write"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    write = os.write
    clock = time.perf_counter
    msgs = nbytes = 0
    try:
        began = clock()
        deadline = began + plan.cell_s
        for record in itertools.cycle(records):
            write(fd, record)
            msgs += 1
            nbytes += len(record)
            if clock() >= deadline or nbytes >= plan.raw_cap_bytes:
                break
        elapsed = clock() - began
    finally:
        os.close(fd)
        path.unlink()
    return Rate(msgs, nbytes, elapsed)


# --- appends --------------------------------------------------------------------------------


def append_window(
    store: MessageStore, batches: Sequence[list[bytearray]], seconds: float, drain_s: float
) -> AppendRun:
    """Append for ``seconds``, checking the clock after every call; then let dispatch finish."""
    append = store.append
    clock = time.perf_counter
    sent = rejected = max_backlog = 0
    dispatched_before = store.dispatcher.dispatched
    began = clock()
    deadline = began + seconds
    for calls, batch in enumerate(itertools.cycle(batches), 1):
        try:
            append(batch)
        except StoreUnavailable:
            rejected += len(batch)
        sent += len(batch)
        if calls & 255 == 0:
            max_backlog = max(max_backlog, store.dispatch_backlog_bytes)
        if clock() >= deadline:
            break
    elapsed = clock() - began
    return finish_window(store, batches, sent - rejected, elapsed, dispatched_before, rejected,
                         max(max_backlog, store.dispatch_backlog_bytes), drain_s)  # fmt: skip


def finish_window(
    store: MessageStore,
    batches: Sequence[list[bytearray]],
    msgs: int,
    elapsed: float,
    dispatched_before: int,
    rejected: int,
    max_backlog: int,
    drain_s: float,
) -> AppendRun:
    record_size = len(batches[0][0])
    dispatched = (store.dispatcher.dispatched - dispatched_before) // record_size
    end_backlog = store.dispatch_backlog_bytes
    catch_up = drain(store, drain_s)
    abandoned = abandon_backlog(store)
    throttled = rejected > 0 or max_backlog > store.config.dispatch_backlog_bytes
    return AppendRun(
        rate=Rate(msgs, msgs * record_size, elapsed),
        dispatched_msgs=min(dispatched, msgs),
        rejected=rejected,
        max_backlog=max_backlog,
        end_backlog=end_backlog,
        catch_up_s=catch_up,
        abandoned=abandoned,
        segments=len(store.commitlog.segments.segments),
        throttled=throttled,
    )


def abandon_backlog(store: MessageStore) -> int:
    """Skip what the dispatcher could not reach in time, so the store can stop now.

    Harness only: the data is thrown away, and stopping a store waits for a full catch-up.
    """
    with store.dispatcher.lock:
        left = store.commitlog.write_offset - store.dispatcher.dispatched
        store.dispatcher.dispatched = store.commitlog.write_offset
    return left


def dispatch_note(run: AppendRun) -> str:
    state = "kept up" if run.kept_up else "FELL BEHIND"
    note = (
        f"dispatch {state}: {run.dispatched_msgs_s:,.0f} msgs/s dispatched in window; backlog "
        f"end {run.end_backlog / MIB:.1f} MiB ({run.behind_s * 1e3:.0f} ms of appends), max "
        f"{run.max_backlog / MIB:.1f} MiB; catch-up {run.catch_up_s * 1e3:.0f} ms"
    )
    if run.throttled:
        note += "; appends throttled by dispatch back-pressure"
    if run.rejected:
        note += f"; {run.rejected} rejected (StoreUnavailable)"
    if run.abandoned:
        note += f"; not caught up after {run.catch_up_s:.0f} s, {run.abandoned / MIB:.0f} MiB left"
    return note


def record_append(results: Results, key: str, label: str, run: AppendRun, raw_key: str) -> None:
    ratio = run.rate.mb_s / results.raw_mb_s[raw_key]
    results.add(Row(label, run.rate.msgs_s, run.rate.mb_s, ratio, note=dispatch_note(run)))
    figures = results.figures
    figures[f"{key}_msgs_s"] = round(run.rate.msgs_s)
    figures[f"{key}_mb_s"] = round(run.rate.mb_s, 1)
    figures[f"{key}_vs_raw_write_ratio"] = round(ratio, 3)
    figures[f"{key}_dispatched_msgs_s"] = round(run.dispatched_msgs_s)
    figures[f"{key}_dispatch_kept_up"] = run.kept_up
    figures[f"{key}_dispatch_abandoned_bytes"] = run.abandoned
    figures[f"{key}_dispatch_backlog_end_bytes"] = run.end_backlog
    figures[f"{key}_dispatch_backlog_max_bytes"] = run.max_backlog
    figures[f"{key}_dispatch_catch_up_s"] = round(run.catch_up_s, 3)
    figures[f"{key}_rejected"] = run.rejected
    figures[f"{key}_throttled"] = run.throttled
    figures[f"{key}_commitlog_segments"] = run.segments


def raw_cell(
    results: Results, root: Path, name: str, records: Sequence[bytearray], plan: Plan
) -> None:
    rate = raw_write(root, records, plan)
    results.raw_mb_s[name] = rate.mb_s
    size = len(records[0])
    results.add(Row(f"raw os.write {name} ({size} B records)", rate.msgs_s, rate.mb_s, 1.0))
    results.figures[f"raw_write_{name}_msgs_s"] = round(rate.msgs_s)
    results.figures[f"raw_write_{name}_mb_s"] = round(rate.mb_s, 1)


def async_cells(results: Results, root: Path, name: str, plan: Plan) -> None:
    """Raw baseline, then single-record and batched ASYNC appends over 16 queues."""
    records = make_records(BODY_SIZES[name], FEW_QUEUES, POOL)
    raw_cell(results, root, name, records, plan)
    for label, batches in (
        ("single", [[r] for r in records]),
        ("batch32", batches_of(records, BATCH)),
    ):
        store = new_store(root, f"async-{name}-{label}", FlushMode.ASYNC, plan)
        try:
            warm_up(store, records)
            run = append_window(store, batches, plan.cell_s, plan.drain_s)
            cell = f"append ASYNC {name} {label}, {FEW_QUEUES} queues"
            record_append(results, f"append_async_{name}_{label}", cell, run, name)
            if name == "1k" and label == "single":
                hot_read_cell(results, store, plan)
        finally:
            drop_store(store)


# --- many queues ----------------------------------------------------------------------------


def create_queues(store: MessageStore, topic: str, queues: int) -> float:
    """Create consume-queue files in parallel (the dispatcher would do it one at a time)."""
    topic_b = topic.encode()

    def create(queue_id: int) -> None:
        store.queues.get_or_create(topic_b, queue_id).segments.segment_for_write(0)

    began = time.perf_counter()
    with ThreadPoolExecutor(64) as pool:
        list(pool.map(create, range(queues)))
    return time.perf_counter() - began


def serial_queue_creation_ms(store: MessageStore, count: int) -> float:
    """The dispatcher's own cost per brand-new queue: one record each, then catch up."""
    records = make_records(64, count, count, topic="BenchNewQueues")
    drain(store)
    began = time.perf_counter()
    store.append(records)
    drain(store)
    return (time.perf_counter() - began) / count * 1e3


def warm_many_queues(store: MessageStore, records: Sequence[bytearray], queues: int) -> float:
    """Create every queue and touch its first page, so the cell measures steady state.

    The dispatcher lock keeps the checkpointer out while the queue table grows: it walks
    the table without a lock, and a table that changes size under it kills it.
    """
    began = time.perf_counter()
    with store.dispatcher.lock:
        create_queues(store, TOPIC, queues)
    for batch in batches_of(records[:queues], BATCH):
        store.append(batch)
    drain(store)
    return time.perf_counter() - began


def many_queues_cells(results: Results, root: Path, plan: Plan) -> None:
    """Both windows on one store: warming up thousands of queues is slow (see the report)."""
    n = plan.many_queues
    records = make_records(KIB, n, max(n, POOL))
    store = new_store(root, f"queues-{n}", FlushMode.ASYNC, plan)
    try:
        per_queue_ms = serial_queue_creation_ms(store, plan.new_queue_sample)
        results.figures["queue_create_serial_ms"] = round(per_queue_ms, 2)
        results.figures[f"queues_{n}_warm_up_s"] = round(warm_many_queues(store, records, n), 2)
        for label, batches in (
            ("single", [[r] for r in records]),
            ("batch32", batches_of(records, BATCH)),
        ):
            settle(store)
            run = append_window(store, batches, plan.cell_s, plan.drain_s)
            cell = f"append ASYNC 1k {label}, {n} queues"
            record_append(results, f"append_async_1k_{label}_{n}q", cell, run, "1k")
    finally:
        drop_store(store)
    queue_ratios(results, n)


def queue_ratios(results: Results, n: int) -> None:
    figures = results.figures
    for label in ("single", "batch32"):
        many = figures[f"append_async_1k_{label}_{n}q_msgs_s"]
        few = figures[f"append_async_1k_{label}_msgs_s"]
        assert isinstance(many, int) and isinstance(few, int)
        figures[f"queues_{n}_vs_16_{label}_ratio"] = round(many / few, 3)
        many = figures[f"append_async_1k_{label}_{n}q_dispatched_msgs_s"]
        few = figures[f"append_async_1k_{label}_dispatched_msgs_s"]
        assert isinstance(many, int) and isinstance(few, int)
        figures[f"queues_{n}_vs_16_{label}_dispatched_ratio"] = round(many / few, 3)
    figures["queues_10k_vs_16_ratio"] = figures[f"queues_{n}_vs_16_single_ratio"]
    figures["queues_10k_vs_16_dispatched_ratio"] = figures[
        f"queues_{n}_vs_16_single_dispatched_ratio"
    ]
    figures["queues_10k_count"] = n


# --- SYNC -----------------------------------------------------------------------------------


@dataclass(slots=True)
class SyncStats:
    latencies_ns: list[int] = field(default_factory=list)
    timeouts: int = 0


async def sync_appender(
    store: MessageStore,
    durability: AsyncDurability,
    record: bytearray,
    deadline: float,
    stats: SyncStats,
) -> None:
    batch = [record]
    while time.perf_counter() < deadline:
        began = time.perf_counter_ns()
        appended = store.append(batch)
        if not await durability.wait(appended.end, 5):
            stats.timeouts += 1
        stats.latencies_ns.append(time.perf_counter_ns() - began)


async def sync_run(
    store: MessageStore, records: Sequence[bytearray], appenders: int, seconds: float
) -> tuple[Rate, SyncStats]:
    durability = AsyncDurability(asyncio.get_running_loop(), store.flusher)
    stats = SyncStats()
    began = time.perf_counter()
    deadline = began + seconds
    try:
        await asyncio.gather(
            *(
                sync_appender(store, durability, records[i], deadline, stats)
                for i in range(appenders)
            )
        )
    finally:
        durability.close()
    elapsed = time.perf_counter() - began
    msgs = len(stats.latencies_ns)
    return Rate(msgs, msgs * len(records[0]), elapsed), stats


def percentile_ms(sorted_ns: Sequence[int], q: float) -> float:
    if not sorted_ns:
        return 0.0
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1e6


def sync_cells(results: Results, root: Path, plan: Plan) -> None:
    records = make_records(KIB, FEW_QUEUES, max(SYNC_APPENDERS))
    store = new_store(root, "sync", FlushMode.SYNC, plan)
    try:
        warm_up(store, make_records(KIB, FEW_QUEUES, POOL))
        for appenders in SYNC_APPENDERS:
            rate, stats = asyncio.run(sync_run(store, records, appenders, plan.cell_s))
            record_sync(results, appenders, rate, stats)
    finally:
        drop_store(store)


def record_sync(results: Results, appenders: int, rate: Rate, stats: SyncStats) -> None:
    lat = sorted(stats.latencies_ns)
    p50, p99, p999 = (percentile_ms(lat, q) for q in (0.50, 0.99, 0.999))
    key = f"sync{appenders}"
    ratio = rate.mb_s / results.raw_mb_s["1k"]
    note = f"{stats.timeouts} durability timeouts" if stats.timeouts else ""
    results.add(
        Row(
            f"SYNC 1k, {appenders} appender(s)",
            rate.msgs_s,
            rate.mb_s,
            ratio,
            latency=f"{p50:.2f} / {p99:.2f} / {p999:.2f}",
            note=note,
        )
    )
    figures = results.figures
    figures[f"{key}_msgs_s"] = round(rate.msgs_s)
    figures[f"{key}_mb_s"] = round(rate.mb_s, 2)
    figures[f"{key}_p50_ms"] = round(p50, 3)
    figures[f"{key}_p99_ms"] = round(p99, 3)
    figures[f"{key}_p999_ms"] = round(p999, 3)
    figures[f"{key}_timeouts"] = stats.timeouts


# --- reads ----------------------------------------------------------------------------------


def hot_read(store: MessageStore, queues: int, seconds: float) -> Rate:
    """Pull 32 at a time round-robin over the queues, wrapping to the start at the end."""
    offsets = [store.min_offset(TOPIC, q) for q in range(queues)]
    msgs = nbytes = 0
    began = time.perf_counter()
    deadline = began + seconds
    while time.perf_counter() < deadline:
        for q in range(queues):
            result = store.get(TOPIC, q, offsets[q], max_messages=BATCH)
            got = len(result.records)
            msgs += got
            nbytes += result.total_bytes
            offsets[q] = result.next_offset if got else store.min_offset(TOPIC, q)
            result.release()
    return Rate(msgs, nbytes, time.perf_counter() - began)


def hot_read_cell(results: Results, store: MessageStore, plan: Plan) -> None:
    rate = hot_read(store, FEW_QUEUES, plan.cell_s)
    ratio = rate.mb_s / results.raw_mb_s["1k"]
    results.add(Row("hot read 1k, get(max_messages=32)", rate.msgs_s, rate.mb_s, ratio))
    results.figures["read_hot_1k_msgs_s"] = round(rate.msgs_s)
    results.figures["read_hot_1k_mb_s"] = round(rate.mb_s, 1)


# --- recovery -------------------------------------------------------------------------------


def fill_child(data_dir: Path, target: int, segment_bytes: int) -> None:
    """Child process: fill a store past ``target`` commitlog bytes, say ready, wait to die."""
    config = StoreConfig(data_dir, commitlog_segment_bytes=segment_bytes)
    store = MessageStore(config)
    store.start()
    batches = batches_of(make_records(KIB, FEW_QUEUES, POOL), BATCH)
    began = time.perf_counter()
    msgs = 0
    while store.commitlog.write_offset < target:
        for batch in batches:
            store.append(batch)
        msgs += POOL
    print(f"ready {msgs} {time.perf_counter() - began:.3f}", flush=True)
    time.sleep(3600)


def crash_image(data_dir: Path, plan: Plan) -> tuple[int, float]:
    """Run the filler child and kill -9 it the moment it is ready; return msgs and seconds."""
    cmd = [sys.executable, __file__, "--fill-child", str(data_dir), str(plan.recovery_bytes),
           str(plan.segment_bytes)]  # fmt: skip
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    watchdog = threading.Timer(300, child.kill)
    watchdog.start()
    try:
        assert child.stdout is not None
        line = child.stdout.readline().split()
        os.kill(child.pid, signal.SIGKILL)
    finally:
        watchdog.cancel()
        child.wait()
    if not line or line[0] != "ready":
        raise RuntimeError("the filler child died before it was ready")
    return int(line[1]), float(line[2])


def timed_start(data_dir: Path, plan: Plan) -> tuple[float, Figures]:
    """Time MessageStore(config).start() on a crashed store, then crash it again (halt)."""
    config = StoreConfig(data_dir, commitlog_segment_bytes=plan.segment_bytes)
    began = time.perf_counter()
    store = MessageStore(config)
    report = store.start()
    elapsed = time.perf_counter() - began
    store.halt()
    fields: Figures = dict(dataclasses.asdict(report))
    return elapsed, fields


def drop_page_cache(data_dir: Path) -> None:
    """Evict this store's files (only these) from the page cache, as a machine crash would."""
    for path in data_dir.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def checkpoint_lag(data_dir: Path) -> Figures:
    checkpoint = read_checkpoint(data_dir / "checkpoint")
    if checkpoint is None:
        return {"checkpoint": "missing"}
    age_ms = time.time_ns() // 1_000_000 - checkpoint.written_ms
    return {
        "checkpoint_durable": checkpoint.commitlog_durable,
        "checkpoint_dispatched": checkpoint.dispatched,
        "checkpoint_age_ms": age_ms,
    }


def recovery_variant(results: Results, data_dir: Path, plan: Plan, key: str, label: str) -> float:
    seconds, report = timed_start(data_dir, plan)
    for name, value in report.items():
        results.figures[f"{key}_{name}"] = value
    results.figures[f"{key}_s"] = round(seconds, 3)
    note = (
        f"full rebuild={report['full_rebuild']}, redispatched={report['redispatched_records']}, "
        f"tail: {report['tail_reason']}"
    )
    target = target_text(seconds <= TARGET_RECOVERY_S, f"≤ {TARGET_RECOVERY_S:.0f} s")
    results.add(Row(label, latency=f"{seconds:.2f} s", note=note, target=target))
    return seconds


def recovery_cells(results: Results, root: Path, plan: Plan) -> None:
    free = shutil.disk_usage(root).free
    size = "1gib" if plan.recovery_bytes == GIB else f"{plan.recovery_bytes // MIB}mib"
    results.figures["recovery_log_bytes"] = plan.recovery_bytes
    results.figures["recovery_1gib_s"] = None
    if free < MIN_FREE_FOR_RECOVERY:
        reason = f"only {free / GIB:.1f} GiB free, need {MIN_FREE_FOR_RECOVERY / GIB:.0f} GiB"
        results.figures["recovery_skipped"] = reason
        results.add(Row(f"recovery {size}: SKIPPED", note=reason))
        return
    data_dir = root / "recovery"
    msgs, fill_s = crash_image(data_dir, plan)
    results.figures["recovery_fill_msgs_s"] = round(msgs / fill_s)
    results.figures.update({f"recovery_{k}": v for k, v in checkpoint_lag(data_dir).items()})
    saved = (data_dir / "checkpoint").read_bytes()
    label = f"recovery {size} kill -9"
    warm = recovery_variant(results, data_dir, plan, f"recovery_{size}", f"{label}, checkpoint")
    if plan.recovery_bytes == GIB:
        results.figures["recovery_1gib_s"] = round(warm, 3)
    results.figures["recovery_s"] = round(warm, 3)
    (data_dir / "checkpoint").unlink()
    recovery_variant(
        results, data_dir, plan, f"recovery_{size}_full_scan", f"{label}, no checkpoint"
    )
    (data_dir / "checkpoint").write_bytes(saved)
    drop_page_cache(data_dir)
    recovery_variant(results, data_dir, plan, f"recovery_{size}_cold", f"{label}, checkpoint, cold")
    shutil.rmtree(data_dir, ignore_errors=True)


# --- report ---------------------------------------------------------------------------------


def target_text(met: bool | None, goal: str) -> str:
    verdict = "not measured" if met is None else "met" if met else "MISSED"
    return f"{verdict} (target {goal})"


def fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def print_table(results: Results) -> None:
    times = "p50/p99/p999 ms | time"
    head = f"{'cell':<44} {'msgs/s':>10} {'MB/s':>8} {'vs raw':>7}  {times:<22} notes"
    print(head)
    print("-" * len(head))
    for row in results.rows:
        notes = "; ".join(x for x in (row.target, row.note) if x)
        print(
            f"{row.cell:<44} {fmt(row.msgs_s, ',.0f'):>10} {fmt(row.mb_s, ',.1f'):>8} "
            f"{fmt(row.vs_raw, '.2f'):>7}  {row.latency:<22} {notes}"
        )


def headline(results: Results) -> None:
    """The figures the brief names, each beside its target."""
    f = results.figures
    single, batch = f["append_async_1k_single_msgs_s"], f["append_async_1k_batch32_msgs_s"]
    assert isinstance(single, int) and isinstance(batch, int)
    best = max(single, batch)
    f["append_async_1k_msgs_s"] = best
    f["append_vs_raw_write_ratio"] = (
        f["append_async_1k_batch32_vs_raw_write_ratio"]
        if batch >= single
        else f["append_async_1k_single_vs_raw_write_ratio"]
    )
    sync64 = f["sync64_msgs_s"]
    assert isinstance(sync64, int)
    f["sync64_vs_async_ratio"] = round(sync64 / single, 3)
    checks: list[tuple[str, float | int | str | bool | None, bool, str]] = [
        ("append_async_1k_msgs_s", best, best >= TARGET_ASYNC_1K, "≥ 150,000 msgs/s"),
        ("queues_10k_vs_16_ratio", f["queues_10k_vs_16_ratio"],
         _ge(f["queues_10k_vs_16_ratio"], TARGET_QUEUES_RATIO), "≥ 0.80"),
        ("  same, dispatched in window", f["queues_10k_vs_16_dispatched_ratio"],
         _ge(f["queues_10k_vs_16_dispatched_ratio"], TARGET_QUEUES_RATIO), "≥ 0.80"),
        ("sync64_vs_async_ratio", f["sync64_vs_async_ratio"],
         _ge(f["sync64_vs_async_ratio"], TARGET_SYNC_RATIO), "≥ 0.25"),
        ("recovery_1gib_s", f["recovery_1gib_s"],
         _le(f["recovery_1gib_s"], TARGET_RECOVERY_S), "≤ 10 s"),
    ]  # fmt: skip
    print("\ntargets")
    for name, value, met, goal in checks:
        shown = "n/a" if value is None else value
        verdict = target_text(None if value is None else met, goal)
        print(f"  {name:<28} {shown!s:>12}  {verdict}")
    print(
        f"  {'append_vs_raw_write_ratio':<28} {f['append_vs_raw_write_ratio']!s:>12}  (no target)"
    )


def _ge(value: object, bound: float) -> bool:
    return isinstance(value, int | float) and value >= bound


def _le(value: object, bound: float) -> bool:
    return isinstance(value, int | float) and value <= bound


def save(results: Results, plan: Plan, only: str | None) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "bench_store" + (f"_{only}" if only else "") + ("_quick" if plan.quick else "") + ".json"
    (RESULTS / name).write_text(json.dumps(results.figures, indent=2) + "\n")


# --- main -----------------------------------------------------------------------------------


def read_ahead_kb(path: Path) -> int | None:
    """The data disk's readahead: it decides what a first touch of a sparse mapping costs."""
    dev = os.stat(path).st_dev
    name = f"{os.major(dev)}:{os.minor(dev)}"
    block = Path("/sys/dev/block") / name
    for candidate in (
        Path("/sys/class/bdi") / name / "read_ahead_kb",
        block / "queue" / "read_ahead_kb",
        block.resolve().parent / "queue" / "read_ahead_kb",
    ):
        with contextlib.suppress(OSError, ValueError):
            return int(candidate.read_text())
    return None


def environment(results: Results, root: Path) -> None:
    figures: Figures = {
        "env_cpus": os.cpu_count(),
        "env_python": platform.python_version(),
        "env_kernel": platform.release(),
        "env_read_ahead_kb": read_ahead_kb(root),
        "env_disk_free_gib": round(shutil.disk_usage(root).free / GIB, 1),
    }
    results.figures.update(figures)
    print("machine: " + ", ".join(f"{k[4:]}={v}" for k, v in figures.items()), flush=True)


def only_async_single(results: Results, root: Path, plan: Plan) -> None:
    """Just the ASYNC 1k single-record window (for profiling)."""
    records = make_records(KIB, FEW_QUEUES, POOL)
    raw_cell(results, root, "1k", records, plan)
    store = new_store(root, "profile-async", FlushMode.ASYNC, plan)
    try:
        warm_up(store, records)
        run = append_window(store, [[r] for r in records], plan.cell_s, plan.drain_s)
        record_append(results, "append_async_1k_single", "append ASYNC 1k single", run, "1k")
    finally:
        drop_store(store)


def only_sync64(results: Results, root: Path, plan: Plan) -> None:
    """Just the SYNC window with 64 appenders (for profiling)."""
    raw_cell(results, root, "1k", make_records(KIB, FEW_QUEUES, POOL), plan)
    records = make_records(KIB, FEW_QUEUES, 64)
    store = new_store(root, "profile-sync", FlushMode.SYNC, plan)
    try:
        warm_up(store, make_records(KIB, FEW_QUEUES, POOL))
        rate, stats = asyncio.run(sync_run(store, records, 64, plan.cell_s))
        record_sync(results, 64, rate, stats)
    finally:
        drop_store(store)


def only_queues(results: Results, root: Path, plan: Plan) -> None:
    """Just the cells behind ``queues_10k_vs_16_ratio`` (for profiling)."""
    async_cells(results, root, "1k", plan)
    many_queues_cells(results, root, plan)


def run_all(results: Results, root: Path, plan: Plan) -> None:
    for name in BODY_SIZES:
        async_cells(results, root, name, plan)
    many_queues_cells(results, root, plan)
    sync_cells(results, root, plan)
    recovery_cells(results, root, plan)
    print_table(results)
    headline(results)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run of under 30 s")
    parser.add_argument(
        "--only",
        choices=("async-1k-single", "sync-64", "queues"),
        help="run one cell, or the cells of the queue ratio (for profiling)",
    )
    parser.add_argument("--seconds", type=float, help="override the seconds per cell")
    parser.add_argument("--fill-child", nargs=3, metavar=("DIR", "BYTES", "SEGMENT"),
                        help=argparse.SUPPRESS)  # fmt: skip
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> None:
    args = parse_args(argv)
    if args.fill_child:
        data_dir, target, segment = args.fill_child
        fill_child(Path(data_dir), int(target), int(segment))
        return
    plan = QUICK if args.quick else FULL
    if args.seconds:
        plan = dataclasses.replace(plan, cell_s=args.seconds)
    runners = {"async-1k-single": only_async_single, "sync-64": only_sync64, "queues": only_queues}
    runner = runners.get(args.only, run_all)
    RESULTS.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="bench-store-", dir=RESULTS))
    results = Results()
    environment(results, root)
    began = time.perf_counter()
    try:
        runner(results, root, plan)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if runner is not run_all:
        print_table(results)
    results.figures["quick"] = plan.quick
    results.figures["bench_seconds"] = round(time.perf_counter() - began, 1)
    save(results, plan, args.only)
    print(json.dumps(results.figures, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
