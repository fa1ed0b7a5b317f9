"""TLS and users together on a real cluster (nameserver, master, slave; every listener on
TLS with client certificates, auth_enabled everywhere): a user produces and consumes
through a kill -9 of the master, and the login cookie of an HTTPS listener is Secure."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from metaq.client.admin import Admin, TopicSettings
from metaq.client.connection import BrokerConnection
from metaq.client.errors import ConnectionLost
from metaq.client.user_calls import UserSigningInterceptor
from metaq.common import acl
from metaq.common.acl import Acl, Grant, User
from metaq.common.tls import TlsConfig, grpc_channel
from metaq.common.users import Credentials, Verifier
from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1 import control_pb2_grpc
from metaq.testing import BrokerProcess
from metaq.testing.certs import Pki
from metaq.testing.nameserver_process import NameServerProcess, start_nameserver
from metaq.testing.tls_failover import produce_fail_over_and_read, role
from metaq.testing.waiting import run_async, wait_until

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


@pytest.fixture
def nameserver(pki: Pki, tmp_path: Path, acl_file: Path) -> Iterator[NameServerProcess]:
    server = start_nameserver(
        tmp_path / "ns", "--http-port", "0", *pki.server_flags(verify_client=True),
        "--auth-enabled", "true", "--auth-acl-file", str(acl_file),
    )  # fmt: skip
    try:
        yield server
    finally:
        server.stop()


async def controller_in_sync(address: str, tls: TlsConfig) -> list[int]:
    signing = [UserSigningInterceptor(ADMIN)]
    async with grpc_channel(address, tls, interceptors=signing) as channel:
        state = await control_pb2_grpc.NameServerStub(channel).GetControllerState(
            pb.GetControllerStateRequest(), timeout=5
        )
    return sorted(g.in_sync_ids for g in state.groups if g.broker_name == GROUP)[0] or []


def test_a_user_produces_and_consumes_through_failover_with_tls_and_auth_on(
    pki: Pki, tmp_path: Path, nameserver: NameServerProcess, acl_file: Path
) -> None:
    tls = pki.client_tls(with_cert=True)
    names = [nameserver.grpc_address]
    login = json.dumps({"access_key": ADMIN.access_key, "secret_key": ADMIN.secret_key})
    request = urllib.request.Request(
        f"https://{nameserver.http_address}/login", data=login.encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=5, context=tls.client_context()) as answer:
        cookie = answer.headers["Set-Cookie"]
    # Over HTTPS the browser must never send the session on a plain connection.
    assert "Secure" in cookie and "HttpOnly" in cookie, cookie

    auth = ("--set", "auth_enabled=true", "--set", f"auth_acl_file={acl_file}")
    brokers: dict[int, BrokerProcess] = {}
    try:
        for i in (0, 1):
            brokers[i] = BrokerProcess.start(
                tmp_path / f"broker-{i}", "--broker-name", GROUP, "--broker-id", str(i),
                "--nameserver", nameserver.grpc_address, *pki.server_flags(verify_client=True),
                *FAST, *auth, tls=tls,
            )  # fmt: skip
        wait_until(lambda: role(brokers[0]) == "master", 30, "broker 0 is master")
        # Credentials without TLS: the AUTH step cannot start, and the client says why.
        address = f"{brokers[0].data_host}:{brokers[0].data_port}"
        with pytest.raises(ConnectionLost, match=f"the broker at {address} speaks TLS"):
            run_async(BrokerConnection.open(address, credentials=APP))
        run_async(
            Admin(credentials=ADMIN, tls=tls).put_topic(
                brokers[0].http_url, TOPIC, TopicSettings(read_queues=2, write_queues=2)
            )
        )
        wait_until(
            lambda: run_async(controller_in_sync(names[0], tls)) == [0, 1],
            30, "the controller has the slave in sync (it fetches over TLS with the secret)",
            poll_s=0.2,
        )  # fmt: skip

        produce_fail_over_and_read(
            names, TOPIC, "readers", tls, brokers[0], brokers[1], 100, 50, APP
        )
    finally:
        for broker in brokers.values():
            broker.kill()
