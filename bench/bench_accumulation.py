"""Accumulation: consumers catching up on a backlog, warm and from disk, on this machine.

**Warm catch-up.** ``--warm-messages`` (2,000,000) of 1 KiB in 8 queues are stored
first, then one consumer process drains them: metaq's push consumer with the settings a
user gets by default (committing offsets), then RabbitMQ's stream (rstream from the
first offset), NATS JetStream (a durable pull consumer, file storage, acknowledging each
fetched batch) and Redis streams (XRANGE in batches), each with the same backlog,
each server started and stopped here (``peer_servers.py``). Then two metaq consumer
processes of one group. A drain is timed from the ``go`` its processes are given to
the last message's arrival; each process reports what it received (``accumulation_roles.py``).

**Cold catch-up.** A backlog of 4 KiB messages of 1.5x the machine's memory
(``--cold-gib`` to shrink it) is written to one metaq broker, the disk's sequential
read rate measured on its segment files (``dd iflag=direct``) and the page cache
dropped. A producer process sends 1 KiB messages at ``--cold-rate`` (20,000) msgs/s open
loop and a real-time group (its own process, from the topic's end) consumes them; after
a baseline phase with nothing else running, one group starts draining the backlog from
its first message and the same figures are taken again: the drain's msgs/s and MB/s
(and the broker's disk reads), the producer's send p50/p99 and whether it held its
rate, the real-time group's end-to-end p50/p99. The backlog is deleted after, whatever
happens. ``--profile DIR`` records py-spy flame graphs of the broker and the draining
consumer during the cold window. ``--cold-drain-rate N`` holds the draining group's
handler to N msgs/s, to show what a drain of that size does to the others;
``--cold-read-mb-s`` gives the broker a budget for cold pulls (``cold_read_bytes_per_s``).

The last line printed is one JSON object (``drain_warm_msgs_s``,
``drain_warm_vs_rabbitmq_stream_ratio``, ``drain_warm_vs_nats_ratio``,
``drain_two_vs_one_ratio``, ``drain_cold_vs_disk_ratio``,
``cold_producer_p99_vs_baseline_ratio``, ``cold_realtime_p99_vs_baseline_ratio``, the
targets met and every raw figure).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final

import accumulation_backlog
import uvloop
from accumulation_fill import (
    WARM_STORE,
    Role,
    claim_backlog,
    cpu_seconds,
    disk_read_mb_s,
    drop_page_cache,
    fill_metaq,
    fill_nats,
    fill_rabbitmq_stream,
    fill_redis,
    mem_total_bytes,
    metaq_stored,
    read_bytes,
    roles,
    timed_drain,
)
from accumulation_roles import ANSWER_WAIT_S
from compare_report import strict_json
from machine_stalls import StallWatch
from metaq_load import wait_routed
from metaq_system import QUEUES, STORE, single_broker
from peer_servers import ServerProcess, running, start_nats, start_rabbitmq, start_redis

from metaq.client.admin import Admin, TopicSettings

# The cold phase keeps bench-compare's 256 MiB window (STORE), so the broker hands the
# backlog's pages back as it writes them; the warm one has WARM_STORE.
WARM_SIZE: Final = 1024
COLD_SIZE: Final = 4096
LIVE_SIZE: Final = 1024
TOPIC: Final = "Accumulation"
COLD_TOPIC: Final = "ColdBacklog"
GROUP: Final = "drain"
COLD_GROUP: Final = "cold-drain"
COLD_HEADROOM_BYTES: Final = 4 << 30
"""Beyond the backlog: the producer's own messages, indexes, the peers' logs."""
COLD_FACTOR: Final = 1.5
RAMP_S: Final = 3.0
"""After the drain starts, before its window: the consumer joins and fills its pipeline."""
WARM_SYSTEMS: Final = ("metaq", "rabbitmq_stream", "nats", "redis", "metaq_two")
PHASES: Final = (*WARM_SYSTEMS, "cold", "backlog")
TARGETS: Final = {
    "drain_warm_vs_rabbitmq_stream_ratio": (">=", 1.0),
    "drain_warm_vs_nats_ratio": (">=", 3.0),
    "drain_two_vs_one_ratio": (">=", 1.6),
    "drain_cold_vs_disk_ratio": (">=", 0.7),
    "cold_producer_p99_vs_baseline_ratio": ("<=", 3.0),
    "cold_realtime_p99_vs_baseline_ratio": ("<=", 2.0),
}


def log(*words: object) -> None:
    print(*words, file=sys.stderr, flush=True)


def run(coro: Any) -> Any:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def warm_metaq(work: Path, messages: int, processes: int) -> dict[str, Any]:
    with single_broker(work, WARM_STORE) as metaq, roles() as started:
        run(
            Admin().put_topic(
                metaq.http_url, TOPIC, TopicSettings(read_queues=QUEUES, write_queues=QUEUES)
            )
        )
        run(wait_routed(metaq.nameserver, TOPIC, QUEUES))
        sent = run(fill_metaq(metaq.nameserver, TOPIC, os.urandom(WARM_SIZE), messages))
        stored, _ = run(metaq_stored(metaq.nameserver, TOPIC, GROUP, at_least=sent))
        log(f"  metaq: {stored:,} stored; draining with {processes} consumer process(es)")
        for _ in range(processes):
            started.append(Role.start("metaq", nameserver=metaq.nameserver, topic=TOPIC,
                                      group=GROUP))  # fmt: skip
        assert metaq.broker_pid is not None
        figures = timed_drain(started, stored, [metaq.broker_pid])
        _, committed = run(metaq_stored(metaq.nameserver, TOPIC, GROUP))
        figures["committed"] = committed
        return figures


def warm_rabbitmq(work: Path, messages: int) -> dict[str, Any]:
    servers: list[ServerProcess] = []
    with running(servers), roles() as started:
        servers.extend(start_rabbitmq(work))
        port = servers[-1].ports["stream"]
        stored = run(fill_rabbitmq_stream(port, "backlog", os.urandom(WARM_SIZE), messages))
        started.append(Role.start("rabbitmq_stream", port=port, stream="backlog"))
        return timed_drain(started, stored)


def warm_nats(work: Path, messages: int) -> dict[str, Any]:
    servers: list[ServerProcess] = []
    with running(servers), roles() as started:
        servers.append(start_nats(work))
        port = servers[0].ports["client"]
        run(fill_nats(port, "BACKLOG", "backlog", os.urandom(WARM_SIZE), messages))
        started.append(Role.start("nats", port=port, stream="BACKLOG", subject="backlog",
                                  batch=1000))  # fmt: skip
        return timed_drain(started, messages)


def warm_redis(work: Path, messages: int) -> dict[str, Any]:
    servers: list[ServerProcess] = []
    with running(servers), roles() as started:
        servers.append(start_redis(work))
        port = servers[0].ports["client"]
        stored = run(fill_redis(port, "backlog", os.urandom(WARM_SIZE), messages))
        started.append(Role.start("redis", port=port, stream="backlog", batch=1000))
        return timed_drain(started, stored)


WARM: Final[dict[str, Callable[[Path, int], dict[str, Any]]]] = {
    "metaq": lambda work, n: warm_metaq(work, n, 1),
    "rabbitmq_stream": warm_rabbitmq,
    "nats": warm_nats,
    "redis": warm_redis,
    "metaq_two": lambda work, n: warm_metaq(work, n, 2),
}


def check_cold_space(work: Path, backlog_bytes: int) -> None:
    need = backlog_bytes + COLD_HEADROOM_BYTES
    free = shutil.disk_usage(work).free
    if free < need:
        raise SystemExit(
            f"the cold phase needs {need / 2**30:.1f} GiB free under {work} (a backlog of "
            f"{backlog_bytes / 2**30:.1f} GiB, {COLD_FACTOR}x this machine's memory, plus "
            f"{COLD_HEADROOM_BYTES >> 30} GiB); {free / 2**30:.1f} GiB are free. Free some "
            f"space, point TMPDIR at a larger disk, or pass --cold-gib (smaller than memory "
            f"it measures the page cache, not the disk) or --skip-cold."
        )


def _segments(broker_dir: Path) -> list[Path]:
    commitlog = next(p for p in broker_dir.rglob("commitlog") if p.is_dir())
    return sorted(p for p in commitlog.iterdir() if p.is_file())


@contextmanager
def profiling(out: Path | None, pids: dict[str, int], seconds: float) -> Iterator[list[str]]:
    """py-spy flame graphs of ``pids`` for ``seconds``, when asked and py-spy is there."""
    notes: list[str] = []
    spy = shutil.which("py-spy") or os.environ.get("PY_SPY")
    if out is None or spy is None:
        if out is not None:
            notes.append("py-spy not found (PATH or $PY_SPY): no profile")
        yield notes
        return
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for name, pid in pids.items():
        argv = [spy, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "200",
                "-o", str(out / f"{name}.svg"), "--nonblocking"]  # fmt: skip
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        yield notes
    finally:
        for proc in procs:
            try:
                proc.wait(seconds + 30)
            except subprocess.TimeoutExpired:
                proc.kill()
        notes.extend(str(out / f"{name}.svg") for name in pids)


def cold_backlog_bytes(args: argparse.Namespace) -> int:
    return int(args.cold_gib * 2**30) if args.cold_gib else int(mem_total_bytes() * COLD_FACTOR)


def cold(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    memory = mem_total_bytes()
    backlog_bytes = cold_backlog_bytes(args)
    check_cold_space(work.parent, backlog_bytes)  # again: the warm phase used some
    messages = backlog_bytes // COLD_SIZE
    figures: dict[str, Any] = {
        "mem_total_gib": round(memory / 2**30, 1),
        "backlog_gib": round(backlog_bytes / 2**30, 1),
        "backlog_messages": messages,
        "rate_offered_msgs_s": args.cold_rate,
        "drain_paced_msgs_s": args.cold_drain_rate or None,
        "broker_cold_read_mb_s": args.cold_read_mb_s or None,
        "notes": [],
    }
    budget = int(args.cold_read_mb_s * 1e6)
    store = (*STORE, "--set", f"cold_read_bytes_per_s={budget}") if budget else STORE
    with single_broker(work, store) as metaq, roles() as started, StallWatch() as stalls:
        run(
            Admin().put_topic(
                metaq.http_url, COLD_TOPIC, TopicSettings(read_queues=QUEUES, write_queues=QUEUES)
            )
        )
        run(wait_routed(metaq.nameserver, COLD_TOPIC, QUEUES))
        log(f"  cold: writing {messages:,} x {COLD_SIZE} B ({backlog_bytes / 2**30:.1f} GiB)")
        began = time.monotonic()
        run(fill_metaq(metaq.nameserver, COLD_TOPIC, os.urandom(COLD_SIZE), messages))
        figures["fill_s"] = round(time.monotonic() - began, 1)
        run(claim_backlog(metaq.nameserver, COLD_TOPIC, COLD_GROUP))
        assert metaq.data_dir is not None
        segments = _segments(metaq.data_dir)
        os.sync()
        rate, how = disk_read_mb_s(segments, 4 << 30)
        figures["disk_read_mb_s"] = round(rate, 1)
        figures["disk_read_how"] = how
        if (why := drop_page_cache()) is not None:
            figures["notes"].append(why)
            log(f"  cold: {why}")
        common = {"nameserver": metaq.nameserver, "topic": COLD_TOPIC}
        producer = Role.start("cold_producer", rate=args.cold_rate, size=LIVE_SIZE, **common)
        realtime = Role.start("cold_realtime", group="realtime", queues=QUEUES, **common)
        drain = Role.start("metaq", group=COLD_GROUP, rate=args.cold_drain_rate, **common)
        started += [producer, realtime, drain]
        for role in started:
            role.wait_ready(60)
        start = time.monotonic() + 1.0
        baseline = [start + args.cold_warmup_s, start + args.cold_warmup_s + args.baseline_s]
        drain_at = baseline[1]
        window = [drain_at + RAMP_S, drain_at + RAMP_S + args.cold_seconds]
        schedule = {"start": start, "end": window[1], "baseline": baseline, "cold": window}
        producer.go(**schedule)
        realtime.go(**schedule)
        log(f"  cold: baseline {args.baseline_s:.0f} s, then the drain for "
            f"{RAMP_S + args.cold_seconds:.0f} s")  # fmt: skip
        broker_pid = metaq.broker_pid
        assert broker_pid is not None
        pids = {"broker": broker_pid, "producer": producer.proc.pid,
                "realtime": realtime.proc.pid, "drain": drain.proc.pid}  # fmt: skip
        # The benchmark's own schedule:
        time.sleep(max(0.0, baseline[0] - time.monotonic()))
        cpu0 = _cpu(pids)
        time.sleep(max(0.0, drain_at - time.monotonic()))
        cpu_baseline = _cores(cpu0, _cpu(pids))
        drain.go()
        time.sleep(max(0.0, window[0] - time.monotonic()))
        count0, bytes0 = drain.count, drain.bytes
        read0, cpu0 = read_bytes(broker_pid), _cpu(pids)
        with profiling(args.profile, {"broker": broker_pid, "drain_consumer": drain.proc.pid},
                       min(args.cold_seconds, 30)) as profiles:  # fmt: skip
            time.sleep(max(0.0, window[1] - time.monotonic()))
            count1, bytes1 = drain.count, drain.bytes
            read1, cpu1 = read_bytes(broker_pid), _cpu(pids)
        figures["profiles"] = profiles
        # The pauses of the machine's CPUs in each phase: a stall of tens of ms lands in
        # both tails, whatever the systems do.
        figures["machine_stalls"] = {
            phase: asdict(stalls.between(*schedule[phase])) for phase in ("baseline", "cold")
        }
        samples = run(Admin().metrics(metaq.http_url))
        # Pulls the broker read in on its reader thread (behind its page-cache window).
        figures["broker_pulls_read_in"] = samples.get(("metaq_pulls_read_in_total", ()))
        figures["broker_page_cache_released_bytes"] = samples.get(
            ("metaq_commitlog_page_cache_released_bytes_total", ())
        )
        drained = drain.stop()
        try:
            producer_result = producer.wait_result(60 + ANSWER_WAIT_S)
            producer.stop()
        except RuntimeError as exc:  # the drain's figures still stand
            producer_result = {"failed": str(exc)}
        realtime_result = realtime.stop(60)
    seconds = window[1] - window[0]
    figures["drain_msgs_s"] = round((count1 - count0) / seconds, 1)
    figures["drain_mb_s"] = round((bytes1 - bytes0) / seconds / 1e6, 1)
    figures["drained_total"] = drained["count"]
    if read0 is not None and read1 is not None:
        figures["broker_disk_read_mb_s"] = round((read1 - read0) / seconds / 1e6, 1)
    # Whether the machine had CPU to spare (what bounds the drain if the disk does not),
    # and who used it: each process's cores in each phase, from /proc/PID/stat.
    figures["cpu_cores"] = {"baseline": cpu_baseline, "cold": _cores(cpu0, cpu1)}
    figures["producer"] = producer_result
    figures["realtime"] = realtime_result
    for phase in ("baseline", "cold"):
        if phase in producer_result:
            held = producer_result[phase]["acked_msgs_s"] >= 0.99 * args.cold_rate and (
                producer_result["errors"] == 0 and producer_result["unanswered"] == 0
            )
            producer_result[phase]["held_rate"] = held
    return figures


Cpu = tuple[float, dict[str, float | None]]


def _cpu(pids: dict[str, int]) -> Cpu:
    return time.monotonic(), {name: cpu_seconds(pid) for name, pid in pids.items()}


def _cores(before: Cpu, after: Cpu) -> dict[str, float | None]:
    """Cores each process used between two readings, and all of them together."""
    seconds = after[0] - before[0]
    cores: dict[str, float | None] = {}
    for name, used in after[1].items():
        start = before[1][name]
        cores[name] = None if used is None or start is None else round((used - start) / seconds, 2)
    cores["all"] = round(sum(c for c in cores.values() if c is not None), 2)
    cores["machine_cpus"] = float(os.cpu_count() or 0)
    return cores


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return round(a / b, 3)


def headline(warm: dict[str, Any], cold_figures: dict[str, Any] | None) -> dict[str, Any]:
    def rate(key: str) -> float | None:
        cell = warm.get(key)
        return cell["msgs_s"] if isinstance(cell, dict) and "msgs_s" in cell else None

    figures: dict[str, Any] = {
        "drain_warm_msgs_s": rate("metaq"),
        "drain_warm_vs_rabbitmq_stream_ratio": _ratio(rate("metaq"), rate("rabbitmq_stream")),
        "drain_warm_vs_nats_ratio": _ratio(rate("metaq"), rate("nats")),
        "drain_warm_vs_redis_ratio": _ratio(rate("metaq"), rate("redis")),
        "drain_two_vs_one_ratio": _ratio(rate("metaq_two"), rate("metaq")),
        "drain_cold_vs_disk_ratio": None,
        "cold_producer_p99_vs_baseline_ratio": None,
        "cold_realtime_p99_vs_baseline_ratio": None,
    }
    if cold_figures is not None:
        producer, realtime = cold_figures["producer"], cold_figures["realtime"]
        figures["drain_cold_vs_disk_ratio"] = _ratio(
            cold_figures["drain_mb_s"], cold_figures["disk_read_mb_s"]
        )
        if "cold" in producer:
            figures["cold_producer_p99_vs_baseline_ratio"] = _ratio(
                producer["cold"]["p99_ms"], producer["baseline"]["p99_ms"]
            )
            figures["cold_producer_held_rate"] = producer["cold"]["held_rate"]
        figures["cold_realtime_p99_vs_baseline_ratio"] = _ratio(
            realtime["cold"]["p99_ms"], realtime["baseline"]["p99_ms"]
        )
    met: dict[str, bool | None] = {}
    for key, (sense, target) in TARGETS.items():
        value = figures.get(key)
        if value is not None:
            met[key] = value >= target if sense == ">=" else value <= target
        else:
            met[key] = None
    figures["targets_met"] = met
    return figures


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--warm-messages", type=int, default=2_000_000)
    parser.add_argument("--cold-gib", type=float, default=0.0,
                        help=f"cold backlog size (default {COLD_FACTOR}x MemTotal)")  # fmt: skip
    parser.add_argument("--cold-rate", type=float, default=20_000.0, help="producer msgs/s")
    parser.add_argument("--cold-drain-rate", type=float, default=0.0,
                        help="hold the draining group's handler to this many msgs/s "
                        "(default 0: as fast as it drains)")  # fmt: skip
    parser.add_argument("--cold-read-mb-s", type=float, default=0.0,
                        help="the broker's cold_read_bytes_per_s, in MB/s "
                        "(default 0: no budget)")  # fmt: skip
    parser.add_argument("--cold-warmup-s", type=float, default=3.0)
    parser.add_argument("--baseline-s", type=float, default=20.0)
    parser.add_argument("--cold-seconds", type=float, default=60.0, help="measured drain window")
    parser.add_argument("--skip-cold", action="store_true")
    parser.add_argument("--backlog-gb", type=float, default=10.0,
                        help="the backlog phase's backlog, in GB of 1 KiB messages")  # fmt: skip
    backlog_systems = accumulation_backlog.SYSTEMS
    parser.add_argument("--backlog-systems", default=",".join(backlog_systems),
                        help="comma-separated, of: " + ", ".join(backlog_systems))  # fmt: skip
    parser.add_argument("--only", default=",".join(PHASES),
                        help="comma-separated: " + ", ".join(PHASES))  # fmt: skip
    parser.add_argument("--profile", type=Path, default=None,
                        help="write py-spy flame graphs of the cold window here")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    only = args.only.split(",")
    unknown = set(only) - set(PHASES)
    if unknown:
        parser.error(f"--only: unknown {', '.join(sorted(unknown))}")
    backlog_systems = args.backlog_systems.split(",")
    unknown = set(backlog_systems) - set(accumulation_backlog.SYSTEMS)
    if unknown:
        parser.error(f"--backlog-systems: unknown {', '.join(sorted(unknown))}")
    if args.backlog_gb <= 0:
        parser.error("--backlog-gb must be positive")
    if args.warm_messages <= 0 or args.cold_rate <= 0 or args.cold_seconds <= 0:
        parser.error("--warm-messages, --cold-rate and --cold-seconds must be positive")
    if args.cold_drain_rate < 0 or args.cold_read_mb_s < 0:
        parser.error("--cold-drain-rate and --cold-read-mb-s must be 0 (off) or positive")

    # A SIGTERM (a timeout, a CI cancel) unwinds like Ctrl-C: servers stopped, data deleted.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    run_cold = "cold" in only and not args.skip_cold
    # Before anything else runs: a full run should not find out after ten minutes.
    if run_cold:
        check_cold_space(Path(tempfile.gettempdir()), cold_backlog_bytes(args))
    if "backlog" in only:
        accumulation_backlog.check_space(Path(tempfile.gettempdir()), args.backlog_gb)
    work = Path(tempfile.mkdtemp(prefix="metaq-bench-accumulation-"))
    warm: dict[str, Any] = {}
    cold_figures: dict[str, Any] | None = None
    backlog: dict[str, Any] | None = None
    try:
        for name in WARM_SYSTEMS:
            if name not in only:
                continue
            log(f"warm: {name}")
            try:
                warm[name] = WARM[name](work / name, args.warm_messages)
            except Exception as exc:  # one system failing leaves the others' figures
                traceback.print_exc()
                warm[name] = {"failed": f"{type(exc).__name__}: {exc}"}
            finally:
                shutil.rmtree(work / name, ignore_errors=True)
            log(f"  {name}: {warm[name]}")
        if run_cold:
            log("cold")
            cold_figures = cold(work / "cold", args)
        if "backlog" in only:
            log("backlog")
            backlog = accumulation_backlog.backlog(
                work / "backlog", args.backlog_gb, backlog_systems
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)  # tens of gigabytes in the cold phase

    figures = strict_json(
        {
            **headline(warm, cold_figures),
            **(accumulation_backlog.headline(backlog) if backlog is not None else {}),
            "measured_at": when,
            "command": " ".join(["bench_accumulation.py", *argv]),
            "warm_message_bytes": WARM_SIZE,
            "warm": warm,
            "cold": cold_figures,
            "backlog": backlog,
        }
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "accumulation.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
