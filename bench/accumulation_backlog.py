"""The backlog section of ``bench_accumulation.py``: one consumer draining the same backlog
from metaq, Apache Kafka 4 and Apache RocketMQ 5, warm and cold, in one run.

Each system in turn, one broker each (metaq ASYNC flush, Kafka acks=1, RocketMQ
ASYNC_MASTER/ASYNC_FLUSH: the one-copy setups of ``make bench-compare``), its data deleted
before the next one starts, so that one backlog's worth of disk suffices:

1. ``--backlog-gb`` of 1 KiB messages in 8 queues/partitions, written by the system's
   fastest producer (metaq's Python producer, Kafka's ``ProducerPerformance``,
   RocketMQ's Java client with asynchronous sends), then ``sync``;
2. **warm**: what the page cache holds of the system's log is read (``fincore``), then
   each of its consumers drains the whole backlog from its first message, a new group
   each;
3. **cold**: before each consumer the system's servers are stopped (SIGTERM: a clean
   shutdown), the page cache dropped (``echo 3 > /proc/sys/vm/drop_caches``, root), the
   servers started again on their data, and what the cache holds of the log checked
   (``fincore``; ``Cached`` of ``/proc/meminfo``); then it drains the backlog from the
   start. The restart is what makes it cold: the kernel drops no page a process has
   mapped, and RocketMQ and metaq map their store files, so a drop under a running
   broker leaves much of its log cached. A backlog larger than this machine's page cache
   is not what makes it cold: the disk has no room for one.

The consumers: metaq's push consumer (Python, its defaults), Kafka's confluent-kafka
consumer (Python) and Kafka's ``ConsumerPerformance`` (the Java consumer, its fastest),
RocketMQ's Java lite pull consumer (``bench/peers/rocketmq``). A drain's figures: msgs/s
and MB/s of bodies, the consumer's CPU and the servers' CPU per message.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import shutil
import subprocess
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

import uvloop
from accumulation_fill import (
    WARM_STORE,
    Role,
    claim_backlog,
    drop_page_cache,
    fill_metaq,
    metaq_stored,
    roles,
    servers_cpu_seconds,
    timed_drain,
)
from metaq_load import wait_routed
from metaq_system import QUEUES, system

from metaq.client.admin import Admin, TopicSettings

BODY_BYTES: Final = 1024
TOPIC: Final = "Backlog"
SYSTEMS: Final = ("metaq", "kafka", "rocketmq")
DRAIN_TIMEOUT_S: Final = 3600.0
"""A 10 GB drain from a cold disk on a loaded machine: minutes, not an hour."""
HEADROOM_BYTES: Final = 2 << 30
"""Beyond the backlog: indexes, the servers' logs, what else the disk takes meanwhile."""
COLD_CACHED_MAX: Final = 0.05
"""A cold drain whose files are more cached than this after the drop is marked not cold."""
FILL_CHUNK: Final = 5_000_000
"""Messages a RocketMQ client call sends (it keeps each one's latency in memory)."""
FINCORE_BATCH: Final = 256
METAQ_DISK_FULL_RATIO: Final = 0.98
"""metaq's ``store.disk_full_ratio`` here (default 0.90): the ratio is of a disk other
tenants fill, and ``check_space`` has made sure the backlog and its headroom fit."""
ROCKETMQ_DISK: Final = {
    "diskMaxUsedSpaceRatio": 95,
    "diskSpaceCleanForciblyRatio": 95,
    "diskSpaceWarningLevelRatio": 95,
}
"""RocketMQ's disk thresholds here, in % of the disk (defaults 75, 85, 90; 95 is the most
the first takes): past 75 % its broker deletes its oldest commitlog files, unconsumed
or not, and a 10 GB backlog takes a disk three quarters full past that."""


def backlog_messages(gigabytes: float) -> int:
    return int(gigabytes * 1e9) // BODY_BYTES


def check_space(where: Path, gigabytes: float) -> None:
    need = int(gigabytes * 1e9) + HEADROOM_BYTES
    free = shutil.disk_usage(where).free
    if free < need:
        raise SystemExit(
            f"the backlog phase needs {need / 1e9:.1f} GB free under {where} (a backlog of "
            f"{gigabytes:g} GB, one system's at a time, plus {HEADROOM_BYTES >> 30} GiB); "
            f"{free / 1e9:.1f} GB are free. Pass a smaller --backlog-gb, point TMPDIR at a "
            f"larger disk, or leave backlog out of --only."
        )


