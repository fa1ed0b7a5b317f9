"""The admin library against a real cluster: a nameserver and two broker masters."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from metaq.client import Admin, AdminError, BrokerAdminError, BrokerUnreachable, Producer
from metaq.client.admin import TopicExists, TopicMissing, TopicSettings, TopicSettingsError
from metaq.testing import Cluster, ClusterBuilder
from metaq.testing.waiting import run_async


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = ClusterBuilder(groups=("broker-a", "broker-b")).start(
        tmp_path_factory.mktemp("admin-cluster")
    )
    try:
        yield started
    finally:
        started.stop()


def test_a_topic_is_created_routed_updated_listed_and_deleted(cluster: Cluster) -> None:
    async def scenario() -> None:
        async with Admin(cluster.nameserver_addresses, timeout_s=10) as admin:
            placed = await admin.create_topic("adm-orders", TopicSettings(2, 2))
            assert sorted(p.broker.broker_name for p in placed) == ["broker-a", "broker-b"]
            route = await admin.route("adm-orders", refresh=True)
            assert len(route.write_queues) == 4

            with pytest.raises(TopicExists, match="already exists on broker-a"):
                await admin.create_topic("adm-orders", brokers=["broker-a"])
            with pytest.raises(TopicSettingsError) as refused:
                await admin.update_topic("adm-orders", write_queues=0)
            assert refused.value.field == "write_queues"

            updated = await admin.update_topic("adm-orders", write_queues=3, brokers=["broker-b"])
            assert [p.settings for p in updated] == [TopicSettings(2, 3)]
            route = await admin.route("adm-orders", refresh=True)
            assert len(route.write_queues) == 5  # waited on: the nameserver routes it

            listed = [t for t in await admin.list_topics() if t.topic == "adm-orders"]
            assert [(t.group, t.settings.write_queues) for t in listed] == [
                ("broker-a", 2),
                ("broker-b", 3),
            ]
            assert await admin.delete_topic("adm-orders") == ["broker-a", "broker-b"]
            with pytest.raises(AdminError, match="does not exist on any chosen broker"):
                await admin.delete_topic("adm-orders")
            with pytest.raises(TopicMissing):
                await admin.update_topic("adm-orders", perm="read", wait=False)

    run_async(scenario(), timeout_s=60)


def test_messages_are_found_by_id_and_key_and_offsets_reset(cluster: Cluster) -> None:
    async def scenario() -> None:
        async with Admin(cluster.nameserver_addresses, timeout_s=10) as admin:
            await admin.create_topic("adm-lookups", TopicSettings(1, 1), brokers=["broker-a"])
            before_ms = int(time.time() * 1000)
            async with Producer(cluster.nameserver_addresses) as producer:
                sent = [
                    await producer.send("adm-lookups", f"body {i}".encode(), keys=("k-7",))
                    for i in range(3)
                ]

            found = await admin.message_by_id(sent[1].msg_id)
            assert (found.body, found.broker_name, found.queue_offset) == ("body 1", "broker-a", 1)
            by_key = await admin.messages_by_key("adm-lookups", "k-7")
            assert {m.msg_id for m in by_key} == {s.msg_id for s in sent}
            with pytest.raises(AdminError, match="no broker holds message"):
                await admin.message_by_id("00" * 16)

            [stats] = await admin.topic_stats("adm-lookups")
            assert (stats.min_offset, stats.max_offset, stats.messages) == (0, 3, 3)
            [progress] = await admin.progress("adm-readers", "adm-lookups")
            assert (progress.offsets.committed, progress.lag) == (None, 3)
            reset = await admin.reset_offsets("adm-readers", "adm-lookups", before_ms)
            [queue] = reset.queues
            assert (queue.before, queue.after) == (None, 0)
            assert (reset.live_members, reset.unreplicated) == ([], [])
            [progress] = await admin.progress("adm-readers", "adm-lookups")
            assert (progress.offsets.committed, progress.lag) == (0, 3)

            broker = cluster.broker("broker-a").http_url
            committed = await admin.consumer_offsets(broker)
            assert any(c.group == "adm-readers" and c.lag == 3 for c in committed), committed

    run_async(scenario(), timeout_s=60)


def test_one_broker_is_asked_without_nameservers(cluster: Cluster) -> None:
    broker = cluster.broker("broker-b").http_url

    health = run_async(Admin().health(broker))
    assert health.writable and health.role == "master" and health.broker_name == "broker-b"
    samples = run_async(Admin().metrics(broker))
    assert any(name.startswith("metaq_") for name, _labels in samples)

    with pytest.raises(BrokerAdminError) as refused:
        run_async(Admin().put_topic(broker, "adm-bad", TopicSettings(perm="sideways")))
    assert refused.value.status == 400 and "perm must be one of" in refused.value.detail
    assert not refused.value.retriable
    with pytest.raises(AdminError, match="without nameservers"):
        run_async(Admin().cluster())


def test_a_broker_that_does_not_listen_is_unreachable_and_retriable() -> None:
    with pytest.raises(BrokerUnreachable, match="cannot reach broker admin API at") as caught:
        run_async(Admin(timeout_s=2).health("127.0.0.1:1"))
    assert caught.value.retriable and caught.value.status == 0
