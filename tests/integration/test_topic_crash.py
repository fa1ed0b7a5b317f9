"""A broker killed (-9) while topics are being created restarts with a whole table: every
acknowledged create, nothing half-made, and a change log that goes on where it was cut;
and a slave, which gets each change as a journal record of its own, holds what its
master holds, before and after its own restart.

kill -9 leaves the page cache, so the broker's own writes all reach the file; a power cut
in the middle of an append leaves part of a record. The test adds that part itself after
the kill, as the last append torn, which a table that trusted every line of its log (or
appended after a torn line) would not survive.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
from pathlib import Path

import pytest

from metaq.client.admin import Admin, TopicSettings
from metaq.testing import BrokerProcess
from metaq.testing.cluster import ClusterBuilder
from metaq.testing.waiting import hold, run_async, wait_until, wait_until_async

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="real processes on loopback")

SETTINGS = TopicSettings(read_queues=2, write_queues=2)
CREATORS = 4
KILL_AFTER = 200


async def _create_until_killed(broker: BrokerProcess, seed: int) -> tuple[set[str], set[str]]:
    """Create topics from several clients at once and kill -9 the broker in the middle;
    (acknowledged, in flight at the kill)."""
    acknowledged: set[str] = set()
    attempted: set[str] = set()
    killed = asyncio.Event()
    rng = random.Random(seed)

    async def creator(index: int, admin: Admin) -> None:
        n = 0
        while not killed.is_set():
            name = f"crash-{index}-{n:05d}"
            n += 1
            attempted.add(name)
            try:
                await admin.put_topic(broker.http_url, name, SETTINGS)
            except Exception:  # the broker died under the call: it may or may not be there
                return
            acknowledged.add(name)

    async def killer() -> None:
        async def enough() -> bool:
            return len(acknowledged) >= KILL_AFTER or all(t.done() for t in tasks)

        await wait_until_async(enough, 120, f"{KILL_AFTER} topics created")
        moment = rng.uniform(0, 0.02)

        def kill_a_moment_later() -> None:
            # Somewhere inside the next creates: a moment, not a wait for anything.
            hold(moment)
            broker.kill()

        await asyncio.to_thread(kill_a_moment_later)
        killed.set()

    async with Admin() as admin:
        tasks = [asyncio.create_task(creator(i, admin)) for i in range(CREATORS)]
        await killer()
        await asyncio.gather(*tasks)
    return acknowledged, attempted - acknowledged


def _tear_the_last_append(log_path: Path) -> None:
    """Leave half of a record at the end of the change log, as a crash mid-append would."""
    last = log_path.read_bytes().splitlines(keepends=True)[-1]
    with log_path.open("ab") as file:
        file.write(last[: len(last) // 2])


async def _topics(broker: BrokerProcess) -> dict[str, TopicSettings]:
    async with Admin() as admin:
        return await admin.broker_topics(broker.http_url)


def test_a_broker_killed_mid_create_restarts_with_every_acknowledged_topic(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "broker"
    started: list[BrokerProcess] = []
    try:
        started.append(BrokerProcess.start(data_dir))
        acknowledged, in_flight = asyncio.run(_create_until_killed(started[-1], seed=36))
        assert len(acknowledged) >= KILL_AFTER
        _tear_the_last_append(data_dir / "topics.log")

        started.append(BrokerProcess.start(data_dir))
        listed = asyncio.run(_topics(started[-1]))
        assert acknowledged <= set(listed), sorted(acknowledged - set(listed))[:10]
        assert set(listed) <= acknowledged | in_flight, sorted(set(listed) - acknowledged)
        assert all(settings == SETTINGS for settings in listed.values())

        # The torn part was cut: a change made now is read back after the next crash.
        async def create_one() -> None:
            async with Admin() as admin:
                await admin.put_topic(started[-1].http_url, "after-the-crash", SETTINGS)

        asyncio.run(create_one())
        started[-1].kill()
        started.append(BrokerProcess.start(data_dir))
        again = asyncio.run(_topics(started[-1]))
        assert set(again) == set(listed) | {"after-the-crash"}
    finally:
        for broker in started:
            with contextlib.suppress(Exception):
                broker.kill()


def test_a_slave_holds_each_topic_change_its_master_journals_and_keeps_it_across_a_restart(
    tmp_path: Path,
) -> None:
    group = "topics-ha"
    with ClusterBuilder(groups=(group,), replicas=2).start(tmp_path) as cluster:
        master_id = cluster.master_id(group)
        master, slave_id = cluster.broker(group, master_id), 1 - master_id

        async def change() -> None:
            async with Admin() as admin:
                for n in range(50):
                    await admin.put_topic(master.http_url, f"ha-{n:02d}", SETTINGS)
                await admin.put_topic(master.http_url, "ha-07", TopicSettings(2, 1))
                assert await admin.remove_topic(master.http_url, "ha-08")

        run_async(change(), timeout_s=120)
        expected = run_async(_topics(master))
        assert len(expected) == 49 and expected["ha-07"] == TopicSettings(2, 1)

        def slave_holds_them() -> bool:
            return run_async(_topics(cluster.broker(group, slave_id))) == expected

        wait_until(slave_holds_them, 30, "the slave holds the master's topics")
        cluster.broker(group, slave_id).kill()
        cluster.start_broker(group, slave_id)
        wait_until(slave_holds_them, 30, "the restarted slave holds them from its own files")
