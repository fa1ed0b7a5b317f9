"""Offsets consumers commit at a slave (their master down, or their route stale) reach
the group's master, whichever it is afterwards, and survive the slave's restart; the
group's committed offset never rewinds to what the master had before.

Found by a loss run: a slave answered COMMIT_OFFSET but never kept it, and the group
re-read 295,204 messages after one consumer restart."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from metaq.client.admin import Admin, QueueProgress
from metaq.common.framing import FrameType
from metaq.common.record import encode
from metaq.common.v1.data_pb2 import (
    CommitOffsetRequest,
    CommitOffsetResponse,
    SendResponse,
)
from metaq.testing import BrokerError, BrokerProcess, DataClient
from metaq.testing.cluster import ClusterBuilder, Group
from metaq.testing.impostor import Impostor
from metaq.testing.replica_group import (
    GROUP,
    TOPIC,
    health,
    start_group,
    start_pair_without_failover,
)
from metaq.testing.waiting import holds_for, run_async, wait_until, wait_until_async

pytestmark = pytest.mark.slow

READERS = "readers"


async def _call(broker: BrokerProcess, what: str, *args: object) -> object:
    client = await DataClient.connect(broker.data_host, broker.data_port)
    try:
        return await getattr(client, what)(*args)
    finally:
        await client.close()


def commit(broker: BrokerProcess, offset: int, group: str = READERS) -> None:
    """Commit the group's offset of queue 0 at ``broker``; raises if it refuses."""
    run_async(_call(broker, "commit", group, [(TOPIC, 0, offset)]))


def committed(broker: BrokerProcess, group: str = READERS) -> int | None:
    async def query() -> int | None:
        client = await DataClient.connect(broker.data_host, broker.data_port)
        try:
            answer = await client.query_offset(TOPIC, 0, group=group)
        finally:
            await client.close()
        return answer.committed_offset if answer.HasField("committed_offset") else None

    try:
        return run_async(query())
    except (OSError, ConnectionError, BrokerError):  # down, or the topic not there yet
        return None


def wait_committed(broker: BrokerProcess, offset: int, what: str, group: str = READERS) -> None:
    seen: list[int | None] = []

    def reached() -> bool:
        seen.append(committed(broker, group))
        return seen[-1] == offset

    try:
        wait_until(reached, 20, what)
    except AssertionError:
        raise AssertionError(f"{what}: committed offset {seen[-1]}, not {offset}") from None


def send(broker: BrokerProcess, count: int) -> None:
    async def scenario() -> None:
        client = await DataClient.connect(broker.data_host, broker.data_port)
        try:
            for n in range(count):
                answer = await client.send(TOPIC, 0, [encode(TOPIC, b"m%d" % n, queue_id=0)])
                assert answer.status == SendResponse.OK
        finally:
            await client.close()

    run_async(scenario())


async def progress(nameservers: list[str]) -> list[QueueProgress]:
    async with Admin(nameservers, timeout_s=2) as admin:
        return await admin.progress(READERS, TOPIC)


def progress_of_queue_0(group: Group) -> int | None:
    """What ``metaq progress`` shows for queue 0; None while it cannot answer (a dead
    master still routed)."""
    try:
        rows = run_async(progress(group.nameserver_addresses))
    except Exception:
        return None
    return next(r.offsets.committed for r in rows if r.queue.queue_id == 0)


def test_offsets_committed_at_a_slave_while_the_master_is_down_reach_it_when_it_returns(
    tmp_path: Path,
) -> None:
    # Without failover (MetaQ 2.0's master/slave): the master comes back as master.
    group = start_pair_without_failover(tmp_path, queues=2)
    master, slave = group.brokers[0], group.brokers[1]
    try:
        send(master, 100)
        group.wait_caught_up(1)
        commit(master, 10)
        wait_committed(slave, 10, "the slave applies the master's journal")

        # A consumer with a stale route commits at the slave while the master is up.
        commit(slave, 20)
        wait_committed(master, 20, "the slave forwards a commit to its live master")
        wait_committed(slave, 20, "the slave takes the master's answer")

        master.kill()
        commit(slave, 50)
        # The slave keeps what it answered, across its own crash.
        slave.kill()
        slave = group.start_broker(1)
        assert committed(slave) == 50
        commit(slave, 60)

        def progress_shows_the_slave() -> bool:
            return progress_of_queue_0(group) == 60

        wait_until(progress_shows_the_slave, 30, "metaq progress shows the slave's commit")

        master = group.start_broker(0)
        master.wait_master(20)
        wait_committed(master, 60, "the returning master takes the slave's commits")
        wait_committed(slave, 60, "the slave shows the master's offset again")
        assert health(slave)["role"] == "slave"
        wait_until(lambda: health(slave)["held_offsets"] == 0, 10, "the slave holds nothing")
        # A consumer restarting now resumes where it was, not at the master's old 10.
        master.terminate()
        master = group.start_broker(0)
        assert committed(master) == 60
    finally:
        group.stop()


