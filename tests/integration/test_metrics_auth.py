"""metrics_auth on a real nameserver and broker: /metrics only with the scrape
credentials (bearer or basic, as Prometheus sends them), /health without them only
ok / not-ok, with them all it says; the console still reads the brokers' health.

Before, both pages were open to anyone, showing topic names, Raft and replica addresses
and commitlog positions. (Prometheus scraping with the example config's credentials:
test_prometheus.py.)
"""

from __future__ import annotations

import base64
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from metaq.client.admin import Admin
from metaq.client.errors import BrokerAdminError
from metaq.testing import BrokerProcess, cluster_secret_for_tests, run_async
from metaq.testing.cluster import ClusterBuilder
from metaq.testing.http_signing import http_json
from metaq.testing.nameserver_process import NameServerProcess, start_nameserver

SECRET = "scrape-secret-0123456789abcdef"
USER = "scraper"
GROUP = "guarded"


@dataclass
class Guarded:
    scheme: str
    nameserver: NameServerProcess
    broker: BrokerProcess

    @property
    def credentials(self) -> dict[str, str]:
        return {"Authorization": _header(self.scheme, SECRET)}

    @property
    def bases(self) -> list[str]:
        return [self.broker.http_url, f"http://{self.nameserver.http_address}"]


def _header(scheme: str, secret: str) -> str:
    if scheme == "bearer":
        return f"Bearer {secret}"
    return "Basic " + base64.b64encode(f"{USER}:{secret}".encode()).decode()


def _settings(scheme: str, file: Path) -> list[str]:
    return [f"metrics_auth={scheme}", f"metrics_auth_file={file}", f"metrics_auth_user={USER}"]


@pytest.fixture(scope="module", params=["bearer", "basic"])
def guarded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Guarded]:
    scheme: str = request.param
    work = tmp_path_factory.mktemp(f"metrics-auth-{scheme}")
    secret_file = work / "metrics-secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    settings = _settings(scheme, secret_file)
    builder = ClusterBuilder(
        groups=(GROUP,),
        nameserver_args=("--http-port", "0", "--metrics-auth", scheme,
                         "--metrics-auth-file", str(secret_file), "--metrics-auth-user", USER),
        broker_args=tuple(arg for s in settings for arg in ("--set", s)),
        health_headers={"Authorization": _header(scheme, SECRET)},
    )  # fmt: skip
    with builder.start(work / "cluster") as cluster:
        yield Guarded(scheme, cluster.nameservers[0], cluster.broker(GROUP))


def _text(url: str, headers: dict[str, str]) -> str:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        return str(r.read().decode())


def test_metrics_answer_only_with_the_credentials_and_say_which(guarded: Guarded) -> None:
    for base in guarded.bases:
        status, body, headers = http_json(f"{base}/metrics")
        assert status == 401, (base, body)
        assert headers["WWW-Authenticate"].startswith(guarded.scheme.capitalize() + " realm="), (
            headers
        )
        assert "metrics_auth" in body["error"], body
        wrong = {"Authorization": _header(guarded.scheme, SECRET + "-old")}
        status, body, _ = http_json(f"{base}/metrics", headers=wrong)
        assert status == 401 and "metrics_auth_file" in body["error"], body
        scraped = _text(f"{base}/metrics", guarded.credentials)
        # The two refusals just now, counted (first in this module, so from zero).
        assert 'metaq_auth_denied_total{reason="metrics_auth"} 2.0' in scraped.splitlines()


def test_health_says_only_ok_without_credentials_and_everything_with_them(
    guarded: Guarded,
) -> None:
    for base in guarded.bases:
        assert http_json(f"{base}/health")[:2] == (200, {"status": "ok"}), base
    status, broker, _ = http_json(f"{guarded.broker.http_url}/health", headers=guarded.credentials)
    assert status == 200 and broker["role"] == "master", broker
    assert {"commitlog_write_offset", "in_sync_ids", "master_address"} <= set(broker)
    ns_base = f"http://{guarded.nameserver.http_address}"
    status, nameserver, _ = http_json(f"{ns_base}/health", headers=guarded.credentials)
    assert status == 200 and "topics" in nameserver, nameserver
    # The admin library, signing nothing here (no auth), says why it got no more.
    with pytest.raises(BrokerAdminError, match="sets metrics_auth"):
        run_async(Admin().health(guarded.broker.http_url))

    async def as_member() -> str:
        member = Admin.cluster_member(cluster_secret_for_tests(), timeout_s=10)
        try:
            return (await member.health(guarded.broker.http_url)).role
        finally:
            await member.close()

    assert run_async(as_member()) == "master"


def test_the_console_still_reads_the_brokers_health_as_a_cluster_member(guarded: Guarded) -> None:
    page = _text(f"http://{guarded.nameserver.http_address}/console/cluster", {})
    assert GROUP in page
    assert 'role="alert"' not in page, page  # a broker that refused the console is listed


def test_the_secret_reaches_no_log(guarded: Guarded) -> None:
    logs = guarded.broker.output + guarded.nameserver.output()
    assert SECRET not in logs
    assert "metrics_auth" in logs  # the refusals above, logged without it


def test_a_broker_not_taking_writes_says_only_that_without_credentials(tmp_path: Path) -> None:
    secret_file = tmp_path / "metrics-secret"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o600)
    settings = [*_settings("bearer", secret_file), f"store.disk_reserve_bytes={1 << 60}"]
    with BrokerProcess.start(
        tmp_path / "broker", *(arg for s in settings for arg in ("--set", s))
    ) as broker:
        assert http_json(f"{broker.http_url}/health")[:2] == (503, {"status": "not-writable"})
        full = {"Authorization": _header("bearer", SECRET)}
        status, body, _ = http_json(f"{broker.http_url}/health", headers=full)
        assert status == 503 and body["reason"] and "role" in body, body


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--metrics-auth", "bearer"], "needs metrics_auth_file"),
        (["--metrics-auth", "basic", "--metrics-auth-file", "/nonexistent/metrics-secret"],
         "metrics_auth_file /nonexistent/metrics-secret: cannot read it"),
    ],
)  # fmt: skip
def test_a_server_without_a_usable_metrics_secret_refuses_to_start_saying_which_key(
    tmp_path: Path, flags: list[str], said: str
) -> None:
    with pytest.raises(RuntimeError) as refused:
        start_nameserver(tmp_path / "ns", "--http-port", "0", *flags).stop()
    assert "exited with 2" in str(refused.value)
    assert said in str(refused.value)
