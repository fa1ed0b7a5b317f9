"""A signed admin request is good at the one server it was signed for, on a real cluster
with users: two nameservers and a master with its slave.

Before, a request signed for one server (with the cluster secret or a user's key) was
taken by any other within its 120 s window: a header copied from one nameserver to the
other, from a nameserver to a broker, or from a master to its slave went through.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from metaq.common.users import credentials_text
from metaq.testing import Cluster, ClusterBuilder
from metaq.testing.cluster import ADMIN
from metaq.testing.http_signing import http_json, signed_for

GROUP = "broker-a"
SIGNERS = {"cluster member": None, "admin user": ADMIN}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    builder = ClusterBuilder(
        nameservers=2, groups=(GROUP,), replicas=2, auth=True,
        nameserver_args=("--http-port", "0"),
    )  # fmt: skip
    with builder.start(tmp_path_factory.mktemp("signed-for-one")) as started:
        yield started


def _refused_as_for_another(answer: tuple[int, object, object], meant: str, here: str) -> None:
    status, body, _ = answer
    assert status == 401, body
    assert isinstance(body, dict)
    error = str(body["error"])
    assert f"signed for server '{meant}'" in error, error
    assert here in error, error


@pytest.mark.parametrize("signer", list(SIGNERS))
def test_a_request_signed_for_one_nameserver_is_refused_by_the_other(
    cluster: Cluster, signer: str
) -> None:
    a, b = (ns.http_address for ns in cluster.nameservers)
    headers = signed_for(f"http://{a}/cluster", credentials=SIGNERS[signer])

    _refused_as_for_another(http_json(f"http://{b}/cluster", headers=headers), a, b)
    # Refused there without being spent: the server it was signed for takes it, once.
    status, body, _ = http_json(f"http://{a}/cluster", headers=headers)
    assert status == 200, body
    status, body, _ = http_json(f"http://{a}/cluster", headers=headers)
    assert status == 401 and "replay" in body["error"], body


@pytest.mark.parametrize("signer", list(SIGNERS))
def test_a_request_signed_for_the_master_is_refused_by_its_slave_and_a_nameservers_by_a_broker(
    cluster: Cluster, signer: str
) -> None:
    master_id = cluster.master_id(GROUP)
    master = cluster.broker(GROUP, master_id).http_url
    slave = cluster.broker(GROUP, 1 - master_id).http_url
    nameserver = f"http://{cluster.nameservers[0].http_address}"
    credentials = SIGNERS[signer]

    headers = signed_for(f"{master}/topics", credentials=credentials)
    answer = http_json(f"{slave}/topics", headers=headers)
    _refused_as_for_another(answer, master.removeprefix("http://"), slave.removeprefix("http://"))
    headers = signed_for(f"{nameserver}/topics", credentials=credentials)
    answer = http_json(f"{master}/topics", headers=headers)
    _refused_as_for_another(
        answer, nameserver.removeprefix("http://"), master.removeprefix("http://")
    )
    # Each broker takes what was signed for it.
    for broker in (master, slave):
        status, body, _ = http_json(f"{broker}/topics", headers=signed_for(f"{broker}/topics"))
        assert status == 200, (broker, body)


def test_the_cli_the_admin_library_and_the_console_still_reach_the_brokers(
    cluster: Cluster, tmp_path: Path
) -> None:
    credentials = tmp_path / "admin.credentials"
    credentials.write_text(credentials_text(ADMIN))
    # The CLI creates a topic through the admin library: signed calls to the master.
    done = subprocess.run(
        [sys.executable, "-m", "metaq.client.cli", "topic", "create", "bound-topic",
         "--queues", "2", "-n", cluster.nameserver_addresses[0],
         "--credentials-file", str(credentials)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # The console on each nameserver asks every broker's health, signing as a member.
    for nameserver in cluster.nameservers:
        page_url = f"http://{nameserver.http_address}/console/cluster"
        request = urllib.request.Request(page_url, headers=signed_for(page_url))
        with urllib.request.urlopen(request, timeout=10) as answer:
            page = answer.read().decode()
        assert 'role="alert"' not in page, page  # a broker that refused would be listed


def _denied(base: str, reason: str) -> float:
    """``metaq_auth_denied_total{reason}`` on a server's /metrics."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    prefix = f'metaq_auth_denied_total{{reason="{reason}"}} '
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


def test_the_refusals_above_are_counted_and_logged_without_a_key(cluster: Cluster) -> None:
    # The tests above sent each kind of signer's request to the wrong nameserver, and to
    # the slave; the master refused what was signed for a nameserver.
    assert _denied(f"http://{cluster.nameservers[1].http_address}", "wrong_server") == 2
    for broker_id in (0, 1):
        assert _denied(cluster.broker(GROUP, broker_id).http_url, "wrong_server") == 2
    logs = "".join(b.output for b in cluster.brokers.values())
    logs += "".join(ns.output() for ns in cluster.nameservers)
    assert ADMIN.secret_key not in logs
    assert "signed for server" in logs  # the refusals were logged, saying why
