"""How cost grows with the work, one dimension after another (``--dimension``, all by
default): ``queues`` (below), ``nameserver`` (``bench_scale_nameserver.py``), ``groups``
(consumer groups committing every second, ``scale_groups.py``), ``assignment`` (one
group's consumers and queues, ``scale_assignment.py``) and ``topics`` (creating 10,000
topics and one topic's route, ``scale_topics.py``). Each draws its curves beside
``--chart`` as ``bench-scale-<dimension>.png``.

Queues per broker: what a broker's store costs at 16, 1,000, 10,000 and 100,000 queues.

Queues are spread over topics as users make them, many topics of 8 to 16 queues each. For
each count a fresh store (the broker's ``MessageStore``, ASYNC flush, 256 MiB commitlog
segments) runs in child processes, one per step, so each is measured from the outside
as a broker would be:

1. ``fill``: one message to every queue (every queue gets its file), then appends for
   ``--seconds`` with the sends spread over all queues: a batch of ``--batch`` messages
   to one queue per call, queues in a shuffled order, round after round (as many
   producers' ``send_batch`` lists arrive). The rate counts messages appended and
   dispatched (readable) over the window and the catch-up after it. Then a clean stop.
2. ``start``: a clean start-up, timed; then the process's RSS, open descriptors, its
   mappings of store files and their size, and the disk the queue files take.
3. ``crash``: a start, then appends spread over all queues until ``kill -9``.
4. ``recover``: the start after the crash, timed (the commitlog checked from the
   checkpoint, the queues' tails cut to it and the rest re-dispatched).

Every step is bounded in time (``--step-timeout-s``); a count whose step does not finish
is reported as such with what it said, and the counts after it are skipped. The last line
is a JSON object with every figure and ``queues_100k_vs_16_append_ratio``,
``fds_at_100k_queues`` and ``recovery_100k_queues_s`` (null where 100,000 did not run).
``--chart PATH`` draws the curves (matplotlib, in the ``bench`` dependency group).
``--quick`` is a smoke run of a few seconds over small counts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import bench_scale_nameserver

POINTS: Final = (16, 1_000, 10_000, 100_000)
QUICK_POINTS: Final = (16, 200, 2_000)
BODY: Final = 128
SEGMENT_BYTES: Final = 256 * 1024 * 1024
QUICK_SEGMENT_BYTES: Final = 16 * 1024 * 1024
KILL_AFTER_S: Final = 2.0
QUICK_KILL_AFTER_S: Final = 0.5


def topic_sizes(queues: int) -> list[int]:
    """Topics of 8 to 16 queues (varied) adding up to ``queues``."""
    sizes: list[int] = []
    left = queues
    while left > 0:
        size = min(left, 8 + (len(sizes) * 5) % 9)
        sizes.append(size)
        left -= size
    return sizes


def queue_names(queues: int) -> list[tuple[str, int]]:
    return [(f"Scale{n:06d}", q) for n, size in enumerate(topic_sizes(queues)) for q in range(size)]


# --- the child: one step against one store ------------------------------------------------


def _process_figures(data: Path) -> dict[str, Any]:
    """What this process holds now: memory, descriptors, mappings of the store's files."""
    rss_kib = 0
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
    mapped_files = mapped_bytes = all_mappings = 0
    prefix = str(data)
    with open("/proc/self/maps") as maps:
        for line in maps:
            all_mappings += 1
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith(prefix):
                low, high = (int(x, 16) for x in fields[0].split("-"))
                mapped_files += 1
                mapped_bytes += high - low
    return {
        "rss_mib": round(rss_kib / 1024, 1),
        "open_fds": len(os.listdir("/proc/self/fd")),
        "mappings": all_mappings,
        "mapped_store_files": mapped_files,
        "mapped_store_gib": round(mapped_bytes / 2**30, 2),
    }


def _disk_bytes(directory: Path) -> int:
    """Blocks taken by everything under ``directory`` (files and the directories)."""
    total = 0
    stack = [directory]
    while stack:
        for entry in os.scandir(stack.pop()):
            total += entry.stat(follow_symlinks=False).st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
    return total


