"""Users across a real cluster with auth_enabled: gRPC, HTTP, produce and consume.

Before auth any client reaching the nameserver got every route and the cluster's
layout, and anyone reaching a broker's or nameserver's HTTP port could create and delete
topics or move masters.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from metaq.client.message import Message
from metaq.client.producer import Producer
from metaq.client.push_consumer import PushConsumer
from metaq.client.routes import NameServerError, RouteCache
from metaq.common import acl
from metaq.common.acl import Acl, Grant, User
from metaq.common.users import Credentials, Verifier, credentials_text
from metaq.testing import BrokerProcess
from metaq.testing.cluster import ClusterBuilder
from metaq.testing.http_signing import http_json, signed_for
from metaq.testing.nameserver_process import NameServerProcess
from metaq.testing.waiting import TEST_CLUSTER_SECRET, run_async, wait_until_async

ADMIN = Credentials("admin", "admin-secret-key-for-the-cluster-tests")
APP1 = Credentials("app1", "app1-secret-key-for-the-cluster-tests")


@dataclass
class AuthCluster:
    root: Path
    nameserver: NameServerProcess
    broker: BrokerProcess
    admin_file: Path

    @property
    def nameservers(self) -> list[str]:
        return [self.nameserver.grpc_address]


def write_acl(path: Path) -> None:
    table = Acl()
    for credentials in (ADMIN, APP1):
        key = credentials.access_key
        table = table.with_user(User(key, Verifier.make(key, credentials.secret_key)))
    table = table.grant("admin", Grant("admin", "cluster"))
    for perm, resource in (("pub", "topic:A"), ("sub", "topic:A"), ("sub", "group:g1")):
        table = table.grant("app1", Grant.parse(perm, resource))
    acl.save(path, table)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthCluster]:
    root = tmp_path_factory.mktemp("auth-cluster")
    acl_file = root / "acl.json"
    write_acl(acl_file)
    admin_file = root / "admin.credentials"
    admin_file.write_text(credentials_text(ADMIN))
    builder = ClusterBuilder(
        auth=True, acl_file=acl_file, admin=ADMIN, nameserver_args=("--http-port", "0")
    )
    with builder.start(root / "cluster") as started:
        nameserver = started.nameservers[0]
        done = _cli(
            "topic", "create", "A", "--queues", "2", "-n", nameserver.grpc_address,
            "--credentials-file", str(admin_file),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        yield AuthCluster(root, nameserver, started.broker("broker-a"), admin_file)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "metaq.client.cli", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_route_calls_need_a_user_with_a_grant_on_the_topic(cluster: AuthCluster) -> None:
    async def scenario() -> None:
        async with RouteCache(cluster.nameservers) as anonymous:
            with pytest.raises(NameServerError, match="requires a user's proof"):
                await anonymous.route("A")
        wrong = Credentials("app1", APP1.secret_key + "-wrong")
        async with RouteCache(cluster.nameservers, credentials=wrong) as routes:
            with pytest.raises(NameServerError, match="wrong secret key"):
                await routes.route("A")
        async with RouteCache(cluster.nameservers, credentials=APP1) as routes:
            route = await routes.route("A")
            assert route.write_queues
            with pytest.raises(NameServerError, match="lacks pub and sub on topic B"):
                await routes.route("B")

    run_async(scenario())


def test_the_cli_without_credentials_is_refused_and_says_how_to_give_them(
    cluster: AuthCluster,
) -> None:
    done = _cli("cluster", "list", "-n", cluster.nameserver.grpc_address)
    assert done.returncode == 1
    assert "access_key" in done.stderr, done.stderr
    done = _cli(
        "cluster", "list", "-n", cluster.nameserver.grpc_address,
        "--credentials-file", str(cluster.admin_file),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "broker-a" in done.stdout


def test_http_admin_needs_an_admin_user_and_refuses_replays(cluster: AuthCluster) -> None:
    broker_topics = f"{cluster.broker.http_url}/topics"
    ns_cluster = f"http://{cluster.nameserver.http_address}/cluster"
    for url in (broker_topics, ns_cluster):
        status, body, _ = http_json(url)
        assert status == 401, (url, body)
        assert "log in at /login" in str(body["error"])
    assert http_json(f"{cluster.broker.http_url}/health")[0] == 200
    assert http_json(f"http://{cluster.nameserver.http_address}/health")[0] == 200

    headers = signed_for(broker_topics, "GET", credentials=ADMIN)
    status, body, _ = http_json(broker_topics, headers=headers)
    assert status == 200, body
    status, body, _ = http_json(broker_topics, headers=headers)  # the same request again
    assert status == 401 and "replay" in str(body["error"])
    wrong = Credentials("admin", ADMIN.secret_key + "-wrong")
    status, body, _ = http_json(
        ns_cluster, headers=signed_for(ns_cluster, "GET", credentials=wrong)
    )
    assert status == 401, body
    status, body, _ = http_json(ns_cluster, headers=signed_for(ns_cluster, "GET", credentials=APP1))
    assert status == 403
    assert "user app1 lacks admin on cluster" in str(body["error"])
    # A signature covers the method and path: taken to another route it is worthless.
    delete = f"{cluster.broker.http_url}/topics/A"
    moved = signed_for(f"{cluster.broker.http_url}/topics/B", "GET", credentials=ADMIN)
    status, _, _ = http_json(delete, "DELETE", moved)
    assert status == 401
    # /metrics stays open to scrapers and counts the refusals.
    with urllib.request.urlopen(f"http://{cluster.nameserver.http_address}/metrics") as r:
        scraped = r.read().decode()
    denied = [line for line in scraped.splitlines() if "auth_denied_total{" in line]
    assert any(
        line.startswith('metaq_auth_denied_total{reason="permission"} ')
        and float(line.split()[-1]) >= 1
        for line in denied
    ), denied


def test_login_sets_a_strict_http_only_cookie_and_refuses_cross_site_changes(
    cluster: AuthCluster,
) -> None:
    base = f"http://{cluster.nameserver.http_address}"
    json_type = {"Content-Type": "application/json"}
    wrong = json.dumps({"access_key": "admin", "secret_key": "nope-nope-nope-nope"}).encode()
    assert http_json(f"{base}/login", "POST", json_type, wrong)[0] == 401
    login = json.dumps({"access_key": "admin", "secret_key": ADMIN.secret_key}).encode()
    status, _, headers = http_json(f"{base}/login", "POST", json_type, login)
    assert status == 200
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Max-Age=" in cookie
    session = {"Cookie": cookie.split(";", 1)[0]}
    assert http_json(f"{base}/cluster", headers=session)[0] == 200
    cross_site = {**session, **json_type, "Origin": "http://evil.example"}
    status, body, _ = http_json(f"{base}/cluster", "POST", cross_site, b"{}")
    assert status == 403 and "CSRF" in str(body["error"])


def test_produce_and_consume_with_auth(cluster: AuthCluster) -> None:
    got: list[bytes] = []

    async def scenario() -> None:
        async with Producer(cluster.nameservers, credentials=APP1) as producer:
            for i in range(20):
                await producer.send("A", f"m{i}".encode())
        consumer = PushConsumer(cluster.nameservers, "g1", credentials=APP1)

        async def handle(message: Message) -> None:
            got.append(message.body)

        consumer.subscribe("A", handle)
        await consumer.start()
        try:

            async def all_in() -> bool:
                return len(set(got)) == 20

            await wait_until_async(all_in, 20, "the consumer got all 20 messages")
        finally:
            await consumer.close()

    run_async(scenario(), timeout_s=60)


def test_no_secret_reaches_any_log(cluster: AuthCluster) -> None:
    logs = cluster.broker.output + cluster.nameserver.output()
    for secret in (ADMIN.secret_key, APP1.secret_key, TEST_CLUSTER_SECRET):
        assert secret not in logs
    assert "refused" in logs  # the refusals above were logged, without the keys