def test_offsets_committed_at_a_slave_survive_its_crash_and_promotion(tmp_path: Path) -> None:
    group = start_group(
        tmp_path, brokers=2, mode="sync", min_in_sync=1,
        extra=("--set", "replica_lag_max_ms=2000", "--set", "replication_timeout_ms=1000"),
    )  # fmt: skip
    try:
        old = group.master()
        new = 1 - old
        send(group.brokers[old], 100)
        group.wait_caught_up(new)
        commit(group.brokers[old], 10)
        wait_committed(group.brokers[new], 10, "the slave applies the master's journal")

        # Hold the controller still so the commit lands while the broker is a slave.
        group.nameservers[0].pause()
        group.brokers[old].kill()
        assert health(group.brokers[new])["role"] == "slave"
        commit(group.brokers[new], 50)
        group.brokers[new].kill()
        group.start_broker(new)
        group.nameservers[0].resume()

        assert group.master(30) == new
        wait_committed(group.brokers[new], 50, "the promoted slave keeps its held commit")
        # The old master rejoins as a slave and gets the offsets from the journal.
        group.start_broker(old)
        group.wait_caught_up(old)
        wait_committed(group.brokers[old], 50, "the old master, now a slave, has the commit")
        assert health(group.brokers[old])["role"] == "slave"
        # Nothing held any more: the promotion journaled it.
        assert health(group.brokers[new])["held_offsets"] == 0
        assert committed(group.brokers[new]) == 50
    finally:
        group.stop()


def test_a_promotion_journals_an_offsets_table_larger_than_one_record(tmp_path: Path) -> None:
    # 64 KiB records: 3,000 groups make a table several records long, as 50,000 did
    # with the default 4 MiB (every promotion then failed writing the table).
    group = start_group(
        tmp_path, brokers=2, mode="sync", min_in_sync=1,
        extra=("--set", "replica_lag_max_ms=2000", "--set", "replication_timeout_ms=1000",
               "--set", "store.max_message_bytes=65536"),
    )  # fmt: skip
    try:
        old = group.master()
        new = 1 - old
        send(group.brokers[old], 100)
        group.wait_caught_up(new)

        async def many_groups(broker: BrokerProcess) -> None:
            client = await DataClient.connect(broker.data_host, broker.data_port)
            try:
                for start in range(0, 3000, 500):
                    await asyncio.gather(
                        *(client.commit(f"group-{n:05d}", [(TOPIC, 0, n % 100)])
                          for n in range(start, start + 500))
                    )  # fmt: skip
            finally:
                await client.close()

        run_async(many_groups(group.brokers[old]))
        commit(group.brokers[old], 10)
        wait_committed(group.brokers[new], 10, "the slave applies the master's journal")

        group.nameservers[0].pause()
        group.brokers[old].kill()
        commit(group.brokers[new], 50)
        group.nameservers[0].resume()
        assert group.master(30) == new

        group.start_broker(old)
        group.wait_caught_up(old)
        wait_committed(group.brokers[old], 50, "the old master, now a slave, has the commit")
        assert "decision" not in group.brokers[new].output, group.brokers[new].output[-3000:]
    finally:
        group.stop()


# --- forwarding: who to, at the limits, over a kept connection ----------------------------


