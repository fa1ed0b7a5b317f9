"""Push consumers against a real nameserver and real brokers: groups, rebalancing,
broadcasting, long polling, computer rooms, wrong offsets and start positions."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path

import pytest

import metaq.testing.consumer_cluster as cc
from metaq.client import cli
from metaq.client.admin import Admin
from metaq.client.connection import BrokerConnection
from metaq.client.consumer import (
    BROADCASTING,
    LAST,
    TIMESTAMP,
    PullConsumer,
    PullStatus,
    PushConsumer,
)
from metaq.client.errors import BrokerError
from metaq.client.message import Message
from metaq.client.offset_store import LocalOffsetStore
from metaq.client.process_queue import ProcessQueue
from metaq.client.push_consumer import QueueKey
from metaq.common.framing import FrameType
from metaq.common.model import QueueRoute
from metaq.common.v1.data_pb2 import ConsumerHeartbeatRequest, ConsumerHeartbeatResponse
from metaq.testing import Cluster, run_async
from metaq.testing.waiting import deadline, wait_until_async

# Fast heartbeats so membership changes are seen within a fraction of a second.
FAST = {"heartbeat_interval_s": 0.2, "commit_interval_s": 0.2, "close_timeout_s": 5.0}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = cc.BUILDER.start(tmp_path_factory.mktemp("consumer-cluster"))
    try:
        yield started
    finally:
        started.stop()


def _queues(brokers: list[str], count: int = 4) -> list[tuple[str, int]]:
    return [(b, q) for b in brokers for q in range(count)]


def _partitioned(consumers: list[PushConsumer], total: int) -> bool:
    """Every consumer knows every member, and their queues are disjoint and complete."""
    ids = sorted(c.client_id for c in consumers)
    if any(c.members != ids for c in consumers):
        return False
    owned = [key for c in consumers for key in c.assigned_queues]
    return len(owned) == total == len(set(owned))


def test_a_group_consumes_each_message_once_and_loses_none_when_members_change(
    cluster: Cluster,
) -> None:
    topic, group = "GroupOrders", "group-orders"

    async def scenario() -> dict[str, int]:
        await cluster.create_topic(topic, groups=["broker-a", "broker-b"])
        deliveries = cc.Deliveries()
        sender = cc.Sender(cluster)
        consumers: list[PushConsumer] = []

        async def join(name: str) -> PushConsumer:
            consumer = PushConsumer(cluster.nameserver_addresses, group, **FAST)
            consumer.subscribe(topic, deliveries.handler(name))
            await consumer.start()
            consumers.append(consumer)
            return consumer

        try:
            for n in range(3):
                await join(f"c{n}")
            await cc.wait_for(lambda: _partitioned(consumers, 8), 15, "3 members split 8 queues")
            steady = await sender.send(topic, _queues(["broker-a", "broker-b"]), 10_000)
            await cc.wait_for(
                lambda: deliveries.received_all(steady), 60, "all 10,000 messages arrived"
            )
            steady_report = deliveries.report(steady)
            assert steady_report["lost"] == 0
            assert steady_report["duplicated"] == 0, f"steady state duplicates: {steady_report}"
            assert len({next(iter(c)) for c in deliveries.consumers.values()}) == 3

            # A fourth member joins and one of the first three leaves while messages flow.
            during = asyncio.ensure_future(
                sender.send(topic, _queues(["broker-a", "broker-b"]), 2_000, batch=10)
            )
            await join("c3")
            leaving = consumers.pop(0)
            await leaving.close()
            moved = await during
            await cc.wait_for(lambda: _partitioned(consumers, 8), 15, "3 members split again")
            after = await sender.send(topic, _queues(["broker-a", "broker-b"]), 1_000)
            everything = steady + moved + after
            await cc.wait_for(
                lambda: deliveries.received_all(everything), 30, "every message arrived"
            )
            report = deliveries.report(everything)
            assert report["lost"] == 0
            assert report["unexpected"] == 0
            # Duplicates are allowed only around the rebalance, never in steady state.
            assert all(deliveries.by_id[i] == 1 for i in after), "duplicates after rebalance"
            return report
        finally:
            for consumer in consumers:
                await consumer.close()
            await sender.close()

    report = run_async(scenario(), timeout_s=90)
    print(f"rebalance checker: {report}")


# Heartbeats (and periodic rebalances) far apart: only the brokers' CONSUMER_IDS_CHANGED
# notices can tell a member of a change within the deadlines below.
SLOW = {**FAST, "heartbeat_interval_s": 30.0, "rebalance_interval_s": 60.0}


def test_members_rebalance_at_once_on_the_brokers_notice_when_one_joins_or_leaves(
    cluster: Cluster,
) -> None:
    topic, group = "NoticeOrders", "notice-orders"

    async def scenario() -> tuple[float, float, int]:
        await cluster.create_topic(topic, groups=["broker-a", "broker-b"])
        first = PushConsumer(cluster.nameserver_addresses, group, **SLOW)
        first.subscribe(topic, _ignore)
        second = PushConsumer(cluster.nameserver_addresses, group, **SLOW)
        second.subscribe(topic, _ignore)
        try:
            await first.start()
            await cc.wait_for(lambda: _partitioned([first], 8), 10, "the first member owns all")
            await second.start()
            joined = await cc.wait_for(
                lambda: _partitioned([first, second], 8) and len(first.assigned_queues) == 4,
                1.5,
                "the first member gave up half its queues to the one that joined",
            )
            await second.close()
            left = await cc.wait_for(
                lambda: _partitioned([first], 8), 1.5, "the first member took back every queue"
            )
            assert first._membership is not None
            return joined, left, first._membership.notices
        finally:
            await second.close()
            await first.close()

    joined, left, notices = run_async(scenario())
    assert notices >= 2, "the member rebalanced without a notice: the test proves nothing"
    sent = sum(
        run_async(Admin().metrics(cluster.broker(b).http_url)).get(
            ("metaq_consumer_change_notices_total", ()), 0
        )
        for b in ("broker-a", "broker-b")
    )
    assert sent >= notices
    print(f"rebalanced {joined:.3f} s after a join, {left:.3f} s after a leave")


@pytest.mark.parametrize(
    ("strategy", "only_the_share_moves"), [("sticky", True), ("balanced_hash", False)]
)
def test_a_joining_member_takes_only_its_share_under_sticky_from_the_reported_holdings(
    cluster: Cluster, strategy: str, only_the_share_moves: bool
) -> None:
    # Fixed client ids make balanced_hash's answer fixed too: for these ids it moves six
    # queues where the newcomer's share is four, so the test tells the two apart.
    topic, group = f"Sticky-{strategy}", f"sticky-{strategy}"
    brokers = ["broker-a", "broker-b"]

    async def scenario() -> tuple[dict[str, set[QueueKey]], dict[str, set[QueueKey]]]:
        await cluster.create_topic(topic, groups=brokers, queues=8)
        consumers: list[PushConsumer] = []

        async def join(client_id: str) -> None:
            consumer = PushConsumer(
                cluster.nameserver_addresses, group, strategy=strategy, client_id=client_id, **FAST
            )
            consumer.subscribe(topic, _ignore)
            await consumer.start()
            consumers.append(consumer)
            await cc.wait_for(
                lambda: _partitioned(consumers, 16), 15, f"{len(consumers)} members split 16"
            )

        try:
            for n in range(1, 5):
                await join(f"member-{n}")
            before = {c.client_id: set(c.assigned_queues) for c in consumers}
            await join("member-0")
            # Settled: a further round of heartbeats and rebalances changes nothing.
            settled = {c.client_id: set(c.assigned_queues) for c in consumers}
            for consumer in consumers:
                await consumer._rebalance()
            assert {c.client_id: set(c.assigned_queues) for c in consumers} == settled
            if strategy == "sticky":
                # Every member's copy of the holdings, built from answers that carried
                # only what changed since the copy, is what each member runs now.
                memberships = [c._membership for c in consumers]
                assert all(m is not None for m in memberships)
                for membership in memberships:
                    await membership.heartbeat()  # type: ignore[union-attr]
                for membership in memberships:
                    assert membership is not None
                    copied = {c: set(h.queues) for c, h in membership.holdings.items()}
                    assert copied == settled, membership.client_id
                    # And a heartbeat from that copy is answered with nothing to change.
                    for address, copy in membership._copies.items():
                        request = membership._request(leaving=False)
                        request.known_epoch, request.known_seq = copy.epoch, copy.seq
                        connection = await membership._connections.get(address)
                        frame = await connection.request(
                            FrameType.CONSUMER_HEARTBEAT, request.SerializeToString(), timeout_s=10
                        )
                        answer = ConsumerHeartbeatResponse.FromString(frame.header)
                        assert answer.changes_only and copy.epoch == answer.epoch
                        assert not answer.members and not answer.departed
            return before, settled
        finally:
            for consumer in consumers:
                await consumer.close()

    before, after = run_async(scenario(), timeout_s=90)
    sizes = sorted(len(queues) for queues in after.values())
    assert sizes[-1] - sizes[0] <= 1, after
    owner = {key: client for client, queues in before.items() for key in queues}
    moved = {key for client, queues in after.items() for key in queues if owner[key] != client}
    newcomers_share = after["member-0"]
    print(
        f"{strategy}: {len(moved)} of 16 queues moved, the newcomer's share {len(newcomers_share)}"
    )
    assert (moved == newcomers_share) is only_the_share_moves, (before, after)
    if only_the_share_moves:
        assert all(after[client] <= queues for client, queues in before.items())


def test_a_consumer_that_did_not_ask_for_notices_is_sent_none(cluster: Cluster) -> None:
    """A client from before CONSUMER_IDS_CHANGED would refuse the unknown frame type and
    lose its connection: the broker sends notices only to heartbeats that ask."""
    group = "notice-old-client"
    address = cluster.data_address("broker-a")

    async def heartbeat(connection: BrokerConnection, client_id: str, notify: bool) -> None:
        request = ConsumerHeartbeatRequest(
            consumer_group=group, client_id=client_id, notify_member_changes=notify
        )
        await connection.request(
            FrameType.CONSUMER_HEARTBEAT, request.SerializeToString(), timeout_s=5
        )

    async def scenario() -> tuple[list[FrameType], list[FrameType]]:
        old, new, joiner = [await BrokerConnection.open(address) for _ in range(3)]
        seen: dict[BrokerConnection, list[FrameType]] = {old: [], new: []}
        for connection in (old, new):
            connection.on_request = lambda c, frame: seen[c].append(frame.type)
        try:
            await heartbeat(old, "old", notify=False)
            await heartbeat(new, "new", notify=True)
            await heartbeat(joiner, "joiner", notify=True)
            await cc.wait_for(lambda: bool(seen[new]), 2, "the new client got a notice")
            # Answered after anything the broker wrote to it before: a notice would be in.
            await old.request(FrameType.HEARTBEAT, b"", timeout_s=5)
            return seen[old], seen[new]
        finally:
            for connection in (old, new, joiner):
                await connection.close()

    to_old, to_new = run_async(scenario())
    assert to_old == []
    assert FrameType.CONSUMER_IDS_CHANGED in to_new


async def _ignore(_message: Message) -> None:
    return None


def test_broadcasting_delivers_every_message_to_every_member(
    cluster: Cluster, tmp_path: Path
) -> None:
    topic, group = "Broadcast", "group-broadcast"

    async def scenario() -> None:
        await cluster.create_topic(topic, groups=["broker-a", "broker-b"], queues=2)
        deliveries = [cc.Deliveries(), cc.Deliveries()]
        sender = cc.Sender(cluster)
        consumers = []
        try:
            for n, seen in enumerate(deliveries):
                consumer = PushConsumer(
                    cluster.nameserver_addresses,
                    group,
                    mode=BROADCASTING,
                    offset_store_path=tmp_path / f"member{n}.json",
                    **FAST,
                )
                consumer.subscribe(topic, seen.handler(f"b{n}"))
                await consumer.start()
                consumers.append(consumer)
            assert all(len(c.assigned_queues) == 4 for c in consumers)
            sent = await sender.send(topic, _queues(["broker-a", "broker-b"], 2), 500)
            for seen in deliveries:
                await cc.wait_for(lambda s=seen: s.received_all(sent), 20, "all 500 arrived")  # type: ignore[misc]
                assert seen.report(sent)["duplicated"] == 0
        finally:
            for consumer in consumers:
                await consumer.close()
            await sender.close()
        # Broadcasting offsets live in each member's own file, one past the last message.
        for n in range(2):
            store = LocalOffsetStore(tmp_path / f"member{n}.json")
            assert [store.get(topic, b, q) for b, q in _queues(["broker-a", "broker-b"], 2)] == [
                125
            ] * 4

    run_async(scenario(), timeout_s=60)


def test_a_long_poll_delivers_a_new_message_well_before_the_poll_times_out(
    cluster: Cluster,
) -> None:
    topic, group = "LongPoll", "group-long-poll"

    async def scenario() -> float:
        await cluster.create_topic(topic, groups=["broker-a"], queues=1)
        arrived = asyncio.Event()
        received_at: list[float] = []

        async def handle(message: Message) -> None:
            received_at.append(time.monotonic())
            arrived.set()

        consumer = PushConsumer(
            cluster.nameserver_addresses, group, long_poll_timeout_ms=15_000, **FAST
        )
        consumer.subscribe(topic, handle)
        sender = cc.Sender(cluster)
        try:
            await consumer.start()
            http = cluster.broker("broker-a").http_url

            async def parked() -> bool:
                samples = await Admin().metrics(http)
                return samples.get(("metaq_long_polls_parked", ()), 0) >= 1

            await wait_until_async(parked, 10, "the consumer's pull is parked")
            sent_at = time.monotonic()
            await sender.send(topic, [("broker-a", 0)], 1)
            async with asyncio.timeout(deadline(5)):
                await arrived.wait()
            return received_at[0] - sent_at
        finally:
            await consumer.close()
            await sender.close()

    latency = run_async(scenario(), timeout_s=60)
    assert latency < deadline(1.0), f"long-polled message took {latency:.3f} s"


def test_computer_room_first_keeps_consumers_in_their_room_and_shares_orphaned_rooms(
    cluster: Cluster,
) -> None:
    topic, group = "Rooms", "group-rooms"

    async def scenario() -> None:
        await cluster.create_topic(topic, groups=["broker-a", "broker-b", "broker-c"], queues=2)
        deliveries = cc.Deliveries()
        sender = cc.Sender(cluster)
        consumers: dict[str, PushConsumer] = {}
        try:
            for room in ("r1", "r2"):
                consumer = PushConsumer(
                    cluster.nameserver_addresses,
                    group,
                    strategy="computer_room_first",
                    computer_room=room,
                    **FAST,
                )
                consumer.subscribe(topic, deliveries.handler(room))
                await consumer.start()
                consumers[room] = consumer
            await cc.wait_for(lambda: _partitioned(list(consumers.values()), 6), 15, "split")

            def brokers(room: str) -> list[str]:
                return [b for _, b, _ in consumers[room].assigned_queues]

            # Each room keeps its own broker; r3 has no consumer, so its queues are shared.
            assert sorted(brokers("r1")) == ["broker-a", "broker-a", "broker-c"]
            assert sorted(brokers("r2")) == ["broker-b", "broker-b", "broker-c"]
            sent = await sender.send(topic, _queues(["broker-a", "broker-b"], 2), 40)
            await cc.wait_for(lambda: deliveries.received_all(sent), 20, "40 arrived")
            for msg_id, message in deliveries.messages.items():
                broker = cc.broker_of(cluster, message.store_host)
                assert deliveries.consumers[msg_id] == {cc.ROOMS[broker]}

            # r2's consumer leaves: r2 has no consumer now, so r1 takes its queues.
            await consumers.pop("r2").close()
            await cc.wait_for(lambda: _partitioned(list(consumers.values()), 6), 15, "r1 all")
            more = await sender.send(topic, _queues(["broker-b"], 2), 10)
            await cc.wait_for(lambda: deliveries.received_all(more), 20, "r1 consumes r2's")
            assert all(deliveries.consumers[i] == {"r1"} for i in more)
        finally:
            for consumer in consumers.values():
                await consumer.close()
            await sender.close()

    run_async(scenario(), timeout_s=60)


def test_a_wrong_offset_is_an_explicit_status_and_the_consumer_corrects_itself(
    cluster: Cluster,
) -> None:
    topic, group = "WrongOffsets", "group-wrong-offsets"

    async def scenario() -> None:
        await cluster.create_topic(topic, groups=["broker-a"], queues=1)
        sender = cc.Sender(cluster)
        deliveries = cc.Deliveries()
        consumer: PushConsumer | None = None
        try:
            await sender.send(topic, [("broker-a", 0)], 10)
            async with PullConsumer(cluster.nameserver_addresses, group) as puller:
                (queue,) = await puller.queues(topic)
                result = await puller.pull(topic, queue, 500)
                assert result.status is PullStatus.OFFSET_OVERFLOW_BADLY
                assert (result.next_offset, result.max_offset, result.messages) == (10, 10, [])
                # A commit past the end is refused, and stores nothing.
                with pytest.raises(BrokerError) as refused:
                    await puller.commit(topic, queue, 500)
                assert "offset 500 is past the end of queue" in str(refused.value)
                assert await puller.committed(topic, queue) is None

            # The group's stored position is past the end all the same (a broker restored
            # from a backup, or whose log lost its tail): the consumer corrects it.
            await asyncio.to_thread(_store_offset, cluster, "broker-a", group, topic, 500)
            await sender.close()
            sender = cc.Sender(cluster)
            async with PullConsumer(cluster.nameserver_addresses, group) as puller:
                (queue,) = await puller.queues(topic, refresh=True)
                assert await puller.committed(topic, queue) == 500
                consumer = PushConsumer(cluster.nameserver_addresses, group, **FAST)
                consumer.subscribe(topic, deliveries.handler("c"))
                await consumer.start()
                await cc.wait_for(
                    lambda: consumer is not None and consumer.stats.offset_corrections >= 1,
                    10,
                    "the consumer corrected its offset",
                )
                sent = await sender.send(topic, [("broker-a", 0)], 5)
                await cc.wait_for(lambda: deliveries.received_all(sent), 10, "new ones arrive")
                assert set(deliveries.by_id) == set(sent), "reset to the end, not the start"
                await consumer.close()
                assert await puller.committed(topic, queue) == 15
        finally:
            if consumer is not None:
                await consumer.close()
            await sender.close()

    run_async(scenario(), timeout_s=60)


def _store_offset(cluster: Cluster, name: str, group: str, topic: str, offset: int) -> None:
    """Restart broker ``name`` with ``offset`` written into its offsets snapshot for
    queue 0 of ``topic``, as no commit can store it."""
    old = cluster.broker(name)
    old.terminate()
    path = old.data_dir / "consumer_offsets.json"
    # A broker that never held an offset writes no snapshot: start one as it would.
    data = json.loads(path.read_text()) if path.exists() else {"format": 1, "offsets": {}}
    data["offsets"].setdefault(group, {}).setdefault(topic, {})["0"] = offset
    path.write_text(json.dumps(data))
    cluster.start_broker(name)


def test_a_new_group_starts_from_last_or_from_a_timestamp(cluster: Cluster) -> None:
    topic = "StartPositions"

    async def scenario() -> None:
        await cluster.create_topic(topic, groups=["broker-a"], queues=2)
        sender = cc.Sender(cluster)
        consumers: list[PushConsumer] = []
        try:
            old = await sender.send(topic, _queues(["broker-a"], 2), 20, prefix="old")
            async with PullConsumer(cluster.nameserver_addresses, "group-probe") as puller:
                newest = 0
                for queue in await puller.queues(topic):
                    result = await puller.pull(topic, queue, 0, max_messages=100)
                    newest = max([newest, *(m.store_timestamp_ms for m in result.messages)])
            # The next messages must be stored in a later millisecond than the old ones.
            await cc.wait_for(lambda: time.time() * 1000 > newest + 1, 5, "the clock moved on")

            from_last, from_time = cc.Deliveries(), cc.Deliveries()
            last = PushConsumer(
                cluster.nameserver_addresses, "group-from-last", consume_from=LAST, **FAST
            )
            last.subscribe(topic, from_last.handler("last"))
            await last.start()
            consumers.append(last)
            await cc.wait_for(
                lambda: (
                    all(
                        (q := last.queue_state(k)) is not None and q.committed is not None
                        for k in last.assigned_queues
                    )
                    and len(last.assigned_queues) == 2
                ),
                10,
                "the from-last consumer fixed its start",
            )
            new = await sender.send(topic, _queues(["broker-a"], 2), 20, prefix="new")
            await cc.wait_for(lambda: from_last.received_all(new), 10, "new ones arrive")
            assert set(from_last.by_id) == set(new)

            stamped = PushConsumer(
                cluster.nameserver_addresses,
                "group-from-time",
                consume_from=TIMESTAMP(newest + 1),
                **FAST,
            )
            stamped.subscribe(topic, from_time.handler("time"))
            await stamped.start()
            consumers.append(stamped)
            await cc.wait_for(lambda: from_time.received_all(new), 10, "new ones arrive")
            assert not set(from_time.by_id) & set(old)
        finally:
            for consumer in consumers:
                await consumer.close()
            await sender.close()

    run_async(scenario(), timeout_s=60)


def test_tag_filtered_subscriptions_get_only_their_tags(cluster: Cluster) -> None:
    topic, group = "Tagged", "group-tagged"

    async def scenario() -> None:
        await cluster.create_topic(topic, groups=["broker-b"], queues=1)
        sender = cc.Sender(cluster)
        deliveries = cc.Deliveries()
        consumer = PushConsumer(cluster.nameserver_addresses, group, **FAST)
        consumer.subscribe(topic, deliveries.handler("c"), tags="paid || shipped")
        try:
            await consumer.start()
            wanted = await sender.send(topic, [("broker-b", 0)], 10, tags="paid")
            await sender.send(topic, [("broker-b", 0)], 10, tags="created")
            wanted += await sender.send(topic, [("broker-b", 0)], 10, tags="shipped")
            await cc.wait_for(lambda: deliveries.received_all(wanted), 10, "tagged ones arrive")
            await cc.wait_for(
                lambda: (
                    (q := consumer.queue_state((topic, "broker-b", 0))) is not None
                    and q.committed == 30
                ),
                10,
                "the offset passes the filtered messages too",
            )
            assert set(deliveries.by_id) == set(wanted)
        finally:
            await consumer.close()
            await sender.close()

    run_async(scenario(), timeout_s=60)


async def _held_full(consumer: PushConsumer, key: QueueKey) -> ProcessQueue[QueueRoute]:
    """Start ``consumer`` (whose handler holds its messages) and return queue ``key``'s
    state once the queue holds its limit of unfinished messages."""
    await consumer.start()
    await cc.wait_for(
        lambda: (q := consumer.queue_state(key)) is not None and q.full,
        10,
        "the queue holds its limit of unfinished messages",
    )
    queue = consumer.queue_state(key)
    assert queue is not None
    return queue


def test_a_backlog_drains_within_the_in_flight_limit_and_commits_its_end(
    cluster: Cluster,
) -> None:
    """A pull's messages go to the handlers as one run; the queue's in-flight limit
    still stops the pulling while they are held, and every offset is committed after."""
    topic, group = "Backlog", "group-backlog"
    limit, batch, total = 40, 32, 300

    async def scenario() -> None:
        await cluster.create_topic(topic, groups=["broker-b"], queues=1)
        sender = cc.Sender(cluster)
        sent = await sender.send(topic, [("broker-b", 0)], total)
        release = asyncio.Event()
        seen: list[str] = []

        async def handle(message: Message) -> None:
            seen.append(message.msg_id)
            await release.wait()

        consumer = PushConsumer(
            cluster.nameserver_addresses, group, max_inflight_messages=limit, pull_batch_size=batch,
            concurrency=4, **FAST,
        )  # fmt: skip
        consumer.subscribe(topic, handle)
        key = (topic, "broker-b", 0)
        try:
            queue = await _held_full(consumer, key)
            # Pulled only while under the limit: at most one pull past it.
            assert limit <= queue.offsets.count < limit + batch
            assert consumer.stats.pulled == queue.offsets.count
            await cc.wait_for(lambda: len(seen) == 4, 10, "four handlers run")
            assert len(seen) == 4, "four handlers at once, whatever a pull returned"
            release.set()
            await cc.wait_for(lambda: len(seen) >= total, 20, "the backlog is handled")
            await cc.wait_for(lambda: queue.committed == total, 10, "its end is committed")
            assert sorted(seen) == sorted(sent)
            assert consumer.stats.handled == total
        finally:
            await consumer.close()
            await sender.close()

    run_async(scenario(), timeout_s=60)


def test_a_pull_asks_for_no_more_record_bytes_than_pull_batch_bytes(cluster: Cluster) -> None:
    """Behind, a pull stops at ``pull_batch_bytes`` before ``pull_batch_size`` messages."""
    topic, group, total = "PullBytes", "group-pull-bytes", 60

    async def scenario() -> None:
        await cluster.create_topic(topic, groups=["broker-b"], queues=1)
        sender = cc.Sender(cluster)
        await sender.send(topic, [("broker-b", 0)], total)
        release = asyncio.Event()
        sizes: list[int] = []

        async def handle(message: Message) -> None:
            sizes.append(message.size)
            await release.wait()

        # One message in flight is the limit: the first pull's messages are all it takes.
        budget = 1000
        consumer = PushConsumer(
            cluster.nameserver_addresses, group, max_inflight_messages=1, pull_batch_size=256,
            pull_batch_bytes=budget, **FAST,
        )  # fmt: skip
        consumer.subscribe(topic, handle)
        key = (topic, "broker-b", 0)
        try:
            queue = await _held_full(consumer, key)
            await cc.wait_for(lambda: bool(sizes), 10, "a handler runs")
            largest = max(sizes)
            assert budget - largest < queue.offsets.bytes <= budget < total * min(sizes)
            assert consumer.stats.pulled == queue.offsets.count
        finally:
            release.set()
            await consumer.close()
            await sender.close()

    run_async(scenario(), timeout_s=60)


def test_the_cli_tails_a_topic_shows_the_group_progress_and_resets_it(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    topic, group = "CliTail", "group-cli"
    ns = ["--nameserver", cluster.nameserver_addresses[0]]

    async def setup() -> list[str]:
        await cluster.create_topic(topic, groups=["broker-c"], queues=2)
        sender = cc.Sender(cluster)
        try:
            return await sender.send(topic, _queues(["broker-c"], 2), 10, tags="t")
        finally:
            await sender.close()

    sent = run_async(setup())
    capsys.readouterr()

    assert (
        cli.main(["consume", topic, "--group", group, "--count", "4", "--timeout", "20", *ns]) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    assert all(any(f"id={i}" in line for i in sent) for line in lines)
    assert all(" tags=t " in line for line in lines)

    assert cli.main(["progress", "--group", group, "--topic", topic, "--json", *ns]) == 0
    progress = json.loads(capsys.readouterr().out)
    # Only what was printed is committed: messages pulled past the count are not.
    assert sum(q["committed"] for q in progress["queues"]) == 4
    assert progress["total_lag"] == 6

    assert (
        cli.main(["reset-offsets", "--group", group, "--topic", topic, "--to-time", "0", *ns]) == 0
    )
    assert "AFTER" in capsys.readouterr().out
    assert cli.main(["progress", "--group", group, "--topic", topic, *ns]) == 0
    table = capsys.readouterr().out
    assert "total lag: 10" in table
    assert table.splitlines()[0].split() == ["BROKER", "QUEUE", "COMMITTED", "MAX", "OFFSET", "LAG"]


def test_a_reset_reaches_a_live_member_which_reads_again_and_never_commits_its_old_place(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """``metaq reset-offsets`` on a group with a running member: the member reads the
    queue again from the reset offset, and its old position (or anything it had in
    flight) is never committed back over the reset while messages keep flowing."""
    topic, group = "ResetLive", "group-reset-live"
    ns = ["--nameserver", cluster.nameserver_addresses[0]]
    hold_from = 3

    async def scenario() -> None:
        await cluster.create_topic(topic, groups=["broker-c"], queues=1)
        sender = cc.Sender(cluster)
        handled: dict[int, int] = {}
        release = asyncio.Event()

        async def handle(message: Message) -> None:
            seen = handled.get(message.queue_offset, 0)
            handled[message.queue_offset] = seen + 1
            if seen and message.queue_offset >= hold_from:
                await release.wait()  # the second reading stops here until released

        consumer = PushConsumer(cluster.nameserver_addresses, group, **FAST)
        consumer.subscribe(topic, handle)
        admin = Admin(cluster.nameserver_addresses)
        # The member's commit rounds, counted: each would carry its old position were it
        # still kept, so the check that it is never committed spans rounds, not seconds.
        rounds = 0
        commit = consumer.commit

        async def counted_commit() -> None:
            nonlocal rounds
            await commit()
            rounds += 1

        consumer.commit = counted_commit  # type: ignore[method-assign]

        async def committed() -> int | None:
            [row] = await admin.progress(group, topic)
            return row.offsets.committed

        try:
            await sender.send(topic, [("broker-c", 0)], 10)
            await consumer.start()
            await wait_until_async(
                lambda: _equals(committed(), 10), 20, "the member consumed and committed all 10"
            )

            code = await asyncio.to_thread(
                cli.main,
                ["reset-offsets", "-g", group, "-t", topic, "--to-time", "0", *ns],
            )
            assert code == 0
            told = capsys.readouterr().out
            assert "1 live member(s) told" in told and consumer.client_id in told, told
            # Messages keep flowing: the member's old position moves on and would be
            # committed again (RocketMQ's problem before resetOffsetByTime reached clients).
            await sender.send(topic, [("broker-c", 0)], 5)

            await cc.wait_for(
                lambda: handled.get(hold_from, 0) == 2, 20, "the member reads offset 3 again"
            )
            assert all(handled[o] == 2 for o in range(hold_from)), handled
            assert consumer.stats.offset_resets == 1
            # Held at offset 3 on its second reading: the group's offset stays there after
            # each of ten commit rounds, neither back at 10 nor at the 15 the old place
            # led to.
            checked, enough = rounds, rounds + 10

            async def held_over_ten_rounds() -> bool:
                nonlocal checked
                if rounds == checked:
                    return False
                checked = rounds
                assert await committed() == hold_from
                return rounds >= enough

            await wait_until_async(
                held_over_ten_rounds, 20, "ten commit rounds pass with the offset held"
            )

            release.set()
            await wait_until_async(
                lambda: _equals(committed(), 15), 20, "the member goes on to the end"
            )
            assert sorted(handled) == list(range(15))
            assert all(handled[o] == 2 for o in range(10)), handled
        finally:
            release.set()
            await consumer.close()
            await admin.close()
            await sender.close()

    run_async(scenario(), timeout_s=90)


async def _equals(value: Awaitable[int | None], expected: int) -> bool:
    return await value == expected


def test_commits_and_pulls_from_before_a_reset_are_refused_and_told_the_new_offset(
    cluster: Cluster,
) -> None:
    """The broker's side of a reset: a commit or a pull carrying an older reset
    generation stores nothing; the pull is answered OFFSET_RESET with the new offset
    and generation, at once even when it was parked at the queue's end."""
    topic, group = "ResetRules", "group-reset-rules"

    async def scenario() -> None:
        await cluster.create_topic(topic, groups=["broker-c"], queues=1)
        sender = cc.Sender(cluster)
        await sender.send(topic, [("broker-c", 0)], 5)
        await sender.close()
        async with (
            PullConsumer(cluster.nameserver_addresses, group) as consumer,
            Admin(cluster.nameserver_addresses) as admin,
        ):
            [queue] = await consumer.queues(topic)
            before = (await consumer.query(topic, queue)).reset_generation
            mine = {(topic, 0): before}
            await consumer.commit_many(queue.address, [(topic, 0, 5)], reset_generations=mine)
            assert await consumer.committed(topic, queue) == 5

            reset = await admin.reset_offsets(group, topic, 0)
            assert [(q.before, q.after) for q in reset.queues] == [(5, 0)]
            now = (await consumer.query(topic, queue)).reset_generation
            assert now > before

            # From the old position: neither stored...
            await consumer.commit_many(queue.address, [(topic, 0, 5)], reset_generations=mine)
            assert await consumer.committed(topic, queue) == 0
            # ...nor served: told where the group is now.
            told = await consumer.pull(topic, queue, 5, commit_offset=5, reset_generation=before)
            assert (told.status, told.next_offset, told.reset_generation) == (
                PullStatus.OFFSET_RESET, 0, now,
            )  # fmt: skip
            assert await consumer.committed(topic, queue) == 0
            # From the new one, as usual; and a commit without a generation (a tool's)
            # is never refused.
            found = await consumer.pull(topic, queue, 0, commit_offset=2, reset_generation=now)
            assert found.status is PullStatus.FOUND and len(found.messages) == 5
            assert await consumer.committed(topic, queue) == 2
            await consumer.commit(topic, queue, 4)
            assert await consumer.committed(topic, queue) == 4

            # A member waiting at the queue's end hears of the next reset at once.
            master_url = cluster.broker("broker-c").http_url

            async def parked_pulls() -> int:
                metrics = await admin.metrics(master_url)
                return int(metrics.get(("metaq_long_polls_parked", ()), 0))

            parked_before = await parked_pulls()
            parked = asyncio.ensure_future(
                consumer.pull(topic, queue, 5, timeout_s=30, reset_generation=now)
            )

            async def is_parked() -> bool:
                return await parked_pulls() > parked_before

            await wait_until_async(is_parked, 20, "the broker parks the pull at the end")
            assert not parked.done()
            await admin.reset_offsets(group, topic, 0)
            answer = await asyncio.wait_for(parked, 10)  # not its 30 s long poll
            assert answer.status is PullStatus.OFFSET_RESET and answer.next_offset == 0

    run_async(scenario(), timeout_s=60)