def _open_store(args: argparse.Namespace) -> tuple[Any, float, float]:
    from metaq.broker.store.config import FlushMode, StoreConfig
    from metaq.broker.store.store import MessageStore

    settings: dict[str, Any] = {}
    if args.mapped_queue_files:
        settings["mapped_queue_files"] = args.mapped_queue_files
    config = StoreConfig(
        Path(args.data),
        flush_mode=FlushMode.ASYNC,
        commitlog_segment_bytes=args.segment_bytes,
        **settings,
    )
    began, cpu = time.perf_counter(), time.process_time()
    store = MessageStore(config)
    store.start()
    return store, time.perf_counter() - began, time.process_time() - cpu


def _drain(store: Any, timeout_s: float) -> float:
    began = time.perf_counter()
    while store.dispatch_backlog_bytes > 0 and time.perf_counter() - began < timeout_s:
        time.sleep(0.001)
    return time.perf_counter() - began


def _batches(queues: int, batch: int, seed: int) -> list[list[bytearray]]:
    """One list of ``batch`` records per queue, in a shuffled queue order."""
    from metaq.common.record import encode

    body = random.Random(seed).randbytes(BODY)
    names = queue_names(queues)
    random.Random(seed).shuffle(names)
    return [[encode(topic, body, queue_id=q) for _ in range(batch)] for topic, q in names]


def _pool_figures(store: Any) -> dict[str, Any]:
    pool = getattr(store, "mapped_queue_files", None)
    if pool is None:
        return {}
    return {"pool_unmapped": pool.unmapped, "pool_mapped_again": pool.mapped_again}


def child(args: argparse.Namespace) -> None:
    data = Path(args.data)
    out: dict[str, Any] = {}
    store, start_s, start_cpu_s = _open_store(args)
    out["start_s"] = round(start_s, 3)
    out["start_cpu_s"] = round(start_cpu_s, 3)
    report = store.recovery
    if report is not None:
        out["crashed"] = report.crashed
        out["redispatched"] = report.redispatched_records
    if args.step == "fill":
        began = time.perf_counter()
        ones = [batch[0] for batch in _batches(args.queues, 1, seed=1)]
        for at in range(0, len(ones), 1024):
            store.append(ones[at : at + 1024])
        _drain(store, args.step_timeout_s)
        out["fill_s"] = round(time.perf_counter() - began, 2)
        batches = _batches(args.queues, args.batch, seed=2)
        clock = time.perf_counter
        cpu_began = time.process_time()
        sent, began = 0, clock()
        deadline = began + args.seconds
        for batch in itertools.cycle(batches):
            store.append(batch)
            sent += len(batch)
            if clock() >= deadline:
                break
        appended_s = time.perf_counter() - began
        catch_up_s = _drain(store, args.step_timeout_s)
        cpu_s = time.process_time() - cpu_began
        out["append_msgs_s"] = round(sent / (appended_s + catch_up_s))
        out["appended_only_msgs_s"] = round(sent / appended_s)
        out["catch_up_s"] = round(catch_up_s, 2)
        out["append_cpu_us_per_msg"] = round(cpu_s / sent * 1e6, 2)
        out.update(_pool_figures(store))
        out.update(_process_figures(data))
        store.close()
    elif args.step == "start":
        figures = _process_figures(data)
        out["rss_after_start_mib"] = figures["rss_mib"]
        out["open_fds_after_start"] = figures["open_fds"]
        out["queues_loaded"] = len(store.queues.queues)
        store.close()
        cq = data / "consumequeue"
        out["disk_per_queue_kib"] = round(_disk_bytes(cq) / args.queues / 1024, 2)
    elif args.step == "crash":
        batches = _batches(args.queues, args.batch, seed=3)
        print(json.dumps({"appending": True}), flush=True)
        while True:
            for batch in batches:
                store.append(batch)
    else:  # recover
        out["queues_loaded"] = len(store.queues.queues)
        out.update(_process_figures(data))
        store.close()
    print(json.dumps(out), flush=True)


# --- the parent -----------------------------------------------------------------------------


class StepFailed(Exception):
    pass


