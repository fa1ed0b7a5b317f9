"""What ``bench_accumulation.py`` needs besides the consumers: the backlog written into
each system, the role processes it starts, the disk's own read rate, and the page cache.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from compare_harness import windowed
from metaq_load import Budget, batched

from metaq.client.producer import Producer
from metaq.client.pull_consumer import PullConsumer
from metaq.testing.waiting import wait_until, wait_until_async

HERE: Final = Path(__file__).parent
FILL_CALLERS: Final = 4
FILL_BATCH: Final = 250
UNBOUNDED_S: Final = 1e9
"""A fill is bounded by its message count; the time is not what stops it."""
STORED_TIMEOUT_S: Final = 60.0
WARM_STORE: Final = ("--set", "store.commitlog_segment_bytes=268435456")
"""metaq's defaults for a backlog the page cache keeps: 256 MiB segments, the default
window (40 % of memory)."""
DRAIN_TIMEOUT_S: Final = 600.0


async def fill_metaq(nameserver: str, topic: str, body: bytes, messages: int) -> int:
    """Messages stored (acknowledged): ``messages``, rounded up to whole batches."""
    # Bodies are random: compressing them would only cost the fill time.
    async with Producer([nameserver], compress_over_bytes=1 << 30) as producer:
        budget = Budget(UNBOUNDED_S, messages)
        await batched(producer, topic, body, budget, FILL_CALLERS, FILL_BATCH)
        return budget.sent


async def metaq_stored(
    nameserver: str, topic: str, group: str, at_least: int = 0
) -> tuple[int, int]:
    """(messages written to the new ``topic``, of which ``group`` committed past).

    Counted from offset 0, not the queues' minimum: under disk pressure the broker
    deletes segments every group has consumed, and the minimum moves up behind a drain.
    With ``at_least``, asks again until the queues hold that many: a queue's end is its
    last indexed message, and the last acknowledged sends may still be on their way to
    the index (a drain timed to a short count ends early).
    """
    async with PullConsumer([nameserver], group) as consumer:
        queues = await consumer.queues(topic, refresh=True)
        counts = (0, 0)

        async def indexed() -> bool:
            nonlocal counts
            stored = committed = 0
            for queue in queues:
                offsets = await consumer.query(topic, queue)
                stored += offsets.max_offset
                committed += offsets.committed or 0
            counts = (stored, committed)
            return stored >= at_least

        await wait_until_async(
            indexed, STORED_TIMEOUT_S, f"{topic}'s queues index all {at_least:,} sent"
        )
        return counts


async def claim_backlog(nameserver: str, topic: str, group: str) -> None:
    """Commit ``group``'s offsets at the start of every queue of ``topic``.

    Until a group has committed, the broker does not know it still needs the backlog:
    with only a group at the topic's end, the segments count as consumed, and under disk
    pressure (``store.disk_clean_ratio``) they are deleted before the drain begins.
    """
    async with PullConsumer([nameserver], group) as consumer:
        for queue in await consumer.queues(topic, refresh=True):
            await consumer.commit(topic, queue, (await consumer.query(topic, queue)).min_offset)


async def fill_rabbitmq_stream(port: int, stream: str, body: bytes, messages: int) -> int:
    """Messages stored: ``messages``, rounded up to whole batches (as for Redis)."""
    from peer_rabbitmq import send_confirmed
    from rstream import Producer as StreamProducer

    async with StreamProducer("127.0.0.1", port, username="guest", password="guest") as producer:
        await producer.create_stream(stream, exists_ok=True)

        async def send(count: int) -> None:
            await send_confirmed(producer, stream, body, count)

        budget = Budget(UNBOUNDED_S, messages)
        await windowed(budget, send, FILL_BATCH, FILL_CALLERS)
        return budget.sent


async def fill_nats(port: int, stream: str, subject: str, body: bytes, messages: int) -> None:
    import nats
    from nats.js.api import StorageType

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        js = nc.jetstream(publish_async_max_pending=FILL_CALLERS * FILL_BATCH)
        await js.add_stream(name=stream, subjects=[subject], storage=StorageType.FILE)
        for _ in range(messages):
            await js.publish_async(subject, body)
        await js.publish_async_completed()
    finally:
        await nc.close()


async def fill_redis(port: int, stream: str, body: bytes, messages: int) -> int:
    import redis.asyncio as aioredis

    client: Any = aioredis.Redis(host="127.0.0.1", port=port)
    try:

        async def send(count: int) -> None:
            async with client.pipeline(transaction=False) as pipe:
                for _ in range(count):
                    pipe.xadd(stream, {b"d": body})
                await pipe.execute()

        budget = Budget(UNBOUNDED_S, messages)
        await windowed(budget, send, FILL_BATCH, FILL_CALLERS)
        return budget.sent
    finally:
        await client.aclose()


@dataclass
class Role:
    """One process of ``accumulation_roles.py`` and what it last said."""

    name: str
    proc: subprocess.Popen[str]
    count: int = 0
    bytes: int = 0
    last: float = 0.0
    ends: dict[int, int] = field(default_factory=dict)
    ready: threading.Event = field(default_factory=threading.Event)
    result: dict[str, Any] | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(cls, role: str, **args: Any) -> Role:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "accumulation_roles.py"), role, json.dumps(args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=HERE,
        )
        started = cls(role, proc)
        threading.Thread(target=started._read, daemon=True).start()
        return started

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            word, _, rest = line.strip().partition(" ")
            if word == "ready":
                self.ready.set()
            elif word == "progress":
                count, size, last, ends = rest.split(" ", 3)
                self.count, self.bytes, self.last = int(count), int(size), float(last)
                self.ends = {int(k): v for k, v in json.loads(ends).items()}
            elif word == "result":
                self.result = json.loads(rest)
                self.count, self.bytes = self.result.get("count", 0), self.result.get("bytes", 0)
                self.last = self.result.get("last", self.last)
                self.ends = {int(k): v for k, v in self.result.get("ends", {}).items()}
                self.done.set()
        self.done.set()

    def _say(self, line: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    def wait_ready(self, timeout_s: float) -> None:
        if not self.ready.wait(timeout_s):
            raise RuntimeError(f"{self.name} was not ready in {timeout_s:.0f} s")

    def go(self, **schedule: float | list[float]) -> None:
        self._say("go " + json.dumps(schedule))

    def wait_result(self, timeout_s: float) -> dict[str, Any]:
        if not self.done.wait(timeout_s) or self.result is None:
            raise RuntimeError(f"{self.name} gave no result in {timeout_s:.0f} s")
        return self.result

    def stop(self, timeout_s: float = 30.0) -> dict[str, Any]:
        self._say("stop")
        result = self.wait_result(timeout_s)
        self.proc.wait(timeout_s)
        return result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@contextlib.contextmanager
def roles() -> Iterator[list[Role]]:
    """Kills every role process left running however the block ends."""
    started: list[Role] = []
    try:
        yield started
    finally:
        for role in started:
            role.kill()


def timed_drain(
    processes: list[Role],
    messages: int,
    server_pids: Sequence[int] = (),
    timeout_s: float = DRAIN_TIMEOUT_S,
) -> dict[str, Any]:
    """Start the drain processes together; wait until they hold ``messages`` between them.

    Besides the rate, the CPU the consumer processes (and the servers, given their pids)
    spent per message: on a machine shared with other work, the figure that moves
    least with the load."""
    for process in processes:
        process.wait_ready(60)
    server_cpu = servers_cpu_seconds(server_pids)
    began = time.monotonic()
    for process in processes:
        process.go()
    wait_until(
        lambda: _drained(processes) >= messages or any(
            p.proc.poll() is not None for p in processes),
        timeout_s,
        f"{messages:,} messages drained",
        poll_s=0.05,
    )  # fmt: skip
    if server_cpu is not None:
        server_cpu = (servers_cpu_seconds(server_pids) or math.nan) - server_cpu
    results = [p.stop() for p in processes]
    drained = _drained(processes)
    if drained < messages:
        raise RuntimeError(f"{processes[0].name}: {drained:,} of {messages:,} drained")
    seconds = max(r["last"] for r in results) - began
    received = sum(r["count"] for r in results)
    # Messages delivered twice (a rebalance hands a queue on before its last commit)
    # count once in the rate.
    size = sum(r["bytes"] for r in results) * messages // received
    return {
        "messages": messages,
        "seconds": round(seconds, 3),
        "msgs_s": round(messages / seconds, 1),
        "mb_s": round(size / seconds / 1e6, 1),
        "received_per_process": [r["count"] for r in results],
        "delivered_twice": received - messages,
        "consumer_cpu_us_per_msg": round(sum(r["cpu_s"] for r in results) / messages * 1e6, 2),
        "server_cpu_us_per_msg": (
            None if server_cpu is None else round(server_cpu / messages * 1e6, 2)
        ),
    }


def _drained(processes: list[Role]) -> int:
    """Distinct messages the processes hold: by queue offsets where they report them."""
    if not any(p.ends for p in processes):
        return sum(p.count for p in processes)
    ends: dict[int, int] = {}
    for process in processes:
        for queue, end in process.ends.items():
            ends[queue] = max(ends.get(queue, 0), end)
    return sum(ends.values())


def servers_cpu_seconds(pids: Sequence[int]) -> float | None:
    """The CPU the processes used so far together, None without any; NaN if one is gone."""
    if not pids:
        return None
    return sum(cpu_seconds(pid) or math.nan for pid in pids)


def mem_total_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def drop_page_cache() -> str | None:
    """Write back and drop the page cache; why not, when it could not be done."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as exc:
        return f"the page cache was not dropped ({exc.strerror}; it needs root)"
    return None


def disk_read_mb_s(files: list[Path], limit_bytes: int) -> tuple[float, str]:
    """Sequential read rate of the disk under ``files`` (files this run wrote), with
    ``dd iflag=direct`` (no page cache) in 4 MiB blocks; (MB/s, how it was measured)."""
    if shutil.which("dd") is None:
        return float("nan"), "dd not found"
    total = 0
    began = time.monotonic()
    for path in files:
        if total >= limit_bytes:
            break
        subprocess.run(
            ["dd", f"if={path}", "of=/dev/null", "bs=4M", "iflag=direct", "status=none"],
            check=True,
        )
        total += path.stat().st_size
    seconds = time.monotonic() - began
    how = f"dd iflag=direct bs=4M over {total / 2**30:.1f} GiB of the backlog's segment files"
    return total / seconds / 1e6, how


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU the process used so far, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    # utime and stime, the 14th and 15th fields of the whole line.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_bytes(pid: int) -> int | None:
    """Bytes the process made the disk read so far (``/proc/PID/io``), None if hidden."""
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None
