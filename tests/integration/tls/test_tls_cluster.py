"""A cluster with TLS on every listener (real nameserver and brokers, certificates made
by the test): the whole produce/consume/failover path, and what a client without the
right TLS settings is told."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from metaq.client.admin import Admin
from metaq.client.connection import BrokerConnection
from metaq.client.errors import ConnectionLost, NoNameServer
from metaq.common.framing import FrameType
from metaq.common.tls import TlsConfig
from metaq.testing import BrokerProcess
from metaq.testing.certs import Pki
from metaq.testing.cluster import Cluster, ClusterBuilder
from metaq.testing.nameserver_process import NameServerProcess, start_nameserver
from metaq.testing.tls_failover import produce_fail_over_and_read
from metaq.testing.waiting import run_async

GROUP = "broker-tls"
TOPIC = "orders"
QUEUES = 2
# Quick to leave the in-sync set and to time a send out, so that failover is quick too.
FAST = ("--set", "replica_lag_max_ms=2000", "--set", "replication_timeout_ms=1000")
TLS_CLUSTER = ClusterBuilder(
    groups=(GROUP,), tls=True, verify_client=True, nameserver_args=("--http-port", "0"),
    broker_args=FAST,
)  # fmt: skip
"""Every listener on TLS, asking clients for a certificate."""


@pytest.fixture
def nameserver(pki: Pki, tmp_path: Path) -> Iterator[NameServerProcess]:
    server = start_nameserver(
        tmp_path / "ns", "--http-port", "0", *pki.server_flags(verify_client=True)
    )
    try:
        yield server
    finally:
        server.stop()


async def put_topic(broker: BrokerProcess, tls: TlsConfig) -> None:
    url = f"{broker.http_url}/topics/{TOPIC}"
    body = {"read_queues": QUEUES, "write_queues": QUEUES, "perm": "read-write"}
    async with (
        aiohttp.ClientSession() as session,
        session.put(url, json=body, ssl=tls.client_context()) as answer,
    ):
        assert answer.status == 200, await answer.text()


def https_get(url: str, context: ssl.SSLContext | None) -> Any:
    with urllib.request.urlopen(url, timeout=5, context=context) as answer:
        return answer.status


def test_produce_consume_and_failover_with_tls_on_every_listener(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    cluster = cluster_factory(dataclasses.replace(TLS_CLUSTER, replicas=2))
    tls = cluster.tls
    assert tls is not None
    nameserver = cluster.nameservers[0]
    # HTTP: the nameserver's /health answers over HTTPS only.
    assert https_get(f"https://{nameserver.http_address}/health", tls.client_context()) == 200
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        https_get(f"http://{nameserver.http_address}/health", None)

    # gRPC: both brokers registered over TLS, with their certificates (the nameserver
    # verifies clients), so the controller could name a master and see the slave.
    master_id = cluster.master_id(GROUP, 30)
    run_async(put_topic(cluster.broker(GROUP, master_id), tls))
    cluster.wait_committed_in_sync(GROUP, [0, 1], 30)

    produce_fail_over_and_read(
        cluster.nameserver_addresses, TOPIC, "tls-readers", tls,
        cluster.broker(GROUP, master_id), cluster.broker(GROUP, 1 - master_id), 200, 100,
    )  # fmt: skip


@pytest.fixture
def lone_broker(pki: Pki, tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker without nameservers whose listeners verify client certificates."""
    with BrokerProcess.start(
        tmp_path / "lone",
        *pki.server_flags(verify_client=True),
        tls=pki.client_tls(with_cert=True),
    ) as broker:
        yield broker


async def heartbeat(address: str, tls: TlsConfig | None, timeout_s: float = 3.0) -> None:
    connection = await BrokerConnection.open(address, tls=tls, connect_timeout_s=timeout_s)
    try:
        await connection.request(FrameType.HEARTBEAT, b"", timeout_s=timeout_s)
    finally:
        await connection.close()


def test_clients_without_the_right_tls_settings_are_refused_and_told_why(
    pki: Pki, lone_broker: BrokerProcess
) -> None:
    address = f"{lone_broker.data_host}:{lone_broker.data_port}"
    run_async(heartbeat(address, pki.client_tls(with_cert=True)))  # the right settings work

    with pytest.raises(ConnectionLost, match=f"the broker at {address} speaks TLS; pass --tls-ca"):
        run_async(heartbeat(address, None))
    with pytest.raises(ConnectionLost, match=r"is not trusted .* pass the CA that signed it"):
        run_async(heartbeat(address, TlsConfig(ca_file=pki.other_ca_file)))
    with pytest.raises(ConnectionLost, match="client certificate"):
        run_async(heartbeat(address, pki.client_tls()))
    stranger = TlsConfig(pki.stranger.cert_file, pki.stranger.key_file, pki.ca_file)
    with pytest.raises(ConnectionLost):
        run_async(heartbeat(address, stranger))
    # HTTP wants the client certificate too.
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        https_get(f"{lone_broker.http_url}/health", pki.client_tls().client_context())


def test_a_tls_client_on_a_plain_broker_is_told_the_port_is_plain(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path / "plain") as broker:
        address = f"{broker.data_host}:{broker.data_port}"
        with pytest.raises(ConnectionLost, match=r"does not speak TLS \(its port is plain\)"):
            run_async(heartbeat(address, TlsConfig(), timeout_s=1.0))


def test_a_plain_client_of_a_tls_nameserver_is_told_to_pass_the_ca(
    pki: Pki, nameserver: NameServerProcess
) -> None:
    async def route(tls: TlsConfig | None) -> None:
        async with Admin([nameserver.grpc_address], timeout_s=3, tls=tls) as admin:
            await admin.cluster()

    with pytest.raises(NoNameServer, match="speaks TLS; pass --tls-ca"):
        run_async(route(None))
    with pytest.raises(NoNameServer, match=r"TLS with the nameserver at .* failed"):
        run_async(route(pki.client_tls()))  # no client certificate, and it verifies clients
    run_async(route(pki.client_tls(with_cert=True)))


def test_concurrent_pipelined_requests_share_one_tls_connection(
    pki: Pki, lone_broker: BrokerProcess
) -> None:
    address = f"{lone_broker.data_host}:{lone_broker.data_port}"

    async def many() -> None:
        connection = await BrokerConnection.open(address, tls=pki.client_tls(with_cert=True))
        try:
            await asyncio.gather(
                *(connection.request(FrameType.HEARTBEAT, b"", timeout_s=5) for _ in range(500))
            )
        finally:
            await connection.close()

    run_async(many())


def test_the_console_of_a_tls_nameserver_reads_its_brokers_over_https(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    cluster = cluster_factory(TLS_CLUSTER)
    tls = cluster.tls
    assert tls is not None
    url = f"https://{cluster.nameservers[0].http_address}/console/cluster"
    with urllib.request.urlopen(url, timeout=10, context=tls.client_context()) as answer:
        page = answer.read().decode()
    # The broker verifies client certificates: its figures are on the page only if the
    # console dialled it over HTTPS with the nameserver's certificate.
    assert 'role="alert"' not in page, page
    assert "(75.0 % / 90.0 %)" in page  # disk thresholds, from the broker's /health