def meminfo_cached_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Cached:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no Cached in /proc/meminfo")


def page_cache(log_files: list[Path], backlog_bytes: int) -> dict[str, Any]:
    """How much of the system's log (``log_files``, the files that hold the messages) the
    page cache holds (``fincore``), of the backlog's bytes; and the machine's ``Cached``
    (every file of every process: the other engineers' too)."""
    files = [str(p) for p in log_files if p.stat().st_size > 0]
    cached = 0
    fincore = shutil.which("fincore")
    for i in range(0, len(files), FINCORE_BATCH) if fincore else ():
        done = subprocess.run(
            [fincore or "fincore", "--bytes", "--raw", "--noheadings", "-o", "RES",
             *files[i : i + FINCORE_BATCH]],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        cached += sum(int(line) for line in done.stdout.split())
    figures: dict[str, Any] = {
        "log_cached_gb": round(cached / 1e9, 2),
        "log_cached_fraction": round(min(1.0, cached / backlog_bytes), 3),
        "meminfo_cached_gib": round(meminfo_cached_bytes() / 2**30, 1),
    }
    if fincore is None:
        figures["note"] = "fincore (util-linux) not found: the log's residency unknown"
    return figures


@dataclass
class System:
    """A running system as the drains see it: its log files, its servers' pids (new ones
    after a restart), and how to stop and start its servers on their data."""

    log_files: Callable[[], list[Path]]
    pids: Callable[[], list[int]]
    stop: Callable[[], None]
    start: Callable[[], None]
    backlog_bytes: int

    def cache(self) -> dict[str, Any]:
        return page_cache(self.log_files(), self.backlog_bytes)

    def go_cold(self) -> dict[str, Any]:
        """Servers stopped, page cache dropped, servers started: what it holds then."""
        self.stop()
        why = drop_page_cache()
        self.start()
        figures = self.cache()
        if why is not None:
            figures["note"] = why
        figures["cold"] = why is None and figures["log_cached_fraction"] <= COLD_CACHED_MAX
        return figures


Drain = Callable[[str], dict[str, Any]]
"""One consumer draining the whole backlog with a new group of the given name."""


DRAIN_PHASES: Final = ("warm", "cold")


def group_name(client: str, phase: str) -> str:
    """The group of ``client``'s drain in ``phase``: new for every drain."""
    return f"{client}-{phase}"


def drain_both(system: System, drains: dict[str, Drain]) -> dict[str, Any]:
    """Each consumer warm, then each cold (restarted, the page cache dropped, before each)."""
    rows: dict[str, Any] = {}
    for phase in DRAIN_PHASES:
        for client, drain in drains.items():
            cache = system.cache() if phase == "warm" else system.go_cold()
            row = _attempt(partial(drain, group_name(client, phase))) | {"page_cache": cache}
            rows[f"{client}_{phase}"] = row
            print(f"    {client} {phase}: {rows[f'{client}_{phase}']}", flush=True)
    return rows


def _attempt(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """What ``run()`` measured, or why it failed (the others' figures still stand)."""
    try:
        return run()
    except Exception as exc:
        traceback.print_exc()
        return {"failed": f"{type(exc).__name__}: {exc}"}


def _run(coro: Any) -> Any:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def _fill_figures(messages: int, seconds: float) -> dict[str, Any]:
    return {
        "messages": messages,
        "gb": round(messages * BODY_BYTES / 1e9, 2),
        "seconds": round(seconds, 1),
        "msgs_s": round(messages / seconds, 1),
    }


def backlog_metaq(work: Path, messages: int) -> dict[str, Any]:
    """metaq's defaults for its page cache (256 MiB segments, the window at 40 % of
    memory: ``WARM_STORE``), one nameserver and one broker."""
    store = (*WARM_STORE, "--set", f"store.disk_full_ratio={METAQ_DISK_FULL_RATIO}")
    with system(store=store).start(work) as cluster, roles() as started:
        nameserver = cluster.nameserver_addresses[0]
        group = "broker-a"

        def pids() -> list[int]:
            return [*(n.process.pid for n in cluster.nameservers),
                    *(b.proc.pid for b in cluster.brokers.values())]  # fmt: skip

        def stop() -> None:
            cluster.broker(group).terminate()

        def start() -> None:
            cluster.start_broker(group)
            _run(wait_routed(nameserver, TOPIC, QUEUES))

        commitlog = cluster.data_dir(group) / "commitlog"
        running = System(
            log_files=lambda: sorted(p for p in commitlog.rglob("*") if p.is_file()),
            pids=pids,
            stop=stop,
            start=start,
            backlog_bytes=messages * BODY_BYTES,
        )
        settings = TopicSettings(read_queues=QUEUES, write_queues=QUEUES)
        _run(Admin().put_topic(cluster.master(group).http_url, TOPIC, settings))
        _run(wait_routed(nameserver, TOPIC, QUEUES))
        began = time.monotonic()
        sent = _run(fill_metaq(nameserver, TOPIC, os.urandom(BODY_BYTES), messages))
        stored, _ = _run(metaq_stored(nameserver, TOPIC, "count", at_least=sent))
        fill = _fill_figures(stored, time.monotonic() - began)
        # Every drain's group claims the backlog now, not as its drain begins: once the
        # warm drain has committed past it, a broker whose disk is past
        # store.disk_force_clean_ratio (a 10 GB backlog on a shared disk) deletes the
        # segments no known group still needs, before the cold drain has claimed them.
        for phase in DRAIN_PHASES:
            _run(claim_backlog(nameserver, TOPIC, group_name("python", phase)))
        os.sync()
        print(f"    fill: {fill}", flush=True)

        def push(group: str) -> dict[str, Any]:
            role = Role.start("metaq", nameserver=nameserver, topic=TOPIC, group=group)
            started.append(role)
            return timed_drain([role], stored, pids(), DRAIN_TIMEOUT_S)

        return {"fill": fill, **drain_both(running, {"python": push})}


_SENT: Final = re.compile(r"^(\d+) records sent, ([\d.]+) records/sec")


def _kafka_stored(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition
    from peer_kafka import PARTITIONS

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "count"})
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(PARTITIONS)
        )
    finally:
        consumer.close()


