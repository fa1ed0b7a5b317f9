"""Replication and failover, measured with real processes on loopback.

- **replication throughput** — a master alone takes ``--fill-mib`` of 1 KiB messages;
  then an empty slave starts and copies it all; MB/s from the slave's first byte to its
  last (``replication_mb_s``);
- **catch-up** — a slave of a sync group is killed with kill -9, the master takes
  ``--behind-mib`` more alone (``min_in_sync_replicas = 1``), the slave is started again:
  the seconds from its start to its readiness and to being in sync again, and the MB/s of
  the copy from readiness to in sync (``catchup_mb_s``), beside what this machine's disk
  (``dd`` with ``conv=fdatasync``) and loopback (one TCP stream, 4 MiB writes) move; and
  the slave's CPU seconds (user + system, every thread) per GB from readiness until it is
  in sync and has dispatched everything (``catchup_cpu_s_per_gb``): on shared cores the
  rate alone hides what the copy costs;
- **slow slave** — a sync group of three (``min_in_sync_replicas = 2``) in network
  namespaces, send latency with every replica at full speed and with one slave's link
  throttled to ``--slow-kib-s`` (:mod:`slow_slave`; ``slow_slave_p99_ratio``);
- **sync vs async** — the same broker group (a master and one slave) under sync and then
  async replication: send_batch throughput (4 callers × 1,024 × 1 KiB) and one-at-a-time
  send latency p50 / p99 / p99.9, with the ratio sync / async in the same run
  (``sync_vs_async_batch_ratio``, target ≥ 0.5);
- **failover** — a producer sends one message at a time to a sync group of two; the
  master is killed with kill -9, the controller promotes the slave, and the time from
  the kill to the first send acknowledged by the new master is taken; the old master is
  restarted (it rejoins as a slave), and this is repeated ``--failovers`` times
  (``failover_p50_s``, ``failover_max_s``; targets 5 s and 10 s);
- **producer resume** — the same kill -9, ``--resume-kills`` times, with a lone broker
  serving the topic beside the group, so the producers keep succeeding elsewhere and
  nothing but the client's own route handling brings them back: three producers (one
  send at a time round robin, ``send_batch`` of 16, and one with a sharding key) each
  note their first OK from the group after the kill. ``producer_resume_p99_s`` is kill →
  that OK over every producer and kill, ``producer_resume_after_takeover_p99_s`` the
  part after the new master was seen taking writes (target 1 s);
- **ordered resume** — two ordered consumers on the same kind of group, ``--resume-kills``
  kill -9s: from the new master until every queue is handled again
  (:mod:`ordered_resume`; ``ordered_resume_p99_s``, target 2 s).

The last line of the output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

from bench_e2e import BATCH_CALLERS, BATCH_MESSAGES, TOPIC
from metaq_load import Budget, batched, one_at_a_time, percentile_ms, ready_producer
from ordered_resume import ordered_resumes
from slow_slave import slow_slave

from metaq.client.admin import Admin
from metaq.client.producer import Producer
from metaq.client.results import SendStatus
from metaq.testing import BrokerProcess
from metaq.testing.cluster import Cluster, ClusterBuilder, Group
from metaq.testing.waiting import wait_until

GROUP: Final = "bench-g"
QUEUES: Final = 8
BODY: Final = b"x" * 1024
SEGMENT: Final = ("--set", "store.commitlog_segment_bytes=268435456")
MIB: Final = 1 << 20


def health(broker: BrokerProcess) -> dict[str, Any]:
    state = broker.health()
    if state is None:
        raise RuntimeError(f"broker {broker.http_url} is not reachable")
    return state


def _role(broker: BrokerProcess) -> str:
    state = broker.health()
    return str(state["role"]) if state is not None else "unreachable"


MODES: Final = {
    "replication": "async",
    "catchup": "sync",
    "sync": "sync",
    "async": "async",
    "failover": "sync",
    "resume": "sync",
    "ordered": "sync",
}
"""Each cell's group (``bench-g-<cell>``) and its replication mode."""
LONE: Final = "bench-lone"
BUILDER: Final = ClusterBuilder(
    groups=(),
    replicas=2,
    group_replicas={LONE: 1},
    broker_args=SEGMENT,
    group_args={
        **{f"{GROUP}-{cell}": ("--set", f"replication_mode={mode}",
                               "--set", "min_in_sync_replicas=1")
           for cell, mode in MODES.items()},
        LONE: ("--set", "failover=false"),
    },
    small_store=False,
    ready_timeout_s=60,
)  # fmt: skip
"""One nameserver; each cell starts its group on it and stops it when done."""


