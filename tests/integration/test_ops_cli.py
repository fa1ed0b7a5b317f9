"""The operator's commands of ``metaq`` run as processes against a real cluster: consumer
groups, client connections, a message by queue offset, the controller, broker status
and live settings."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import sys
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from metaq.client import Admin, Producer
from metaq.client.admin import TopicSettings
from metaq.client.consumer import FIRST, PushConsumer
from metaq.client.message import Message
from metaq.testing import Cluster, ClusterBuilder
from metaq.testing.waiting import deadline, run_async, wait_until_async


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str


def _metaq_command() -> list[str]:
    script = Path(sys.executable).with_name("metaq")
    return [str(script)] if script.exists() else [sys.executable, "-m", "metaq.client.cli"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = ClusterBuilder(
        groups=("broker-a", "broker-b"), nameserver_args=("--http-port", "0")
    ).start(tmp_path_factory.mktemp("ops-cli-cluster"))
    try:
        yield started
    finally:
        started.stop()


async def metaq(cluster: Cluster, *args: str) -> Done:
    """``metaq ARGS`` as a process, awaited, so consumers in this loop keep heartbeating."""
    env = {**os.environ, "METAQ_NAMESERVERS": ",".join(cluster.nameserver_addresses)}
    process = await asyncio.create_subprocess_exec(
        *_metaq_command(), *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(deadline(60)):
        out, err = await process.communicate()
    assert process.returncode is not None
    return Done(process.returncode, out.decode(), err.decode())


def test_groups_are_listed_described_and_deleted_only_without_live_members(
    cluster: Cluster,
) -> None:
    handled: list[Message] = []

    async def handle(message: Message) -> None:
        handled.append(message)

    async def scenario() -> None:
        async with Admin(cluster.nameserver_addresses, timeout_s=10) as admin:
            await admin.create_topic("ops-orders", TopicSettings(1, 1))
            for system in ("%RETRY%ops-readers", "%DLQ%ops-readers"):
                await admin.create_topic(system, TopicSettings(1, 1), brokers=["broker-a"])
            async with Producer(cluster.nameserver_addresses) as producer:
                for i in range(4):
                    await producer.send("ops-orders", f"order {i}".encode())
            consumer = PushConsumer(
                cluster.nameserver_addresses, "ops-readers", consume_from=FIRST,
                client_id="reader-1",
            )  # fmt: skip
            consumer.subscribe("ops-orders", handle)
            async with consumer:

                async def all_committed() -> bool:
                    if len(handled) < 4:
                        return False
                    found = await admin.describe_group("ops-readers")
                    orders = [r for r in found.offsets if r.offset.topic == "ops-orders"]
                    return sum(r.offset.offset for r in orders) == 4 and found.lag == 0

                await wait_until_async(all_committed, 30, "ops-readers committed all four")

                listed = await metaq(cluster, "group", "list", "--json")
                assert listed.returncode == 0, listed.stderr
                [readers] = [g for g in json.loads(listed.stdout) if g["group"] == "ops-readers"]
                # The consumer reads its group's retry topic too.
                assert (readers["members"], readers["topics"], readers["lag"]) == (
                    ["reader-1"], ["%RETRY%ops-readers", "ops-orders"], 0,
                )  # fmt: skip

                described = await metaq(cluster, "group", "describe", "ops-readers")
                assert described.returncode == 0, described.stderr
                assert "reader-1" in described.stdout
                assert "ops-orders (*)" in described.stdout
                assert "broker-a" in described.stdout.split()
                as_json = json.loads(
                    (await metaq(cluster, "group", "describe", "ops-readers", "--json")).stdout
                )
                assert [m["client_id"] for m in as_json["members"]] == ["reader-1"]
                orders = [o for o in as_json["offsets"] if o["topic"] == "ops-orders"]
                assert sum(o["offset"] for o in orders) == 4
                assert {o["broker"] for o in orders} <= {"broker-a", "broker-b"}

                refused = await metaq(cluster, "group", "delete", "ops-readers")
                assert refused.returncode == 1
                assert "has live members (reader-1)" in refused.stderr
                assert "force" in refused.stderr
                kept = (await admin.describe_group("ops-readers")).offsets
                assert sum(r.offset.offset for r in kept if r.offset.topic == "ops-orders") == 4
                per_broker = Counter(r.broker_name for r in kept)

            deleted = await metaq(
                cluster, "group", "delete", "ops-readers", "--retry-topic", "--dlq-topic"
            )
            assert deleted.returncode == 0, deleted.stderr
            forgotten = ", ".join(f"{b}: {n}" for b, n in sorted(per_broker.items()))
            assert f"offsets forgotten ({forgotten})" in deleted.stdout
            assert "topic %RETRY%ops-readers: deleted from broker-a" in deleted.stdout
            topics = {t.topic for t in await admin.list_topics()}
            assert not topics & {"%RETRY%ops-readers", "%DLQ%ops-readers"}
            listed = await metaq(cluster, "group", "list", "--json")
            assert "ops-readers" not in [g["group"] for g in json.loads(listed.stdout)]

            unknown = await metaq(cluster, "group", "describe", "ops-readers")
            assert unknown.returncode == 1
            assert "no consumer group 'ops-readers'" in unknown.stderr
            unknown = await metaq(cluster, "group", "delete", "no-such-group")
            assert unknown.returncode == 1
            assert "no consumer group 'no-such-group'" in unknown.stderr

    run_async(scenario(), timeout_s=120)
    assert sorted(m.body for m in handled) == [f"order {i}".encode() for i in range(4)]


def test_connections_list_consumers_and_producers_with_what_they_say_they_are(
    cluster: Cluster,
) -> None:
    version = importlib.metadata.version("metaq-client")

    async def ignore(_message: Message) -> None:
        return None

    async def scenario() -> None:
        async with Admin(cluster.nameserver_addresses, timeout_s=10) as admin:
            await admin.create_topic("ops-conn", TopicSettings(1, 1))
        consumer = PushConsumer(
            cluster.nameserver_addresses, "ops-watchers", client_id="watcher-1",
            computer_room="room-y",
        )  # fmt: skip
        consumer.subscribe("ops-conn", ignore, tags="a || b")
        producer = Producer(
            cluster.nameserver_addresses, group="ops-writers", client_id="writer-1",
            computer_room="room-x",
        )  # fmt: skip
        async with consumer, producer:
            await producer.send("ops-conn", b"hello")

            everyone = await metaq(cluster, "connections", "--json")
            assert everyone.returncode == 0, everyone.stderr
            found = json.loads(everyone.stdout)
            [watcher] = [c for c in found["consumers"] if c["client_id"] == "watcher-1"]
            assert watcher["group"] == "ops-watchers"
            assert (watcher["host"], watcher["computer_room"]) == ("127.0.0.1", "room-y")
            assert (watcher["client_version"], watcher["language"]) == (version, "python")
            assert ["ops-conn", "a || b"] in watcher["subscriptions"]
            assert watcher["brokers"] == ["broker-a", "broker-b"]
            [writer] = [p for p in found["producers"] if p["client_id"] == "writer-1"]
            assert (writer["group"], writer["host"], writer["computer_room"]) == (
                "ops-writers", "127.0.0.1", "room-x",
            )  # fmt: skip
            assert (writer["client_version"], writer["language"]) == (version, "python")
            assert writer["brokers"]

            writers = json.loads((await metaq(cluster, "connections", "-g", "ops-writers",
                                              "--json")).stdout)  # fmt: skip
            assert [c["client_id"] for c in writers["consumers"]] == []
            assert [p["client_id"] for p in writers["producers"]] == ["writer-1"]
            readers = await metaq(cluster, "connections", "--topic", "ops-conn")
            assert readers.returncode == 0, readers.stderr
            assert "watcher-1" in readers.stdout
            assert "producers: none" in readers.stdout

        async def writer_gone() -> bool:
            async with Admin(cluster.nameserver_addresses, timeout_s=10) as admin:
                found = await admin.connections()
            return all(p.client_id != "writer-1" for p, _ in found.producers)

        await wait_until_async(writer_gone, 30, "the closed producer is no longer listed")
        unknown = await metaq(cluster, "connections", "-g", "no-such-group")
        assert unknown.returncode == 1
        assert "no consumer group 'no-such-group'" in unknown.stderr
        unknown = await metaq(cluster, "connections", "-t", "no-such-topic")
        assert unknown.returncode == 1
        assert "no-such-topic" in unknown.stderr

    run_async(scenario(), timeout_s=120)


def test_query_offset_prints_the_message_stored_at_a_queue_offset(cluster: Cluster) -> None:
    async def scenario() -> None:
        async with Admin(cluster.nameserver_addresses, timeout_s=10) as admin:
            await admin.create_topic("ops-at", TopicSettings(1, 1), brokers=["broker-a"])
            await admin.create_topic("ops-at-both", TopicSettings(1, 1))
        async with Producer(cluster.nameserver_addresses) as producer:
            sent = [await producer.send("ops-at", f"message {i}".encode()) for i in range(3)]

        found = await metaq(cluster, "query", "offset", "ops-at", "0", "1", "--json")
        assert found.returncode == 0, found.stderr
        message = json.loads(found.stdout)
        assert (message["body"], message["queue_offset"]) == ("message 1", 1)
        assert message["msg_id"] == sent[1].msg_id
        shown = await metaq(cluster, "query", "offset", "ops-at", "0", "2", "-b", "broker-a")
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.rstrip().endswith("message 2")

        past = await metaq(cluster, "query", "offset", "ops-at", "0", "7")
        assert past.returncode == 1
        assert "no message at offset 7 of ops-at/broker-a/0: the queue holds offsets [0, 3)" in (
            past.stderr
        )
        ambiguous = await metaq(cluster, "query", "offset", "ops-at-both", "0", "0")
        assert ambiguous.returncode == 1
        assert "served by broker groups broker-a, broker-b: name one (--broker)" in (
            ambiguous.stderr
        )
        no_queue = await metaq(cluster, "query", "offset", "ops-at", "3", "0")
        assert no_queue.returncode == 1
        assert "has no readable queue 3 (its queue ids: 0)" in no_queue.stderr
        bad = await metaq(cluster, "query", "offset", "ops-at", "zero", "0")
        assert bad.returncode == 2
        assert "not 'zero'" in bad.stderr
        unknown = await metaq(cluster, "query", "offset", "no-such-topic", "0", "0")
        assert unknown.returncode == 1
        assert "no-such-topic" in unknown.stderr

    run_async(scenario(), timeout_s=90)


def test_controller_status_and_a_dead_broker_kept_in_the_cluster_list_as_down(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    ha = cluster_factory(ClusterBuilder(groups=("ops-ha",), nameservers=2, replicas=2))
    ha.wait_in_sync("ops-ha", [0, 1], 60)

    async def scenario() -> None:
        found: dict[str, Any] = {}

        async def both_in_sync() -> bool:
            # The master counts the slave in sync before the controller commits it, and the
            # nameserver the CLI asks may apply that commit a moment after the leader.
            status = await metaq(ha, "controller", "status", "--json")
            assert status.returncode == 0, status.stderr
            found.update(json.loads(status.stdout))
            return [g["in_sync_ids"] for g in found["groups"]] == [[0, 1]]

        await wait_until_async(both_in_sync, 60, "controller status shows 0 and 1 in sync")
        raft_addresses = [address for address, _ in found["members"]]
        assert len(raft_addresses) == 2
        assert found["leader"] in raft_addresses
        assert found["has_quorum"] is True
        assert all(connected for _, connected in found["members"])
        [group] = found["groups"]
        # The controller elects whichever broker it hears from first.
        master = group["master_id"]
        assert master in (0, 1)
        assert (group["broker_name"], group["in_sync_ids"]) == ("ops-ha", [0, 1])
        assert group["epoch"] >= 1
        shown = await metaq(ha, "controller", "status")
        assert shown.returncode == 0, shown.stderr
        assert "ops-ha" in shown.stdout and "raft leader:" in shown.stdout

        slave = 1 - master
        ha.broker("ops-ha", slave).kill()
        expected = sorted([(master, False), (slave, True)])

        async def slave_down() -> bool:
            listed = await metaq(ha, "cluster", "list", "--json")
            brokers = json.loads(listed.stdout)["brokers"]
            return sorted((b["broker_id"], b["down"]) for b in brokers) == expected

        await wait_until_async(slave_down, 60, "the killed slave is listed down")
        table = await metaq(ha, "cluster", "list")
        rows = [line.split() for line in table.stdout.splitlines()[1:]]
        shown_rows = sorted((int(row[2]), row[4]) for row in rows)
        assert shown_rows == sorted([(master, "up"), (slave, "down")])

    run_async(scenario(), timeout_s=120)


def test_broker_status_and_live_settings_that_are_applied_kept_and_refused(
    cluster: Cluster,
) -> None:
    async def scenario() -> None:
        listed = await metaq(cluster, "broker", "status", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = {row["broker"]: row for row in json.loads(listed.stdout)}
        assert rows["broker-a/0"]["status"] == rows["broker-b/0"]["status"] == "ok"
        one = await metaq(cluster, "broker", "status", "broker-a")
        assert one.returncode == 0, one.stderr
        assert "broker_name:" in one.stdout and "retention_hours:" in one.stdout
        unknown = await metaq(cluster, "broker", "status", "broker-z/0")
        assert unknown.returncode == 1
        assert "no broker broker-z/0 is registered (brokers: broker-a/0, broker-b/0)" in (
            unknown.stderr
        )

        changed = await metaq(cluster, "broker", "config", "set", "broker-a",
                              "store.retention_hours", "12")  # fmt: skip
        assert changed.returncode == 0, changed.stderr
        assert "broker-a/0: store.retention_hours = 12.0" in changed.stdout
        async with Admin(cluster.nameserver_addresses, timeout_s=10) as admin:
            health = await admin.health(await admin.broker("broker-a"))
            assert health.retention_hours == 12.0  # in effect at once
            other = await admin.health(await admin.broker("broker-b"))
            assert other.retention_hours != 12.0
        shown = await metaq(cluster, "broker", "config", "get", "broker-a/0", "--json")
        settings = json.loads(shown.stdout)
        assert settings["settings"]["store.retention_hours"] == 12.0
        assert settings["changed_live"] == {"store.retention_hours": 12.0}
        assert set(settings["settings"]) >= {
            "store.disk_full_ratio", "store.disk_reserve_bytes", "store.flush_interval_ms",
            "cold_read_bytes_per_s", "log_level",
        }  # fmt: skip

        for args, error in [
            (("data_port", "1"), "data_port cannot be changed on a running broker: set it "
                                 "in the broker's config file and restart it"),
            (("no_such", "1"), "the broker has no setting 'no_such'"),
            (("store.retention_hours", "soon"), "takes float values, not 'soon'"),
            (("store.disk_full_ratio", "0.5"), "disk_clean_ratio <= disk_force_clean_ratio"),
            (("cold_read_bytes_per_s", "10"), "cold_read_bytes_per_s must be 0"),
        ]:  # fmt: skip
            refused = await metaq(cluster, "broker", "config", "set", "broker-a", *args)
            assert refused.returncode == 1, args
            assert error in refused.stderr, refused.stderr

        cluster.broker("broker-a").terminate()
        restarted = cluster.start_broker("broker-a").health()
        assert restarted is not None
        assert restarted["retention_hours"] == 12.0  # kept across the restart

    run_async(scenario(), timeout_s=120)


def test_servers_export_their_build_version_and_no_created_series(cluster: Cluster) -> None:
    nameserver = cluster.nameservers[0].http_address
    assert nameserver, "the nameserver serves no HTTP"
    texts = {
        "broker": urllib.request.urlopen(f"{cluster.broker('broker-b').http_url}/metrics"),
        "nameserver": urllib.request.urlopen(f"http://{nameserver}/metrics"),
    }
    for component, answer in texts.items():
        with answer:
            families = list(text_string_to_metric_families(answer.read().decode()))
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in families for s in f.samples}  # fmt: skip
        version = importlib.metadata.version(f"metaq-{component}")
        build = ("metaq_build_info", (("component", component), ("version", version)))
        assert samples[build] == 1, component
        assert any(name.endswith("_total") for name, _ in samples), component
        created = sorted({name for name, _ in samples if name.endswith("_created")})
        assert created == [], f"{component} exports {created}"
