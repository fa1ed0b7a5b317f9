"""Consumer groups per broker: what offset commits cost a master and its slave at 1 to
100,000 groups, each committing every second.

A real cluster (one nameserver, one broker group of a master and a slave, async
replication) serves one topic. Each group is one consumer holding ``QUEUES_PER_GROUP``
of its queues, and commits them as a consumer does: one COMMIT_OFFSET a second covering
its queues, every offset one further than the last. The commits go over
``CONNECTIONS`` connections of :class:`metaq.testing.DataClient` (the real protocol),
at most ``IN_FLIGHT`` unanswered on each. A first round registers the groups; then for
``seconds`` a round starts every second (or as soon as the last one ended, when the
master cannot keep up), and the figures are taken over that window:

- the master's and the slave's CPU (``/proc/PID/stat``) per commit, the commits
  answered per second, and whether the master kept up (every round in its second);
- the commitlog bytes written per second (only the offsets journal writes there);
- the master's RSS after the window;
- the slave's catch-up: from the window's end until it answers the last group's
  offset as the master has it (replicated and applied);
- the snapshot (``consumer_offsets.json``): after a clean stop, the table is loaded
  and written again in this process with the broker's own code, timed, and its size.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Final

POINTS: Final = (1, 1_000, 10_000, 100_000)
QUICK_POINTS: Final = (1, 50, 200, 500)
TOPIC: Final = "ScaleGroups"
QUEUES: Final = 16
QUEUES_PER_GROUP: Final = 4
CONNECTIONS: Final = 16
IN_FLIGHT: Final = 256
IDLE_S: Final = 2.0
QUICK_IDLE_S: Final = 1.0
QUICK_SNAPSHOT_INTERVAL_MS: Final = 1_000
"""A quick run's snapshot is taken within a second of the window, not the default five."""
TICKS_PER_S: Final = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User plus system CPU the process has used, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def group_name(index: int) -> str:
    return f"scale-group-{index:06d}"


def _requests(groups: int) -> list[tuple[bytes, bytes]]:
    """Per group, its COMMIT_OFFSET header at offset 127 and that offset's encoding:
    a round's header is the template with the offset replaced (offsets below 127 are one
    byte too), which keeps encoding off the driver's CPU."""
    from metaq.common.v1.data_pb2 import CommitOffsetRequest, QueueOffset

    marker = QueueOffset(offset=127).SerializeToString()
    out = []
    for g in range(groups):
        first = (g * QUEUES_PER_GROUP) % QUEUES
        request = CommitOffsetRequest(
            consumer_group=group_name(g),
            offsets=[
                QueueOffset(topic=TOPIC, queue_id=(first + i) % QUEUES, offset=127)
                for i in range(QUEUES_PER_GROUP)
            ],
        )
        template = request.SerializeToString()
        assert template.count(marker) == QUEUES_PER_GROUP
        out.append((template, marker))
    return out


