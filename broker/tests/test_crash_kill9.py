"""Crash tests with real processes: kill -9 a child appending under SYNC flush, again and again.

The page cache survives kill -9, so this does not test fsync (test_crash_fault_shim does);
it tests that a process dying at any instruction (mid-append, mid-roll, mid-dispatch,
mid-checkpoint) leaves a store that recovers with every acknowledged message intact.
"""

from __future__ import annotations

import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

import metaq.testing.store_crash as support
from metaq.broker.store import FlushMode, MessageStore, PutStatus

CHILD = Path(__file__).with_name("crash_child.py")
SEED = 0x5EED_2011
KILLS = 30
MAX_ACKS_PER_RUN = 200
RUN_DEADLINE_S = 20.0


@dataclass(frozen=True)
class Ack:
    uid: str
    commitlog_offset: int
    topic: str
    queue_id: int
    queue_offset: int
    body_hash: str
    record_crc: int

    @property
    def run(self) -> int:
        return int(self.uid.split("-")[0])


@dataclass
class ChildRun:
    ready_offset: int
    ready_reason: str
    acks: list[Ack]


def _parse(line: bytes) -> Ack | tuple[int, str]:
    words = line.decode().split()
    if words[0] == "ready":
        return int(words[1]), words[2]
    assert words[0] == "ack" and len(words) == 8, line
    uid, offset, topic, queue_id, queue_offset, digest, crc = words[1:]
    return Ack(uid, int(offset), topic, int(queue_id), int(queue_offset), digest, int(crc))


def _run_and_kill(data: Path, run: int, kill_after: int, log: Path) -> ChildRun:
    """Start the child on ``data``, read acks until ``kill_after`` of them, kill -9 it.

    Acks the child printed after that, before it died, count too: they were promised.
    """
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(data), str(run), str(SEED)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            bufsize=0,
        )
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + RUN_DEADLINE_S
    ready: tuple[int, str] | None = None
    acks: list[Ack] = []
    buf = b""

    def take(chunk: bytes) -> None:
        nonlocal buf, ready
        buf += chunk
        *lines, buf = buf.split(b"\n")  # a partial last line waits for more (or is dropped)
        for line in lines:
            item = _parse(line)
            if isinstance(item, Ack):
                acks.append(item)
            else:
                ready = item

    try:
        while ready is None or len(acks) < kill_after:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"run {run}: {len(acks)} of {kill_after} acks in {RUN_DEADLINE_S}s")
            if select.select([fd], [], [], remaining)[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    pytest.fail(f"run {run}: the child exited early:\n{log.read_text()[-3000:]}")
                take(chunk)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=RUN_DEADLINE_S)
    # The child is dead, so the pipe ends; what it wrote before dying is still in it.
    while chunk := os.read(fd, 1 << 16):
        take(chunk)
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert ready is not None
    return ChildRun(ready[0], ready[1], acks)


def _verify(store: MessageStore, acked: dict[str, Ack]) -> int:
    """Check a store opened after a kill; return the commitlog end recovery found."""
    assert store.recovery is not None and store.recovery.crashed
    end = store.commitlog.write_offset
    found = support.check_store(store)  # CRCs, queue <-> commitlog agreement, no gaps
    by_offset = {record.commitlog_offset: (record, raw) for record, raw in found}
    per_run: dict[int, list[int]] = defaultdict(list)
    for record, _ in found:
        run, n = record.properties["uid"].split("-")
        per_run[int(run)].append(int(n))
    for run, numbers in per_run.items():
        # A child appends in order and acks in order: what is there is a prefix of what
        # it appended (unacked messages may be in it, a hole may not).
        assert numbers == list(range(len(numbers))), f"run {run} has holes: {numbers}"
    for ack in acked.values():
        assert ack.commitlog_offset in by_offset, f"acknowledged {ack.uid} is gone"
        record, raw = by_offset[ack.commitlog_offset]
        assert record.properties["uid"] == ack.uid
        assert (record.topic, record.queue_id, record.queue_offset) == (
            ack.topic,
            ack.queue_id,
            ack.queue_offset,
        )
        assert support.body_hash(record.body) == ack.body_hash
        assert zlib.crc32(raw) == ack.record_crc, f"{ack.uid} is not byte-identical"
        assert int(record.properties["uid"].split("-")[1]) < len(per_run[ack.run])
        # The index, rebuilt from the last checkpoint on, finds it by key.
        assert [r.commitlog_offset for r in store.lookup_key(ack.topic, ack.uid)] == [
            ack.commitlog_offset
        ], f"the index lost {ack.uid}"
    # The recovered store takes appends, continuing the queue's offsets.
    before = store.max_offset("orders", 0)
    result = store.put("orders", b"verify", queue_id=0, properties={"uid": "verify-0"})
    assert result.status is PutStatus.OK
    assert result.appended.queue_offsets == [before]
    store.dispatcher.catch_up()
    support.check_store(store)
    return end


@pytest.mark.timeout(180)
def test_kill9_at_random_moments_loses_no_acknowledged_message(tmp_path: Path) -> None:
    began = time.monotonic()
    rng = random.Random(SEED)
    data = tmp_path / "data"
    config = support.small_config(data, FlushMode.SYNC)
    acked: dict[str, Ack] = {}
    expected_start: int | None = None
    for run in range(KILLS):
        # Now and then kill right after start-up, in the first append; usually later.
        kill_after = 0 if rng.random() < 0.15 else rng.randint(1, MAX_ACKS_PER_RUN)
        child = _run_and_kill(data, run, kill_after, tmp_path / f"child-{run}.log")
        if expected_start is not None:
            # The child recovered the same crash state the parent verified, identically.
            assert child.ready_offset == expected_start, child
        assert len(child.acks) >= kill_after
        for ack in child.acks:
            assert ack.run == run and ack.uid not in acked
            acked[ack.uid] = ack

        # Verify a copy of what the child left, so the next child recovers the raw
        # crash state itself rather than a state the parent already repaired.
        copy = tmp_path / "verify"
        shutil.copytree(data, copy)
        store = support.open_store(support.small_config(copy, FlushMode.SYNC))
        try:
            expected_start = _verify(store, acked)
        finally:
            store.close()
        shutil.rmtree(copy)

    # Finally the data itself: recover it, check it, shut down cleanly, open again.
    store = support.open_store(config)
    try:
        assert _verify(store, acked) == expected_start
    finally:
        store.close()
    store = support.open_store(config)
    try:
        assert store.recovery is not None and not store.recovery.crashed
        support.check_store(store)
    finally:
        store.close()
    assert len(acked) > KILLS * 10
    print(f"{KILLS} kills, {len(acked)} acked messages, {time.monotonic() - began:.1f}s")
