"""The cluster's users and grants go from the nameservers to every broker: two
nameservers agreeing through Raft, two broker groups, each server with an ACL file of its
own (no shared file, nothing copied by hand).

A change committed at one nameserver (``PUT /acl``, as ``metaq acl`` and the console
make it) is enforced by every broker within a few heartbeats and kept in its file; a
broker that joins with an old file gets the new ACL; a broker restarted while no
nameserver answers starts with the ACL it was last given.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from metaq.client.admin import AclConflict, Admin
from metaq.client.connection import BrokerConnection
from metaq.client.errors import BrokerError
from metaq.common import acl
from metaq.common.acl import Acl, Grant, User
from metaq.common.framing import FrameType
from metaq.common.record import encode
from metaq.common.users import Credentials, Verifier
from metaq.common.v1.data_pb2 import SendRequest, SendResponse
from metaq.testing import BrokerProcess, Cluster, ClusterBuilder
from metaq.testing.cluster import broker_node, nameserver_node
from metaq.testing.waiting import run_async, wait_until

ADMIN = Credentials("acl-admin", "acl-admin-secret-key-for-the-tests")
APP = Credentials("acl-app", "acl-app-secret-key-for-the-tests")
LATE = Credentials("acl-late", "acl-late-secret-key-for-the-tests")
GROUPS = ("acl-a", "acl-b")
TOPIC = "guarded"


def _user(who: Credentials) -> User:
    return User(who.access_key, Verifier.make(who.access_key, who.secret_key))


@dataclass
class Distributed:
    cluster: Cluster
    files: dict[str, Path]
    """Each server's own ACL file, by node name."""
    first: Acl

    @property
    def nameserver_http(self) -> str:
        return self.cluster.nameservers[0].http_address


@pytest.fixture(scope="module")
def distributed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Distributed]:
    root = tmp_path_factory.mktemp("acl-distribution")
    first = Acl().with_user(_user(ADMIN)).grant(ADMIN.access_key, Grant("admin", "cluster"))
    first = first.with_user(_user(APP))  # no grants yet
    shared = root / "first.json"
    acl.save(shared, first)
    nodes = [nameserver_node(i) for i in range(2)] + [broker_node(g, 0) for g in GROUPS]
    files = {node: root / f"{node}.json" for node in nodes}
    for path in files.values():
        shutil.copy(shared, path)
    node_args = {node: ("--auth-acl-file", str(files[node])) for node in nodes[:2]}
    node_args |= {node: ("--set", f"auth_acl_file={files[node]}") for node in nodes[2:]}
    builder = ClusterBuilder(
        nameservers=2, groups=GROUPS, auth=True, admin=ADMIN, acl_file=shared,
        nameserver_args=("--http-port", "0"), node_args=node_args,
    )  # fmt: skip
    with builder.start(root / "cluster") as started:
        run_async(started.create_topic(TOPIC, queues=1, timeout_s=30))
        yield Distributed(started, files, first)


async def _send(broker: BrokerProcess, who: Credentials) -> str:
    """What the broker says to ``who`` sending one message to :data:`TOPIC`."""
    address = f"{broker.data_host}:{broker.data_port}"
    header = SendRequest(topic=TOPIC, queue_id=0, record_count=1).SerializeToString()
    try:
        connection = await BrokerConnection.open(address, credentials=who)
    except BrokerError as exc:
        return f"refused: {exc.detail}"
    try:
        frame = await connection.request(
            FrameType.SEND, header, [encode(TOPIC, b"hello")], timeout_s=5
        )
    except BrokerError as exc:
        return f"refused: {exc.detail}"
    finally:
        await connection.close()
    return SendResponse.Status.Name(SendResponse.FromString(frame.header).status)


def _file_version(path: Path) -> int:
    version: int = json.loads(path.read_text())["version"]
    return version


def test_a_grant_made_at_one_nameserver_is_enforced_by_every_broker(
    distributed: Distributed,
) -> None:
    brokers = [distributed.cluster.broker(g) for g in GROUPS]
    for broker in brokers:
        answer = run_async(_send(broker, APP))
        assert answer.startswith("refused: user acl-app lacks pub on topic guarded"), answer

    async def grant() -> Acl:
        async with Admin(credentials=ADMIN) as admin:
            return await admin.change_cluster_acl(
                distributed.nameserver_http,
                lambda current: current.grant(APP.access_key, Grant("pub", f"topic:{TOPIC}")),
            )

    changed = run_async(grant())
    assert changed.version == distributed.first.version + 1
    for broker in brokers:
        wait_until(lambda b=broker: run_async(_send(b, APP)) == "OK", 30,
                   f"broker {broker.http_url} takes the granted send", poll_s=0.3)  # fmt: skip
    # Every server keeps the cluster's ACL in its own file, for its next start.
    for node, path in distributed.files.items():
        wait_until(lambda p=path: _file_version(p) == changed.version, 10,
                   f"{node}'s ACL file is at version {changed.version}", poll_s=0.2)  # fmt: skip
    assert "from the nameservers" in brokers[0].output