def _java_run(argv: list[str], log_path: Path, timeout_s: float) -> tuple[str, float]:
    """The tool's output and the CPU seconds its JVM used in all (``wait4``'s rusage)."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"{argv[3]} still running after {timeout_s:.0f} s")
        time.sleep(0.2)  # poll interval of a deadline-bound wait
    said = log_path.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[3]} exited {proc.returncode}:\n{said[-3000:]}")
    return said, usage.ru_utime + usage.ru_stime


def backlog_kafka(work: Path, messages: int) -> dict[str, Any]:
    from peer_kafka import TOOL_HEAP, TOPIC, java_argv, kafka_running, restart_node, wait_topic

    with kafka_running(work) as cluster, roles() as started:

        def start() -> None:
            restart_node(cluster, 1)
            wait_topic(cluster)

        running = System(
            log_files=lambda: sorted(work.glob(f"kafka-1/data/{TOPIC}-*/*.log")),
            pids=lambda: cluster.pids,
            stop=cluster.servers[0].stop,
            start=start,
            backlog_bytes=messages * BODY_BYTES,
        )
        argv = java_argv(
            *TOOL_HEAP, "org.apache.kafka.tools.ProducerPerformance",
            "--bootstrap-server", cluster.bootstrap, "--topic", TOPIC,
            "--num-records", str(messages), "--record-size", str(BODY_BYTES),
            "--throughput", "-1", "--command-property", "acks=1",
        )  # fmt: skip
        began = time.monotonic()
        said, _ = _java_run(argv, work / "producer-perf.log", DRAIN_TIMEOUT_S)
        if not any(_SENT.match(line) for line in said.splitlines()):
            raise RuntimeError(f"ProducerPerformance reported no total:\n{said[-3000:]}")
        stored = _kafka_stored(cluster.bootstrap, TOPIC)
        fill = _fill_figures(stored, time.monotonic() - began)
        os.sync()
        print(f"    fill: {fill}", flush=True)

        def python(group: str) -> dict[str, Any]:
            role = Role.start("kafka", bootstrap=cluster.bootstrap, topic=TOPIC, group=group)
            started.append(role)
            return timed_drain([role], stored, cluster.pids, DRAIN_TIMEOUT_S)

        def perf(group: str, records: int = stored) -> dict[str, Any]:
            argv = java_argv(
                *TOOL_HEAP, "org.apache.kafka.tools.ConsumerPerformance",
                "--bootstrap-server", cluster.bootstrap, "--topic", TOPIC,
                "--num-records", str(records), "--group", group, "--timeout", "60000",
            )  # fmt: skip
            server0 = servers_cpu_seconds(cluster.pids)
            said, cpu = _java_run(argv, work / f"consumer-perf-{group}.log", DRAIN_TIMEOUT_S)
            server = (servers_cpu_seconds(cluster.pids) or math.nan) - (server0 or math.nan)
            for node in cluster.servers:
                if node.proc.poll() is not None:
                    tail = node.log_path.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{node.name} exited during the drain:\n{tail}")
            return _consumer_perf(said, cpu, server, records)

        # The JVM's start, the group's join and one fetch, without a backlog to drain:
        # what the drains' CPU is taken net of.
        start_cpu = perf("start-up", 1)["consumer_cpu_s"]

        def perf_net(group: str) -> dict[str, Any]:
            figures = perf(group)
            figures["consumer_jvm_start_cpu_s"] = round(start_cpu, 2)
            net = (figures.pop("consumer_cpu_s") - start_cpu) / stored * 1e6
            figures["consumer_cpu_us_per_msg"] = round(net, 2)
            return figures

        return {"fill": fill, **drain_both(running, {"python": python, "java_perf": perf_net})}


def _consumer_perf(said: str, cpu_s: float, server_cpu_s: float, stored: int) -> dict[str, Any]:
    """ConsumerPerformance's summary line: ``start.time, end.time, data.consumed.in.MB,
    MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, fetch.time.ms, ...``.

    A run that stopped short of ``stored`` (no record for its ``--timeout``) is a failed
    drain, not a slow one: its rate would be of a part of the backlog, its wait included."""
    lines = [line for line in said.splitlines() if line.count(",") >= 9]
    if len(lines) < 2 or not lines[0].startswith("start.time"):
        raise RuntimeError(f"ConsumerPerformance printed no summary:\n{said[-3000:]}")
    cells = [cell.strip() for cell in lines[-1].split(",")]
    mb, messages, rebalance_ms, fetch_ms = (float(cells[i]) for i in (2, 4, 6, 7))
    seconds = (rebalance_ms + fetch_ms) / 1e3
    if messages < stored:
        raise RuntimeError(
            f"ConsumerPerformance stopped at {int(messages):,} of {stored:,} messages after "
            f"{seconds:.1f} s:\n{said[-3000:]}"
        )
    return {
        "messages": int(messages),
        "seconds": round(seconds, 3),
        "msgs_s": round(messages / seconds, 1),
        "mb_s": round(mb * 2**20 / seconds / 1e6, 1),
        "rebalance_s": round(rebalance_ms / 1e3, 3),
        "consumer_cpu_s": cpu_s,
        "server_cpu_us_per_msg": round(server_cpu_s / max(messages, 1) * 1e6, 2),
    }


def backlog_rocketmq(work: Path, messages: int) -> dict[str, Any]:
    """One broker, no proxy; its client is one JVM for the system's length, on one
    event loop (the client's pipes belong to it)."""
    from peer_rocketmq import QUEUES as ROCKETMQ_QUEUES
    from peer_rocketmq import RocketClient, restart_broker, single

    with (
        single(work, proxy=False, broker=ROCKETMQ_DISK) as cluster,
        asyncio.Runner(loop_factory=uvloop.new_event_loop) as loop,
    ):
        client = RocketClient(cluster)
        loop.run(client.start())
        try:
            running = System(
                log_files=lambda: sorted((cluster.work / "broker/store/commitlog").glob("*")),
                pids=cluster.pids,
                stop=cluster.brokers["broker"].stop,
                start=lambda: restart_broker(cluster, "broker"),
                backlog_bytes=messages * BODY_BYTES,
            )
            loop.run(client.call("topic", TOPIC, ROCKETMQ_QUEUES))
            began = time.monotonic()
            acked = errors = 0
            while acked < messages:
                chunk = min(FILL_CHUNK, messages - acked)
                figures = loop.run(client.call("many", TOPIC, BODY_BYTES, DRAIN_TIMEOUT_S, chunk,
                                               1000, timeout_s=DRAIN_TIMEOUT_S))  # fmt: skip
                # A send the broker turned away (busy, a timeout on this loaded machine)
                # is not stored: the next call sends as many again.
                errors += int(figures["errors"])
                acked += int(figures["acked"])
            fill = _fill_figures(acked, time.monotonic() - began) | {"send_errors": errors}
            os.sync()
            print(f"    fill: {fill}", flush=True)

            def java(group: str) -> dict[str, Any]:
                pids = cluster.pids()
                server0 = servers_cpu_seconds(pids)
                done = loop.run(client.call("drain", TOPIC, group, DRAIN_TIMEOUT_S,
                                            timeout_s=DRAIN_TIMEOUT_S + 60))  # fmt: skip
                server = (servers_cpu_seconds(pids) or math.nan) - (server0 or math.nan)
                count, seconds = int(done["count"]), float(done["seconds"])
                if done["behind"]:
                    raise RuntimeError(f"RocketMQ drain: {done['behind']:,} not reached")
                # The drain reads from each queue's first offset, which moves up when the
                # broker deletes commitlog files: the end reached is not the backlog read.
                if count < acked:
                    raise RuntimeError(
                        f"RocketMQ drain: {count:,} of the {acked:,} acknowledged messages "
                        f"from the queues' first offsets: the broker deleted commitlog "
                        f"files (its disk thresholds: ROCKETMQ_DISK)"
                    )
                return {
                    "messages": count,
                    "seconds": round(seconds, 3),
                    "msgs_s": round(count / seconds, 1),
                    "mb_s": round(done["bytes"] / seconds / 1e6, 1),
                    "consumer_cpu_us_per_msg": round(done["cpu_s"] / count * 1e6, 2),
                    "server_cpu_us_per_msg": round(server / count * 1e6, 2),
                }

            return {"fill": fill, **drain_both(running, {"java": java})}
        finally:
            loop.run(client.close())


BACKLOG: Final[dict[str, Callable[[Path, int], dict[str, Any]]]] = {
    "metaq": backlog_metaq,
    "kafka": backlog_kafka,
    "rocketmq": backlog_rocketmq,
}


@contextmanager
def _deleted(path: Path) -> Iterator[Path]:
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def backlog(work: Path, gigabytes: float, systems: list[str]) -> dict[str, Any]:
    """Every system of ``systems`` in turn, its data deleted before the next starts."""
    messages = backlog_messages(gigabytes)
    rows: dict[str, Any] = {
        "backlog_gb": gigabytes,
        "messages": messages,
        "message_bytes": BODY_BYTES,
    }
    for name in systems:
        check_space(work.parent, gigabytes)
        print(f"backlog: {name}, {messages:,} x {BODY_BYTES} B", flush=True)
        load = os.getloadavg()[0]
        with _deleted(work / name) as where:
            rows[name] = _attempt(partial(BACKLOG[name], where, messages))
        rows[name]["load_1m"] = [round(load, 1), round(os.getloadavg()[0], 1)]
        print(f"  {name}: {rows[name]}", flush=True)
    return rows


def _rate(rows: dict[str, Any], system: str, cell: str) -> float | None:
    row = rows.get(system, {}).get(cell)
    return row["msgs_s"] if isinstance(row, dict) and "msgs_s" in row else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b:
        return None
    return round(a / b, 3)


def headline(rows: dict[str, Any]) -> dict[str, Any]:
    """metaq's drain against each peer's, warm and cold."""
    figures: dict[str, Any] = {}
    for phase in DRAIN_PHASES:
        metaq = _rate(rows, "metaq", f"python_{phase}")
        figures[f"drain_{phase}_msgs_s_metaq"] = metaq
        figures[f"drain_{phase}_vs_kafka_ratio"] = _ratio(
            metaq, _rate(rows, "kafka", f"python_{phase}")
        )
        figures[f"drain_{phase}_vs_kafka_java_ratio"] = _ratio(
            metaq, _rate(rows, "kafka", f"java_perf_{phase}")
        )
        figures[f"drain_{phase}_vs_rocketmq_ratio"] = _ratio(
            metaq, _rate(rows, "rocketmq", f"java_{phase}")
        )
    return figures