def cell(cluster: Cluster, name: str) -> Group:
    """The group of cell ``name``, none of its brokers started yet."""
    return cluster.group(f"{GROUP}-{name}")


def wait_electable(group: Group, timeout_s: float = 60.0) -> None:
    """Until both brokers are in sync and the controller agrees (either may be elected)."""
    group.wait_committed_in_sync([0, 1], timeout_s)


async def _fill(nameserver: str, mib: int) -> None:
    producer = await ready_producer(nameserver, TOPIC)
    try:
        batch = [BODY] * 1024
        for _ in range(mib):
            await producer.send_batch(TOPIC, batch)
    finally:
        await producer.close()


def replication_throughput(cluster: Cluster, mib: int) -> float:
    group = cell(cluster, "replication")
    try:
        master = group.start_broker(0)
        asyncio.run(cluster.create_topic(TOPIC, queues=QUEUES, groups=[group.name]))
        asyncio.run(_fill(cluster.nameserver_addresses[0], mib))
        end = int(health(master)["commitlog_write_offset"])
        slave = group.start_broker(1)
        began = time.perf_counter()
        seen = [0]

        def copied() -> bool:
            seen[0] = int(health(slave)["commitlog_write_offset"])
            return seen[0] >= end

        wait_until(copied, 600, "the slave copied the master's log")
        seconds = time.perf_counter() - began
        return end / seconds / 1e6
    finally:
        cluster.stop_group(group.name)


