"""TLS and users together on a real cluster (nameserver, master, slave; every listener on
TLS with client certificates, auth_enabled everywhere): a user produces and consumes
through a kill -9 of the master, and the login cookie of an HTTPS listener is Secure."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from metaq.client.connection import BrokerConnection
from metaq.client.errors import ConnectionLost
from metaq.common import acl
from metaq.common.acl import Acl, Grant, User
from metaq.common.users import Credentials, Verifier
from metaq.testing.cluster import Cluster, ClusterBuilder
from metaq.testing.tls_failover import produce_fail_over_and_read
from metaq.testing.waiting import run_async

GROUP = "broker-tls-auth"
TOPIC = "secured-orders"
ADMIN = Credentials("admin", "admin-secret-key-for-the-tls-auth-test")
APP = Credentials("app1", "app1-secret-key-for-the-tls-auth-test")
# Quick to leave the in-sync set and to time a send out, so that failover is quick too.
FAST = ("--set", "replica_lag_max_ms=2000", "--set", "replication_timeout_ms=1000")


@pytest.fixture
def acl_file(tmp_path: Path) -> Path:
    table = Acl()
    for c in (ADMIN, APP):
        table = table.with_user(User(c.access_key, Verifier.make(c.access_key, c.secret_key)))
    table = table.grant("admin", Grant("admin", "cluster"))
    for perm, resource in (("pub", f"topic:{TOPIC}"), ("sub", f"topic:{TOPIC}"),
                           ("sub", "group:readers")):  # fmt: skip
        table = table.grant("app1", Grant.parse(perm, resource))
    path = tmp_path / "acl.json"
    acl.save(path, table)
    return path


def test_a_user_produces_and_consumes_through_failover_with_tls_and_auth_on(
    acl_file: Path, cluster_factory: Callable[[ClusterBuilder], Cluster]
) -> None:
    cluster = cluster_factory(
        ClusterBuilder(
            groups=(GROUP,), replicas=2, tls=True, verify_client=True, auth=True,
            acl_file=acl_file, admin=ADMIN, nameserver_args=("--http-port", "0"),
            broker_args=FAST,
        )
    )  # fmt: skip
    tls = cluster.tls
    assert tls is not None
    login = json.dumps({"access_key": ADMIN.access_key, "secret_key": ADMIN.secret_key})
    request = urllib.request.Request(
        f"https://{cluster.nameservers[0].http_address}/login", data=login.encode(),
        method="POST", headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=5, context=tls.client_context()) as answer:
        cookie = answer.headers["Set-Cookie"]
    # Over HTTPS the browser must never send the session on a plain connection.
    assert "Secure" in cookie and "HttpOnly" in cookie, cookie

    master_id = cluster.master_id(GROUP, 30)
    master, slave = cluster.broker(GROUP, master_id), cluster.broker(GROUP, 1 - master_id)
    # Credentials without TLS: the AUTH step cannot start, and the client says why.
    address = f"{master.data_host}:{master.data_port}"
    with pytest.raises(ConnectionLost, match=f"the broker at {address} speaks TLS"):
        run_async(BrokerConnection.open(address, credentials=APP))
    run_async(cluster.create_topic(TOPIC, queues=2))
    # The slave fetches over TLS with the cluster secret.
    cluster.wait_committed_in_sync(GROUP, [0, 1], 30)

    produce_fail_over_and_read(
        cluster.nameserver_addresses, TOPIC, "readers", tls, master, slave, 100, 50, APP
    )