async def _commit_round(
    clients: list[Any], requests: list[tuple[bytes, bytes]], offset: int
) -> None:
    """Every group commits its queues at ``offset``, over the connections in turn."""
    from metaq.common.framing import FrameType

    async def one_connection(index: int) -> None:
        client = clients[index]
        window: set[asyncio.Future[Any]] = set()
        for template, marker in requests[index :: len(clients)]:
            header = template.replace(marker, marker[:-1] + bytes([offset]))
            window.add(client.request(FrameType.COMMIT_OFFSET, header))
            if len(window) >= IN_FLIGHT:
                done, window = await asyncio.wait(window, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    future.result()
        for future in asyncio.as_completed(window):
            await future

    await asyncio.gather(*(one_connection(i) for i in range(min(len(clients), len(requests)))))


async def _drive(
    cluster: Any, master_id: int, groups: int, seconds: float, timeout_s: float, idle_s: float
) -> dict[str, Any]:
    from metaq.common.record import encode
    from metaq.testing import DataClient

    slave_id = 1 - master_id
    master, slave = cluster.broker("scale", master_id), cluster.broker("scale", slave_id)
    host, port = cluster.data_address("scale", master_id).rsplit(":", 1)
    if seconds > 120:
        raise ValueError("commits are encoded for offsets up to 126: at most 120 seconds")
    requests = _requests(groups)
    clients = [await DataClient.connect(host, int(port)) for _ in range(CONNECTIONS)]
    try:
        # Room for every offset the rounds commit: one past the last message consumed.
        body = b"x" * 64
        for queue_id in range(QUEUES):
            records = [encode(TOPIC, body, queue_id=queue_id) for _ in range(int(seconds) + 8)]
            await clients[0].send(TOPIC, queue_id, records)
        idle_began, idle_cpu = time.perf_counter(), cpu_s(master.proc.pid)
        await asyncio.sleep(idle_s)
        idle_cores = (cpu_s(master.proc.pid) - idle_cpu) / (time.perf_counter() - idle_began)
        await asyncio.wait_for(_commit_round(clients, requests, 1), timeout_s)
        write_began = master.health()["commitlog_write_offset"]
        cpu_master, cpu_slave = cpu_s(master.proc.pid), cpu_s(slave.proc.pid)
        began = time.perf_counter()
        rounds = late = 0
        offset = 1
        while time.perf_counter() - began < seconds:
            offset += 1
            round_began = time.perf_counter()
            await asyncio.wait_for(_commit_round(clients, requests, offset), timeout_s)
            rounds += 1
            took = time.perf_counter() - round_began
            if took > 1.0:
                late += 1
            else:
                await asyncio.sleep(1.0 - took)
        elapsed = time.perf_counter() - began
        master_cpu = cpu_s(master.proc.pid) - cpu_master
        slave_cpu = cpu_s(slave.proc.pid) - cpu_slave
        written = master.health()["commitlog_write_offset"] - write_began
        # The slave has the last group's last commit: replicated and applied.
        last = group_name(groups - 1)
        queue = ((groups - 1) * QUEUES_PER_GROUP) % QUEUES
        shost, sport = cluster.data_address("scale", slave_id).rsplit(":", 1)
        reader = await DataClient.connect(shost, int(sport))
        caught_up_s = None
        waited = time.perf_counter()
        while time.perf_counter() - waited < timeout_s:
            answer = await reader.query_offset(TOPIC, queue, group=last)
            if answer.HasField("committed_offset") and answer.committed_offset == offset:
                caught_up_s = round(time.perf_counter() - waited, 3)
                break
            await asyncio.sleep(0.05)
        await reader.close()
    finally:
        for client in clients:
            await client.close()
    commits = rounds * groups
    return {
        "final_offset": offset,
        "rounds": rounds,
        "late_rounds": late,
        "kept_up": late == 0,
        "commits_s": round(commits / elapsed),
        "master_cpu_cores": round(master_cpu / elapsed, 3),
        "master_idle_cores": round(idle_cores, 3),
        # Less what the master burns idle (its timers), which would swamp a few commits.
        "commit_cpu_us": round(max(0.0, master_cpu - idle_cores * elapsed) / commits * 1e6, 1),
        "slave_cpu_cores": round(slave_cpu / elapsed, 3),
        "slave_commit_cpu_us": round(slave_cpu / commits * 1e6, 1),
        "journal_bytes_s": round(written / elapsed),
        "journal_bytes_per_commit": round(written / commits, 1),
        "master_rss_mib": rss_mib(master.proc.pid),
        "slave_rss_mib": rss_mib(slave.proc.pid),
        "slave_caught_up_s": caught_up_s,
    }


def _holds(saved: Path, group: str, queue: int, offset: int) -> bool:
    try:
        data = json.loads(saved.read_bytes())
    except (FileNotFoundError, ValueError):
        return False
    return bool(data["offsets"].get(group, {}).get(TOPIC, {}).get(str(queue)) == offset)


def _take_snapshot(data_dir: Path, groups: int, offset: int, work: Path, timeout_s: float) -> Path:
    """A copy of the master's offsets snapshot once it holds the last group's last commit
    (the master writes it every ``offset_snapshot_interval_ms`` while commits change it)."""
    from metaq.broker.offsets import FILE_NAME

    saved = data_dir / FILE_NAME
    last, queue = group_name(groups - 1), ((groups - 1) * QUEUES_PER_GROUP) % QUEUES
    began = time.monotonic()
    while not _holds(saved, last, queue, offset):
        if time.monotonic() - began > timeout_s:
            raise TimeoutError(f"no offsets snapshot with the last commit in {timeout_s:.0f} s")
        time.sleep(0.2)
    copy = work / "snapshot"
    copy.mkdir()
    shutil.copy(saved, copy / FILE_NAME)
    return copy


def _snapshot_figures(copy: Path) -> dict[str, Any]:
    """Load the master's table and write it again, timed, with the broker's own code."""
    from metaq.broker.offsets import FILE_NAME, ConsumerOffsets

    began = time.perf_counter()
    offsets = ConsumerOffsets(copy)
    load_s = time.perf_counter() - began
    began = time.perf_counter()
    offsets.write(offsets.snapshot())
    return {
        "snapshot_s": round(time.perf_counter() - began, 3),
        "snapshot_load_s": round(load_s, 3),
        "snapshot_mib": round((copy / FILE_NAME).stat().st_size / 2**20, 2),
        "offsets_held": len(offsets.items()),
    }


def measure(groups: int, seconds: float, timeout_s: float, quick: bool = False) -> dict[str, Any]:
    """One row; ``quick`` idles less before the window and snapshots the offsets every
    second, so a smoke run spends its time on the commits."""
    from metaq.testing.cluster import ClusterBuilder

    row: dict[str, Any] = {"groups": groups}
    broker_args = ["--set", f"max_consumer_groups={max(groups, 100_000)}"]
    if quick:
        broker_args += ["--set", f"offset_snapshot_interval_ms={QUICK_SNAPSHOT_INTERVAL_MS}"]
    builder = ClusterBuilder(
        groups=("scale",),
        replicas=2,
        replication_mode="async",
        ready_timeout_s=120,
        broker_args=broker_args,
    )
    work = Path(tempfile.mkdtemp(prefix="metaq-bench-groups-"))
    try:
        with builder.start(work) as cluster:
            asyncio.run(cluster.create_topic(TOPIC, queues=QUEUES, timeout_s=120))
            cluster.wait_in_sync("scale", [0, 1], timeout_s=120)
            master_id = cluster.master_id("scale", timeout_s=60)
            idle_s = QUICK_IDLE_S if quick else IDLE_S
            row.update(asyncio.run(_drive(cluster, master_id, groups, seconds, timeout_s, idle_s)))
            data_dir = cluster.data_dir("scale", master_id)
            copy = _take_snapshot(data_dir, groups, row["final_offset"], work, 120)
        row.update(_snapshot_figures(copy))
    except Exception as exc:  # the row says what failed, the run goes on
        row["failed"] = f"{type(exc).__name__}: {exc}"[:1500]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return row


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    done = {row["groups"]: row for row in rows if "failed" not in row}
    out: dict[str, Any] = {"groups_rows": rows}
    top = done.get(100_000)
    out["offsets_commit_cpu_us_at_100k_groups"] = None if top is None else top["commit_cpu_us"]
    largest = max(done, default=None)
    if largest is not None:
        out["groups_largest_measured"] = largest
        out["offsets_commit_cpu_us_at_largest"] = done[largest]["commit_cpu_us"]
        out["groups_largest_kept_up"] = done[largest]["kept_up"]
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    def cell(row: dict[str, Any], key: str) -> str:
        value = row.get(key)
        return "—" if value is None else format(value, ",")

    keys = ("commits_s", "kept_up", "commit_cpu_us", "master_cpu_cores", "slave_commit_cpu_us",
            "journal_bytes_s", "master_rss_mib", "snapshot_s", "snapshot_mib",
            "slave_caught_up_s")  # fmt: skip
    print(
        "| groups | commits/s | kept up | master CPU µs/commit | master cores "
        "| slave CPU µs/commit | journal B/s | master RSS MiB | snapshot s | snapshot MiB "
        "| slave caught up s |"
    )
    print("|---:|---:|:-:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['groups']:,} | " + " | ".join(cell(row, k) for k in keys) + " |")
        if "failed" in row:
            print(f"|  | failed: {row['failed'][:300]} |")


def chart(rows: list[dict[str, Any]], before: list[dict[str, Any]], path: Path) -> None:
    from scale_chart import draw

    panels = (
        ("commit_cpu_us", "master CPU per commit, µs"),
        ("commits_s", "commits answered per second"),
        ("journal_bytes_s", "offsets journal, bytes/s"),
        ("master_rss_mib", "master RSS, MiB"),
        ("snapshot_s", "offsets snapshot write, s"),
        ("slave_commit_cpu_us", "slave CPU per commit, µs"),
        ("slave_caught_up_s", "slave caught up after the window, s"),
        ("snapshot_mib", "offsets snapshot, MiB"),
    )
    draw(rows, before, "groups", panels, "One broker group (master + slave) by consumer groups "
         "committing every second (2 cores)", path)  # fmt: skip