def run_step(args: argparse.Namespace, data: Path, queues: int, step: str) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--child",
        step,
        "--data",
        str(data),
        "--queues",
        str(queues),
        "--batch",
        str(args.batch),
        "--seconds",
        str(args.seconds),
        "--segment-bytes",
        str(args.segment_bytes),
        "--step-timeout-s",
        str(args.step_timeout_s),
    ]
    if args.mapped_queue_files:
        command += ["--mapped-queue-files", str(args.mapped_queue_files)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        if step == "crash":
            line = proc.stdout.readline()
            if not line:
                raise StepFailed(f"crash step ended early: {proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
            time.sleep(QUICK_KILL_AFTER_S if args.quick else KILL_AFTER_S)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return {}
        stdout, stderr = proc.communicate(timeout=args.step_timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate()
        raise StepFailed(
            f"{step} with {queues:,} queues did not finish in {args.step_timeout_s:.0f} s; "
            f"it said: {stderr.strip()[-1500:]}"
        ) from None
    if proc.returncode != 0:
        raise StepFailed(
            f"{step} with {queues:,} queues exited {proc.returncode}: {stderr.strip()[-1500:]}"
        )
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result


def measure(args: argparse.Namespace, work: Path, queues: int) -> dict[str, Any]:
    data = work / f"q{queues}"
    row: dict[str, Any] = {"queues": queues, "topics": len(topic_sizes(queues))}
    try:
        filled = run_step(args, data, queues, "fill")
        row.update(fill_s=filled["fill_s"], append_msgs_s=filled["append_msgs_s"],
                   appended_only_msgs_s=filled["appended_only_msgs_s"],
                   catch_up_s=filled["catch_up_s"])  # fmt: skip
        for key in ("append_cpu_us_per_msg", "rss_mib", "open_fds", "mappings",
                    "mapped_store_files", "mapped_store_gib"):  # fmt: skip
            row[key] = filled[key]
        row.update({k: v for k, v in filled.items() if k.startswith("pool_")})
        started = run_step(args, data, queues, "start")
        for key in ("start_s", "start_cpu_s", "rss_after_start_mib", "open_fds_after_start",
                    "disk_per_queue_kib"):  # fmt: skip
            row[key] = started[key]
        run_step(args, data, queues, "crash")
        recovered = run_step(args, data, queues, "recover")
        if not recovered.get("crashed"):
            raise StepFailed("the start after kill -9 did not find a crash")
        row["recovery_s"] = recovered["start_s"]
        row["recovery_cpu_s"] = recovered["start_cpu_s"]
        row["recovery_redispatched"] = recovered.get("redispatched")
        row["open_fds_after_recovery"] = recovered["open_fds"]
    except StepFailed as exc:
        row["failed"] = str(exc)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    def cell(row: dict[str, Any], key: str, fmt: str = ",") -> str:
        value = row.get(key)
        return "—" if value is None else format(value, fmt)

    print(
        "| queues | topics | append msgs/s | CPU µs/msg | RSS MiB | open fds "
        "| mapped store files | mapped GiB | start-up s | recovery s | disk KiB/queue |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['queues']:,} | {row['topics']:,} | {cell(row, 'append_msgs_s')} "
            f"| {cell(row, 'append_cpu_us_per_msg')} "
            f"| {cell(row, 'rss_mib')} | {cell(row, 'open_fds')} "
            f"| {cell(row, 'mapped_store_files')} | {cell(row, 'mapped_store_gib')} "
            f"| {cell(row, 'start_s')} | {cell(row, 'recovery_s')} "
            f"| {cell(row, 'disk_per_queue_kib')} |"
        )
        if "failed" in row:
            print(f"|  | failed: {row['failed'][:300]} |")


def figures(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    by_count = {row["queues"]: row for row in rows if "failed" not in row}
    out: dict[str, Any] = {"rows": rows, "seconds": args.seconds, "batch": args.batch}
    few = by_count.get(args.points[0], {}) if args.points else {}
    for row in by_count.values():
        out[f"append_msgs_s_at_{row['queues']}_queues"] = row["append_msgs_s"]
        out[f"fds_at_{row['queues']}_queues"] = row["open_fds"]
    top = by_count.get(100_000)
    ratio = None
    if top is not None and few.get("append_msgs_s"):
        ratio = round(top["append_msgs_s"] / few["append_msgs_s"], 3)
    out["queues_100k_vs_16_append_ratio"] = ratio
    out["fds_at_100k_queues"] = None if top is None else top["open_fds"]
    out["recovery_100k_queues_s"] = None if top is None else top["recovery_s"]
    largest = max(by_count, default=None)
    if largest is not None and few.get("append_msgs_s"):
        out["largest_queues_measured"] = largest
        out["largest_vs_first_append_ratio"] = round(
            by_count[largest]["append_msgs_s"] / few["append_msgs_s"], 3
        )
    if top is not None:
        out["targets_met"] = {
            "fds_at_100k_at_most_1000": top["open_fds"] <= 1000,
            "append_100k_at_least_0_7x_16": ratio is not None and ratio >= 0.7,
            "recovery_100k_at_most_30_s": top["recovery_s"] <= 30,
        }
    return out


def chart(rows: list[dict[str, Any]], before: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("append_msgs_s", "append + dispatch, msgs/s"),
        ("append_cpu_us_per_msg", "CPU per message appended, µs"),
        ("rss_mib", "RSS after the appends, MiB"),
        ("open_fds", "open descriptors"),
        ("mapped_store_files", "mapped store files"),
        ("start_cpu_s", "clean start-up, CPU s"),
        ("recovery_s", "recovery after kill -9, s"),
        ("disk_per_queue_kib", "disk per queue, KiB"),
    )
    figure, axes = plt.subplots(2, 4, figsize=(17, 7))
    for ax, (key, title) in zip(axes.flat, panels, strict=True):
        for series, label, style in ((before, "before", "o--"), (rows, "after", "o-")):
            points = [(r["queues"], r[key]) for r in series if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points, strict=True), style, label=label)
        ax.set_xscale("log")
        ax.set_title(title)
        ax.set_xlabel("queues")
        ax.grid(True, alpha=0.3)
        ax.legend()
    figure.suptitle("One broker's store by queue count (topics of 8-16 queues, 2 cores)")
    figure.tight_layout()
    figure.savefig(path, dpi=90)


DIMENSIONS: Final = ("queues", "nameserver", "groups", "assignment", "topics")


def _chart_path(args: argparse.Namespace, dimension: str) -> Path | None:
    chart: Path | None = args.chart
    return None if chart is None else chart.with_name(f"bench-scale-{dimension}.png")


def run_groups(args: argparse.Namespace, before: dict[str, Any]) -> dict[str, Any]:
    import scale_groups

    rows = []
    points: tuple[int, ...] = scale_groups.QUICK_POINTS if args.quick else scale_groups.POINTS
    if args.group_points:
        points = tuple(int(point) for point in args.group_points.split(","))
    for groups in points:
        print(f"{groups:,} consumer groups: measuring", file=sys.stderr, flush=True)
        row = scale_groups.measure(groups, args.group_seconds, args.step_timeout_s, args.quick)
        rows.append(row)
        print(f"  {row}", file=sys.stderr, flush=True)
        if "failed" in row:
            break
    scale_groups.print_table(rows)
    path = _chart_path(args, "groups")
    if path is not None:
        scale_groups.chart(rows, before.get("groups_rows", []), path)
    return scale_groups.figures(rows)


def run_assignment(args: argparse.Namespace, before: dict[str, Any]) -> dict[str, Any]:
    import scale_assignment

    rows = []
    for members, queues in scale_assignment.QUICK_POINTS if args.quick else scale_assignment.POINTS:
        print(f"{members:,} members over {queues:,} queues", file=sys.stderr, flush=True)
        rows.append(scale_assignment.measure(members, queues))
    scale_assignment.print_table(rows)
    path = _chart_path(args, "assignment")
    if path is not None:
        scale_assignment.chart(rows, path)
    return scale_assignment.figures(rows)


def run_topics(args: argparse.Namespace, before: dict[str, Any]) -> dict[str, Any]:
    import scale_topics

    total = scale_topics.QUICK_TOPICS if args.quick else scale_topics.TOPICS
    print(f"creating {total:,} topics", file=sys.stderr, flush=True)
    result = scale_topics.figures(scale_topics.measure(total, args.topics_budget_s))
    scale_topics.print_table(result)
    path = _chart_path(args, "topics")
    if path is not None:
        scale_topics.chart(result, before, path)
    return result


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run over small counts")
    parser.add_argument("--points", help="queue counts, comma-separated")
    parser.add_argument("--seconds", type=float, help="seconds of appends per count")
    parser.add_argument("--batch", type=int, default=8, help="messages per append call")
    parser.add_argument("--step-timeout-s", type=float, default=300.0)
    parser.add_argument("--chart", type=Path, help="draw the curves into this PNG")
    parser.add_argument(
        "--before", type=Path, help="an earlier run's output, drawn as 'before' on the chart"
    )
    parser.add_argument(
        "--mapped-queue-files", type=int, help="store.mapped_queue_files (default: the store's)"
    )
    parser.add_argument(
        "--dimension", action="append", choices=DIMENSIONS,
        help="measure only this dimension (repeatable; default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--group-seconds", type=float, help="seconds of commits per group count (at most 120)"
    )
    parser.add_argument(
        "--group-points", help="consumer-group counts, comma-separated (default: 1 to 100,000)"
    )
    parser.add_argument(
        "--topics-budget-s", type=float, help="stop creating topics after this long"
    )
    bench_scale_nameserver.add_arguments(parser)
    parser.add_argument("--child", choices=("fill", "start", "crash", "recover"),
                        help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--queues", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--segment-bytes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.step = args.child
        child(args)
        return
    if args.points:
        try:
            args.points = tuple(int(p) for p in args.points.split(","))
        except ValueError:
            parser.error(f"--points takes queue counts like 16,1000: not {args.points!r}")
    else:
        args.points = QUICK_POINTS if args.quick else POINTS
    if args.seconds is None:
        args.seconds = 0.5 if args.quick else 5.0
    args.segment_bytes = QUICK_SEGMENT_BYTES if args.quick else SEGMENT_BYTES
    bench_scale_nameserver.configure(args, parser)
    if args.group_seconds is None:
        args.group_seconds = 1.0 if args.quick else 5.0
    if not 0 < args.group_seconds <= 120:
        parser.error(f"--group-seconds must be above 0 and at most 120: not {args.group_seconds}")
    if args.topics_budget_s is None:
        args.topics_budget_s = 60.0 if args.quick else 420.0
    dimensions = set(args.dimension or DIMENSIONS)
    if "queues" not in dimensions:
        args.points = ()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    work = Path(tempfile.mkdtemp(prefix="metaq-bench-scale-"))
    rows: list[dict[str, Any]] = []
    try:
        for queues in args.points:
            print(f"{queues:,} queues: measuring", file=sys.stderr, flush=True)
            row = measure(args, work, queues)
            rows.append(row)
            print(f"  {row}", file=sys.stderr, flush=True)
            if "failed" in row:
                print("  larger counts skipped", file=sys.stderr, flush=True)
                break
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if rows:
        print_table(rows)
    if args.chart is not None and rows:
        before = []
        if args.before is not None:
            before = json.loads(args.before.read_text().strip().splitlines()[-1])["rows"]
        chart(rows, before, args.chart)
        print(f"chart: {args.chart}", file=sys.stderr)
    out = figures(rows, args)
    if "nameserver" in dimensions:
        nameserver = bench_scale_nameserver.run(args)
        chart_path = args.chart and args.chart.with_name("bench-scale-nameserver.png")
        bench_scale_nameserver.finish(nameserver, chart_path, args.ns_before)
        out.update(nameserver)
    earlier: dict[str, Any] = {}
    if args.before is not None:
        earlier = json.loads(args.before.read_text().strip().splitlines()[-1])
    for dimension, run in (("groups", run_groups), ("assignment", run_assignment),
                           ("topics", run_topics)):  # fmt: skip
        if dimension in dimensions:
            out.update(run(args, earlier))
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