def test_a_change_made_on_a_stale_copy_is_refused_not_lost(distributed: Distributed) -> None:
    async def scenario() -> None:
        async with Admin(credentials=ADMIN) as admin:
            read = await admin.cluster_acl(distributed.nameserver_http)
            other = distributed.cluster.nameservers[1].http_address
            await admin.put_cluster_acl(
                other, read.with_user(_user(LATE)), read.version
            )  # someone else's change, at the other nameserver
            with pytest.raises(AclConflict, match="someone changed it meanwhile"):
                await admin.put_cluster_acl(
                    distributed.nameserver_http, read.without_user(APP.access_key), read.version
                )
            now = await admin.cluster_acl(distributed.nameserver_http)
            assert now.user(LATE.access_key) is not None and now.user(APP.access_key) is not None

    run_async(scenario())


def test_a_broker_joining_with_an_old_file_gets_the_clusters_acl(
    distributed: Distributed,
) -> None:
    """A new broker group, started with the first ACL file: the user added since (at the
    nameservers only) can send to it once it registered."""
    cluster = distributed.cluster
    own = distributed.files[broker_node(GROUPS[0], 0)].parent / "joiner.json"
    acl.save(own, distributed.first)

    async def grant_late() -> None:
        async with Admin(credentials=ADMIN) as admin:
            await admin.change_cluster_acl(
                distributed.nameserver_http,
                lambda current: current.grant(LATE.access_key, Grant("pub", f"topic:{TOPIC}")),
            )

    run_async(grant_late())
    joiner = cluster.start_broker(
        "acl-c", 0, "--set", f"auth_acl_file={own}", "--auto-create-topics"
    )
    wait_until(lambda: run_async(_send(joiner, LATE)) == "OK", 30,
               "the joining broker takes a send from the user it never had in its file",
               poll_s=0.3)  # fmt: skip
    assert acl.load(own).user(LATE.access_key) is not None


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "METAQ_ACCESS_KEY": ADMIN.access_key,
           "METAQ_SECRET_KEY": ADMIN.secret_key}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "metaq.client.cli", "acl", *args],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip


def test_the_cli_changes_the_clusters_acl_at_a_nameserver(distributed: Distributed) -> None:
    http = distributed.cluster.nameservers[1].http_address
    done = _cli("grant", APP.access_key, "sub", "group:billing", "--http", http)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ACL version ")
    listed = _cli("list", "--json", "--http", distributed.nameserver_http)
    assert listed.returncode == 0, listed.stderr
    users = {u["user"]: u["grants"] for u in json.loads(listed.stdout)["users"]}
    assert "sub group:billing" in users[APP.access_key], users
    # Every broker's own file has it, with nothing copied.
    path = distributed.files[broker_node(GROUPS[1], 0)]
    wait_until(lambda: Grant("sub", "group:billing") in (acl.load(path).user(APP.access_key)
               or _user(APP)).grants, 10, "the broker's file has the CLI's grant",
               poll_s=0.2)  # fmt: skip
    refused = _cli("grant", "nobody-here", "pub", "topic:x", "--http", http)
    assert refused.returncode != 0 and "there is no user nobody-here" in refused.stderr


def test_a_broker_restarted_without_nameservers_starts_with_the_acl_it_was_given(
    distributed: Distributed,
) -> None:
    cluster = distributed.cluster
    for nameserver in cluster.nameservers:
        nameserver.stop()
    group = GROUPS[1]
    cluster.broker(group).terminate()
    # No controller names it master while no nameserver answers: wait for it to be up.
    restarted = BrokerProcess.start(
        cluster.data_dir(group), *cluster.builder.broker_flags(cluster, group, 0),
        wait_for_master=False,
    )  # fmt: skip
    cluster.brokers[(group, 0)] = restarted
    # What it enforces is its own file, as it was last given: the user added at the
    # nameservers proves its key; one in no ACL does not.
    assert run_async(_handshake(restarted, LATE)) == "accepted"
    stranger = Credentials("acl-stranger", "acl-stranger-secret-key-for-tests")
    assert "unknown user" in run_async(_handshake(restarted, stranger))


async def _handshake(broker: BrokerProcess, who: Credentials) -> str:
    try:
        connection = await BrokerConnection.open(
            f"{broker.data_host}:{broker.data_port}", credentials=who
        )
    except BrokerError as exc:
        return f"refused: {exc.detail}"
    await connection.close()
    return "accepted"
