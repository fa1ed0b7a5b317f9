"""A replicated group with auth_enabled: the cluster's own traffic still flows (slaves
fetch, the controller fails over), users get through the failover, and strangers without
the cluster secret neither fetch the log nor take the group over."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from metaq.client.connection import BrokerConnection
from metaq.client.errors import BrokerError as ClientBrokerError
from metaq.client.message import Message
from metaq.client.producer import Producer
from metaq.client.push_consumer import PushConsumer
from metaq.common import acl
from metaq.common.acl import Acl, Grant, User
from metaq.common.auth import ENV_VAR
from metaq.common.errors import ErrorCode
from metaq.common.framing import FrameType
from metaq.common.users import Credentials, Verifier, credentials_text
from metaq.common.v1.data_pb2 import ReplicaFetchRequest
from metaq.testing import BrokerError, DataClient
from metaq.testing.cluster import Cluster, ClusterBuilder, Group
from metaq.testing.replica_group import GROUP
from metaq.testing.waiting import holds_for, run_async, wait_until, wait_until_async

pytestmark = pytest.mark.slow

ADMIN = Credentials("admin", "admin-secret-key-for-the-failover-tests")
APP1 = Credentials("app1", "app1-secret-key-for-the-failover-tests")
TOPIC = "A"


def _acl(path: Path) -> None:
    table = Acl()
    for c in (ADMIN, APP1):
        table = table.with_user(User(c.access_key, Verifier.make(c.access_key, c.secret_key)))
    table = table.grant("admin", Grant("admin", "cluster"))
    for perm, resource in (("pub", f"topic:{TOPIC}"), ("sub", f"topic:{TOPIC}"),
                           ("sub", "group:g1")):  # fmt: skip
        table = table.grant("app1", Grant.parse(perm, resource))
    acl.save(path, table)


@pytest.fixture
def group(tmp_path: Path, cluster_factory: Callable[[ClusterBuilder], Cluster]) -> Group:
    acl_file = tmp_path / "acl.json"
    _acl(acl_file)
    cluster = cluster_factory(
        ClusterBuilder(
            groups=(GROUP,), replicas=2, replication_mode="async", min_in_sync=1,
            auth=True, acl_file=acl_file, admin=ADMIN,
        )
    )  # fmt: skip
    admin_file = tmp_path / "admin.credentials"
    admin_file.write_text(credentials_text(ADMIN))
    done = subprocess.run(
        [sys.executable, "-m", "metaq.client.cli", "topic", "create", TOPIC, "--queues", "2",
         "-n", cluster.nameserver_addresses[0], "--credentials-file", str(admin_file)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    cluster.wait_in_sync(GROUP, [0, 1])
    cluster.wait_committed_in_sync(GROUP, [0, 1])
    return cluster.group(GROUP)


async def _produce(nameservers: list[str], first: int, count: int) -> None:
    async with Producer(nameservers, credentials=APP1) as producer:
        for i in range(first, first + count):
            await producer.send(TOPIC, b"m%03d" % i)


def test_produce_consume_and_failover_work_with_auth(group: Group) -> None:
    nameservers = group.nameserver_addresses
    run_async(_produce(nameservers, 0, 10))
    group.wait_caught_up(1)
    group.brokers[0].kill()
    assert group.master(30, other_than=0) == 1
    run_async(_produce(nameservers, 10, 10), timeout_s=60)
    got: set[bytes] = set()

    async def consume() -> None:
        consumer = PushConsumer(nameservers, "g1", credentials=APP1)

        async def handle(message: Message) -> None:
            got.add(message.body)

        consumer.subscribe(TOPIC, handle)
        await consumer.start()
        try:

            async def all_in() -> bool:
                return len(got) == 20

            await wait_until_async(all_in, 30, "every message, before and after failover")
        finally:
            await consumer.close()

    run_async(consume(), timeout_s=60)
    assert got == {b"m%03d" % i for i in range(20)}


def _fetch(broker_id: int) -> ReplicaFetchRequest:
    return ReplicaFetchRequest(
        broker_name=GROUP, broker_id=broker_id, epoch=1, offset=0, acked_offset=0,
        max_bytes=1 << 20, wait_ms=50, segment_bytes=4194304,
    )  # fmt: skip


def test_no_commitlog_for_strangers_nor_users_and_no_takeover_without_the_secret(
    group: Group,
) -> None:
    master = group.brokers[group.master()]

    async def fetch() -> None:
        stranger = await DataClient.connect(master.data_host, master.data_port)
        try:
            with pytest.raises(BrokerError) as refused:
                await stranger.request(FrameType.REPLICA_FETCH, _fetch(7))
            assert refused.value.code is ErrorCode.NO_PERMISSION
            assert "cluster secret" in str(refused.value)
        finally:
            await stranger.close()
        user = await BrokerConnection.open(
            f"{master.data_host}:{master.data_port}", credentials=ADMIN
        )
        try:
            with pytest.raises(ClientBrokerError, match="not for users"):
                await user.request(
                    FrameType.REPLICA_FETCH, _fetch(7).SerializeToString(), timeout_s=5
                )
        finally:
            await user.close()

    run_async(fetch())
    # A broker without the cluster secret claiming to be the group's master: its
    # nameserver session is refused, so it never joins, and the real master stays.
    # (It runs without auth itself: a server with auth_enabled refuses to start without
    # the secret, and an impostor configures whatever suits it.)
    forged = group.cluster.start_outsider(
        "forged", "--broker-name", GROUP, "--broker-id", "0", env={ENV_VAR: ""}
    )
    wait_until(lambda: "UNAUTHENTICATED" in forged.output, 20, "the forged broker is refused")
    holds_for(
        lambda: forged.health() is not None and forged.health()["role"] != "master"
        and group.master(5) in (0, 1),
        2.0,
        "the forged broker stays out",
    )  # fmt: skip
    groups = group.controller().groups
    control = next(g for g in groups if g.broker_name == GROUP)
    assert sorted(control.in_sync_ids) == [0, 1]


def test_an_admin_user_may_switch_the_master_over_and_others_may_not(
    group: Group, tmp_path: Path
) -> None:
    def switchover(credentials: Credentials, to: int) -> subprocess.CompletedProcess[str]:
        file = tmp_path / f"{credentials.access_key}.credentials"
        file.write_text(credentials_text(credentials))
        env = {k: v for k, v in os.environ.items() if k != ENV_VAR}  # no cluster secret
        return subprocess.run(
            [sys.executable, "-m", "metaq.client.cli", "cluster", "switchover", "--group", GROUP,
             "--to", str(to), "-n", group.nameserver_addresses[0],
             "--credentials-file", str(file)],
            capture_output=True, text=True, timeout=60, check=False, env=env,
        )  # fmt: skip

    master = group.master()
    other = 1 - master
    refused = switchover(APP1, other)
    assert refused.returncode == 1
    assert "lacks admin on cluster" in refused.stderr, refused.stderr
    assert group.master() == master
    moved = switchover(ADMIN, other)
    assert moved.returncode == 0, moved.stderr
    assert group.master(20, other_than=master) == other