def catch_up(cluster: Cluster, mib: int) -> dict[str, float]:
    """Restart a slave that is ``mib`` MiB behind: readiness, rejoin and copy rate."""
    group = cell(cluster, "catchup")
    try:
        master = group.start_broker(0)
        group.start_broker(1)
        asyncio.run(cluster.create_topic(TOPIC, queues=QUEUES, groups=[group.name]))
        wait_electable(group)
        group.brokers[1].kill()
        wait_until(lambda: 1 not in health(master)["in_sync_ids"], 60, "the slave is out")
        before = int(health(master)["commitlog_write_offset"])
        asyncio.run(_fill(cluster.nameserver_addresses[0], mib))
        behind = int(health(master)["commitlog_write_offset"]) - before
        started = time.perf_counter()
        slave = group.start_broker(1)
        ready = time.perf_counter()
        cpu_ready = cpu_seconds(slave.proc.pid)
        wait_until(lambda: 1 in health(master)["in_sync_ids"], 600, "the slave is in sync",
                   poll_s=0.02)  # fmt: skip
        in_sync = time.perf_counter()
        wait_until(lambda: _dispatch_backlog(slave) == 0, 600, "the slave dispatched it all")
        cpu = cpu_seconds(slave.proc.pid) - cpu_ready
    finally:
        cluster.stop_group(group.name)
    return {
        "catchup_behind_mib": round(behind / MIB, 1),
        "catchup_ready_s": round(ready - started, 3),
        "catchup_rejoin_s": round(in_sync - started, 3),
        "catchup_mb_s": round(behind / (in_sync - ready) / 1e6, 1),
        "catchup_cpu_s_per_gb": round(cpu / (behind / 1e9), 2),
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` so far, every thread included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _dispatch_backlog(broker: BrokerProcess) -> float:
    samples = asyncio.run(Admin().metrics(broker.http_url))
    return samples[("metaq_dispatch_backlog_bytes", ())]


def disk_mb_s(root: Path, mib: int) -> float:
    """What ``dd`` writes and syncs to the data disk, MB/s."""
    target = root / "dd.bin"
    began = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=4M", f"count={max(1, mib // 4)}",
         "conv=fdatasync", "status=none"],
        check=True,
    )  # fmt: skip
    seconds = time.perf_counter() - began
    target.unlink()
    return max(1, mib // 4) * 4 * MIB / seconds / 1e6


def loopback_mb_s(mib: int) -> float:
    """One TCP stream over loopback, 4 MiB writes, read into one buffer, MB/s."""
    server = socket.create_server(("127.0.0.1", 0))
    total = mib * MIB
    chunk = bytes(4 * MIB)

    def send() -> None:
        with socket.create_connection(server.getsockname()) as out:
            for _ in range(mib // 4):
                out.sendall(chunk)

    sender = threading.Thread(target=send)
    began = time.perf_counter()
    sender.start()
    connection, _ = server.accept()
    buffer = bytearray(4 * MIB)
    received = 0
    with connection:
        while received < (mib // 4) * 4 * MIB:
            n = connection.recv_into(buffer)
            if not n:
                break
            received += n
    sender.join()
    server.close()
    return received / (time.perf_counter() - began) / 1e6 if total else 0.0


async def _modes_cell(nameserver: str, seconds: float) -> dict[str, float]:
    producer = await ready_producer(nameserver, TOPIC)
    try:
        rate, latencies = await one_at_a_time(producer, TOPIC, BODY, Budget(seconds))
        batch_rate = await batched(
            producer, TOPIC, BODY, Budget(seconds), BATCH_CALLERS, BATCH_MESSAGES
        )
    finally:
        await producer.close()
    return {
        "batch_msgs_s": batch_rate,
        "one_at_a_time_msgs_s": rate,
        "p50_ms": percentile_ms(latencies, 0.5),
        "p99_ms": percentile_ms(latencies, 0.99),
        "p999_ms": percentile_ms(latencies, 0.999),
    }


def sync_vs_async(cluster: Cluster, seconds: float) -> dict[str, Any]:
    cells: dict[str, dict[str, float]] = {}
    for mode in ("sync", "async"):
        group = cell(cluster, mode)
        try:
            group.start_broker(0)
            group.start_broker(1)
            asyncio.run(cluster.create_topic(TOPIC, queues=QUEUES, groups=[group.name]))
            wait_electable(group)
            cells[mode] = asyncio.run(_modes_cell(cluster.nameserver_addresses[0], seconds))
        finally:
            cluster.stop_group(group.name)
    return cells


async def _until_acked_after(producer: Producer, after: float, limit_s: float) -> float:
    """Send one at a time until a send made after ``after`` is acknowledged OK."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            result = await producer.send(TOPIC, BODY)
        except Exception:
            await asyncio.sleep(0.01)
            continue
        if result.status is SendStatus.OK and time.monotonic() > after:
            return time.monotonic()
    raise TimeoutError(f"no send acknowledged within {limit_s} s of the kill")


def failovers(cluster: Cluster, runs: int) -> list[float]:
    group = cell(cluster, "failover")
    times: list[float] = []
    try:
        group.start_broker(0)
        group.start_broker(1)
        asyncio.run(cluster.create_topic(TOPIC, queues=QUEUES, groups=[group.name]))
        wait_electable(group)

        async def run_all() -> None:
            producer = await ready_producer(cluster.nameserver_addresses[0], TOPIC)
            try:
                for _ in range(runs):
                    old = await asyncio.to_thread(group.master, 30)
                    await asyncio.to_thread(wait_electable, group)
                    group.brokers[old].kill()
                    killed = time.monotonic()
                    acked = await _until_acked_after(producer, killed, 60)
                    times.append(acked - killed)
                    print(f"  failover {len(times)}: {acked - killed:.3f} s", flush=True)
                    await asyncio.to_thread(group.start_broker, old)
            finally:
                await producer.close()

        asyncio.run(run_all())
    finally:
        cluster.stop_group(group.name)
    return times


class _Resumes:
    """Three producers sending until stopped; each OK noted as (when its send began, when
    it was answered, broker group)."""

    KINDS: Final = ("send", "send_batch", "sharded")

    def __init__(self) -> None:
        self.oks: dict[str, list[tuple[float, float, str]]] = {k: [] for k in self.KINDS}
        self.stop = asyncio.Event()

    async def run(self, nameserver: str, kind: str) -> None:
        producer = await ready_producer(nameserver, TOPIC)
        oks = self.oks[kind]
        try:
            while not self.stop.is_set():
                began = time.monotonic()
                try:
                    if kind == "send_batch":
                        broker = (await producer.send_batch(TOPIC, [BODY] * 16))[0].broker
                    else:
                        key = "resume-key" if kind == "sharded" else None
                        result = await producer.send(TOPIC, BODY, sharding_key=key)
                        if result.status is not SendStatus.OK:
                            continue
                        broker = result.broker
                except Exception:
                    await asyncio.sleep(0.01)  # pacing after a failure, not a wait on state
                    continue
                oks.append((began, time.monotonic(), broker))
                await asyncio.sleep(0.005)  # pacing: about 150 sends a second each
        finally:
            await producer.close()

    def first_after(self, kind: str, broker: str, after: float) -> float | None:
        """When the first send begun after ``after`` was answered OK by ``broker``."""
        return next((t for began, t, b in self.oks[kind] if began > after and b == broker), None)


async def _kill_and_resume(
    group: Group, resumes: _Resumes, name: str
) -> tuple[float, float, list[float]]:
    """kill -9 the master; when it was killed, when a new master was seen, and each
    producer's first OK from the group after the kill. The old master is started again."""
    await asyncio.to_thread(wait_electable, group)
    old = await asyncio.to_thread(group.master, 30)
    group.brokers[old].kill()
    killed = time.monotonic()
    others = [b for i, b in group.brokers.items() if i != old]

    def new_master() -> bool:
        return any(_role(b) == "master" for b in others)

    def resumed() -> bool:
        return all(resumes.first_after(k, name, killed) for k in resumes.KINDS)

    await asyncio.to_thread(wait_until, new_master, 60, "a new master", poll_s=0.02)
    took_over = time.monotonic()
    await asyncio.to_thread(wait_until, resumed, 60, "every producer resumed")
    firsts = [resumes.first_after(k, name, killed) or 0.0 for k in resumes.KINDS]
    await asyncio.to_thread(group.start_broker, old)
    return killed, took_over, firsts


def producer_resumes(cluster: Cluster, runs: int) -> tuple[list[float], list[float]]:
    """Per kill and producer: kill → first OK from the group, and takeover → that OK."""
    group = cell(cluster, "resume")
    name = group.name
    from_kill: list[float] = []
    from_takeover: list[float] = []
    try:
        cluster.start_broker(LONE)
        group.start_broker(0)
        group.start_broker(1)
        asyncio.run(cluster.create_topic(TOPIC, queues=QUEUES, groups=[name, LONE]))
        wait_electable(group)

        async def run_all() -> None:
            resumes = _Resumes()
            address = cluster.nameserver_addresses[0]
            tasks = [asyncio.ensure_future(resumes.run(address, k)) for k in resumes.KINDS]
            try:
                for run in range(runs):
                    killed, took_over, firsts = await _kill_and_resume(group, resumes, name)
                    from_kill.extend(t - killed for t in firsts)
                    from_takeover.extend(max(0.0, t - took_over) for t in firsts)
                    back = ", ".join(f"{t - killed:.2f}" for t in firsts)
                    print(f"  resume {run + 1}: new master {took_over - killed:.2f} s after the "
                          f"kill; producers back {back} s after it", flush=True)  # fmt: skip
            finally:
                resumes.stop.set()
                await asyncio.gather(*tasks)

        asyncio.run(run_all())
    finally:
        cluster.stop_group(LONE)
        cluster.stop_group(name)
    return from_kill, from_takeover


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per cell")
    parser.add_argument("--fill-mib", type=int, default=512, help="MiB the slave copies")
    parser.add_argument("--failovers", type=int, default=5, help="kill -9 runs (≥ 5)")
    parser.add_argument("--resume-kills", type=int, default=20, help="kill -9 runs for resume")
    parser.add_argument("--only-resume", action="store_true", help="producer resume only")
    parser.add_argument("--behind-mib", type=int, default=1024, help="MiB a slave catches up")
    parser.add_argument("--only-catchup", action="store_true", help="catch-up only")
    parser.add_argument("--slow-kib-s", type=int, default=256, help="the slow slave's link")
    parser.add_argument("--slow-seconds", type=float, default=30.0, help="seconds per cell")
    parser.add_argument("--only-slow", action="store_true", help="slow slave only")
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    cluster = BUILDER.start(root / "cluster")
    try:
        slow = {} if args.only_catchup else slow_slave(root, args.slow_seconds, 32, args.slow_kib_s)
        print(f"slow slave: {slow}", flush=True)
        if args.only_slow:
            print(json.dumps(slow, sort_keys=True))
            return
        catchup = catch_up(cluster, args.behind_mib)
        catchup["disk_dd_mb_s"] = round(disk_mb_s(root, args.behind_mib), 1)
        catchup["loopback_mb_s"] = round(loopback_mb_s(args.behind_mib), 1)
        print(f"catch-up: {catchup}", flush=True)
        if args.only_catchup:
            print(json.dumps(catchup, sort_keys=True))
            return
        from_kill, from_takeover = producer_resumes(cluster, args.resume_kills)
        resume = {
            "producer_resume_p50_s": round(statistics.median(from_kill), 3),
            "producer_resume_p99_s": round(_p99(from_kill), 3),
            "producer_resume_after_takeover_p99_s": round(_p99(from_takeover), 3),
            "producer_resume_max_s": round(max(from_kill), 3),
        }
        print(f"producer resume over {args.resume_kills} kills x 3 producers: {resume}")
        ordered = ordered_resume_cell(cluster, args.resume_kills)
        resume.update(ordered)
        print(f"ordered resume over {args.resume_kills} kills: {ordered}", flush=True)
        if args.only_resume:
            print(json.dumps(resume, sort_keys=True))
            return
        mb_s = replication_throughput(cluster, args.fill_mib)
        print(f"replication: {mb_s:,.0f} MB/s master -> slave ({args.fill_mib} MiB)", flush=True)
        cells = sync_vs_async(cluster, args.seconds)
        times = failovers(cluster, args.failovers)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)

    ratio = cells["sync"]["batch_msgs_s"] / cells["async"]["batch_msgs_s"]
    print()
    print("| mode  | send_batch msgs/s | one-at-a-time msgs/s | p50 ms | p99 ms | p99.9 ms |")
    print("|-------|------------------:|---------------------:|-------:|-------:|---------:|")
    for mode in ("sync", "async"):
        c = cells[mode]
        print(
            f"| {mode:<5} | {c['batch_msgs_s']:>17,.0f} | {c['one_at_a_time_msgs_s']:>20,.0f} "
            f"| {c['p50_ms']:>6.2f} | {c['p99_ms']:>6.2f} | {c['p999_ms']:>8.2f} |"
        )
    p50 = statistics.median(times)
    print(f"\nsync / async send_batch: {ratio:.2f} (target ≥ 0.50)")
    print(
        f"failover, kill -9 to first acknowledged send: p50 {p50:.2f} s, max {max(times):.2f} s "
        f"over {len(times)} runs (targets 5 s / 10 s)"
    )
    figures = {
        **slow,
        **catchup,
        **resume,
        "replication_mb_s": round(mb_s, 1),
        "sync_vs_async_batch_ratio": round(ratio, 3),
        "failover_p50_s": round(p50, 3),
        "failover_max_s": round(max(times), 3),
        "failover_runs_s": [round(t, 3) for t in times],
        **{f"{mode}_{key}": round(v, 2) for mode, c in cells.items() for key, v in c.items()},
    }
    print(json.dumps(figures, sort_keys=True))


def ordered_resume_cell(cluster: Cluster, runs: int) -> dict[str, float]:
    group = cell(cluster, "ordered")
    try:
        group.start_broker(0)
        group.start_broker(1)
        group.master(30)
        wait_electable(group)
        times = ordered_resumes(group, cluster.nameserver_addresses[0], runs)
    finally:
        cluster.stop_group(group.name)
    return {
        "ordered_resume_p50_s": round(statistics.median(times), 3),
        "ordered_resume_p99_s": round(_p99(times), 3),
        "ordered_resume_max_s": round(max(times), 3),
    }


def _p99(values: list[float]) -> float:
    """Nearest-rank p99 (the largest of fewer than 100 values)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, -(-len(ordered) * 99 // 100) - 1)]


if __name__ == "__main__":
    main(sys.argv[1:])