def _master_and_slave(
    tmp_path: Path, master_args: Sequence[str] = ()
) -> tuple[Group, BrokerProcess, BrokerProcess]:
    """A master (broker 0) and its slave without failover, the slave caught up on 100
    messages of queue 0 and on the group's commit of offset 10 there."""
    builder = ClusterBuilder(
        groups=(GROUP,), replicas=2, broker_args=("--set", "failover=false"),
        node_args={f"{GROUP}-0": master_args},
    )  # fmt: skip
    cluster = builder.start(tmp_path)
    group = cluster.group(GROUP)
    try:
        master, slave = group.brokers[0], group.brokers[1]
        run_async(cluster.create_topic(TOPIC, queues=2))
        send(master, 100)
        group.wait_caught_up(1)
        commit(master, 10)
        wait_committed(slave, 10, "the slave applies the master's journal")
    except BaseException:
        cluster.stop()
        raise
    return group, master, slave


def _commits_at_zero(frame_type: FrameType, header: bytes) -> bytes | None:
    """Answers any forwarded commit with offset 0 for every queue."""
    if frame_type is FrameType.COMMIT_OFFSET:
        request = CommitOffsetRequest.FromString(header)
        answer = CommitOffsetResponse()
        for entry in request.offsets:
            answer.offsets.add(topic=entry.topic, queue_id=entry.queue_id, offset=0)
        return answer.SerializeToString()
    return None  # a fetch: let it time out


def test_a_slave_forwards_held_commits_only_to_a_master_that_proves_the_secret(
    tmp_path: Path,
) -> None:
    group, master, slave = _master_and_slave(tmp_path)
    try:
        master.kill()

        async def impersonate() -> list[FrameType]:
            impostor = Impostor(_commits_at_zero)
            # The slave goes on following the dead master's address: take it over.
            await impostor.start(master.data_host, master.data_port)
            try:
                await wait_until_async(impostor.asked, 20, "the slave connects to the impostor")
                await asyncio.to_thread(commit, slave, 50)

                def kept() -> bool:
                    return (
                        FrameType.COMMIT_OFFSET not in impostor.seen
                        and committed(slave) == 50
                        and health(slave)["held_offsets"] == 1
                    )

                await asyncio.to_thread(holds_for, kept, 2.0, "the slave keeps its held commit")
                return list(impostor.seen)
            finally:
                await impostor.close()

        seen = run_async(impersonate(), timeout_s=60)
        assert FrameType.REPLICA_AUTH in seen
        assert "did not prove the cluster secret" in slave.output
    finally:
        group.stop()


def test_forwarded_commits_of_a_new_group_reach_a_master_at_its_group_limit(
    tmp_path: Path,
) -> None:
    # The slave answered its consumers OK: the master's group limit must not lose them.
    group, master, slave = _master_and_slave(tmp_path, ("--set", "max_consumer_groups=1"))
    try:
        run_async(_call(slave, "commit", "latecomers", [(TOPIC, 0, 20), (TOPIC, 1, 0)]))
        wait_committed(master, 20, "the master takes the forwarded commit", "latecomers")
        wait_until(lambda: health(slave)["held_offsets"] == 0, 10, "the slave holds nothing")

        async def queue_1() -> bool:
            client = await DataClient.connect(master.data_host, master.data_port)
            try:
                answer = await client.query_offset(TOPIC, 1, group="latecomers")
            finally:
                await client.close()
            return answer.HasField("committed_offset") and answer.committed_offset == 0

        assert run_async(queue_1()), "the whole forwarded batch was taken"
    finally:
        group.stop()


def test_the_forwarder_reconnects_quietly_after_the_masters_idle_timeout(
    tmp_path: Path,
) -> None:
    group, master, slave = _master_and_slave(tmp_path, ("--set", "idle_timeout_s=1"))
    try:
        commit(slave, 20)
        wait_committed(master, 20, "the slave forwards a commit to its live master")

        def idle_closed() -> float:
            samples = run_async(Admin().metrics(master.http_url))
            return samples.get(("metaq_connections_idle_closed_total", ()), 0.0)

        # The slave's fetches keep its replication connection busy: the one the master
        # finds idle is the forwarder's.
        wait_until(lambda: idle_closed() >= 1, 20, "the master closes the idle forwarder")
        commit(slave, 30)
        wait_committed(master, 30, "the next forward reconnects")
        assert "held offset commits to master" not in slave.output, slave.output[-3000:]
    finally:
        group.stop()
