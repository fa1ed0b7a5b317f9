"""A broker group's backup, taken and restored exactly as docs/runbook.md says, holds
every message at its offsets and the consumer groups' committed offsets.

A replicated group takes writes and commits on two topics; its slave is stopped and its
data directory archived with the runbook's ``tar`` command; the archive is unpacked (and
the commitlog's blocks reserved again with ``fallocate``) into a fresh cluster (new
nameserver, new data directory, new ports), whose first broker starts alone as the
group's master and a second, empty one joins it as slave. Both serve every message back
byte for byte at the same queue and commitlog offsets, the group's committed offsets are
the ones committed before the backup, and the restored group goes on from where the old
one stopped."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from metaq.client import Producer
from metaq.common.record import Record
from metaq.testing import BrokerError, BrokerProcess, DataClient
from metaq.testing.cluster import Cluster, ClusterBuilder
from metaq.testing.waiting import run_async, wait_until

pytestmark = pytest.mark.slow

GROUP = "broker-a"
TOPICS = {"bk-orders": 4, "bk-audit": 2}
READERS = "bk-readers"
COMMITS = [("bk-orders", 0, 3), ("bk-orders", 2, 1), ("bk-audit", 1, 4)]
"""Offsets the consumer group commits before the backup: some queues partly read, the
rest never read (no committed offset)."""

BACKUP_COMMAND = ["tar", "--create", "--gzip", "--sparse", "--exclude=./lock"]
"""The runbook's archive command (docs/runbook.md, "Back up a broker group"), with the
data directory and archive appended: the whole directory but the lock file."""
RESTORE_COMMAND = ["tar", "--extract", "--gzip"]

Contents = dict[tuple[str, int], list[Record]]
Committed = dict[tuple[str, int], int | None]


async def _contents(broker: BrokerProcess) -> Contents:
    client = await DataClient.connect(broker.data_host, broker.data_port)
    try:
        return {
            (topic, queue): await client.read_queue(topic, queue)
            for topic, queues in TOPICS.items()
            for queue in range(queues)
        }
    finally:
        await client.close()


def contents(broker: BrokerProcess) -> Contents:
    """Every record of every queue of the test's topics, as ``broker`` serves it."""
    return run_async(_contents(broker))


async def _committed(broker: BrokerProcess) -> Committed:
    client = await DataClient.connect(broker.data_host, broker.data_port)
    try:
        found: Committed = {}
        for topic, queues in TOPICS.items():
            for queue in range(queues):
                answer = await client.query_offset(topic, queue, group=READERS)
                has = answer.HasField("committed_offset")
                found[(topic, queue)] = answer.committed_offset if has else None
        return found
    finally:
        await client.close()


def committed(broker: BrokerProcess) -> Committed:
    """The consumer group's committed offset of every queue at ``broker``."""
    return run_async(_committed(broker))


async def _write(cluster: Cluster) -> None:
    for topic, queues in TOPICS.items():
        await cluster.create_topic(topic, queues=queues, groups=[GROUP])
    async with Producer(cluster.nameserver_addresses) as producer:
        for n in range(60):
            topic = "bk-orders" if n % 3 else "bk-audit"
            await producer.send(
                topic, f"message {n}".encode() * (1 + n % 7), tags=f"t{n % 4}", keys=[f"k{n}"]
            )
    master = cluster.master(GROUP)
    client = await DataClient.connect(master.data_host, master.data_port)
    try:
        await client.commit(READERS, COMMITS)
    finally:
        await client.close()


def _archive(data_dir: Path, archive: Path) -> None:
    subprocess.run([*BACKUP_COMMAND, "--file", str(archive), "-C", str(data_dir), "."], check=True)


def _unpack(archive: Path, data_dir: Path) -> None:
    """The runbook's restore: unpack, then reserve the commitlog segments' blocks again."""
    data_dir.mkdir(parents=True)
    subprocess.run([*RESTORE_COMMAND, "--file", str(archive), "-C", str(data_dir)], check=True)
    segments = sorted((data_dir / "commitlog").iterdir())
    assert segments, f"no commitlog in the backup: {sorted(data_dir.iterdir())}"
    for segment in segments:
        size = str(segment.stat().st_size)
        subprocess.run(["fallocate", "-l", size, str(segment)], check=True)
        assert segment.stat().st_blocks * 512 >= segment.stat().st_size, segment


def _wait_same(broker: BrokerProcess, expected: Contents, what: str) -> None:
    seen: list[Contents] = []

    def same() -> bool:
        try:
            seen.append(contents(broker))
        except BrokerError:  # a new slave before the master's topic table reaches it
            return False
        return seen[-1] == expected

    wait_until(same, 30, what)


def _wait_committed(broker: BrokerProcess, expected: Committed, what: str) -> None:
    def same() -> bool:
        try:
            return committed(broker) == expected
        except BrokerError:
            return False

    wait_until(same, 30, what)


def test_a_backup_from_a_slave_restores_into_a_fresh_group(tmp_path: Path) -> None:
    for tool in ("tar", "fallocate"):
        if shutil.which(tool) is None:
            pytest.fail(f"the runbook's backup and restore need {tool} on the PATH")
    archive = tmp_path / "broker-a.tar.gz"
    with ClusterBuilder(groups=(GROUP,), replicas=2).start(tmp_path / "old") as old:
        run_async(_write(old), timeout_s=60)
        master_id = old.master_id(GROUP)
        slave_id = 1 - master_id
        stored = contents(old.broker(GROUP, master_id))
        expected_commits: Committed = {q: None for q in stored}
        expected_commits.update({(t, q): o for t, q, o in COMMITS})
        assert committed(old.broker(GROUP, master_id)) == expected_commits
        assert sum(len(records) for records in stored.values()) == 60
        assert all(stored[(topic, 0)] for topic in TOPICS)

        # The runbook: the slave holds the whole log and the offsets, then stops cleanly.
        slave = old.broker(GROUP, slave_id)
        _wait_same(slave, stored, "the slave serves every message the master does")
        _wait_committed(slave, expected_commits, "the slave holds the group's offsets")
        assert slave.terminate() == 0
        _archive(old.data_dir(GROUP, slave_id), archive)

    new_builder = ClusterBuilder(groups=(GROUP,), replicas=1)
    new_dir = tmp_path / "new"
    _unpack(archive, new_dir / f"{GROUP}-0")
    with new_builder.start(new_dir) as new:
        restored = new.broker(GROUP, 0)
        assert restored.data_port not in {b.data_port for b in old.brokers.values()}
        assert contents(restored) == stored
        assert committed(restored) == expected_commits

        # A slave with an empty directory copies the restored log and offsets.
        joined = new.start_broker(GROUP, 1)
        _wait_same(joined, stored, "the new slave serves the restored log")
        _wait_committed(joined, expected_commits, "the new slave holds the offsets")

        # The restored group takes writes after what it held.
        async def send_one() -> int:
            async with Producer(new.nameserver_addresses) as producer:
                result = await producer.send("bk-audit", b"after the restore")
            ends = {q: len(stored[("bk-audit", q)]) for q in range(TOPICS["bk-audit"])}
            assert result.queue_offset == ends[result.queue_id], (result, ends)
            return result.commitlog_offset

        after = run_async(send_one(), timeout_s=60)
        newest = max(r.commitlog_offset for records in stored.values() for r in records)
        assert after > newest
