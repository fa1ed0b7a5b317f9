"""Monitoring with real parts: Debian's Prometheus scraping a real cluster (a nameserver,
a sync-replicated master and its slave) once a second with deploy/monitoring/alerts.yml
loaded; promtool on the rules, their unit tests and the example scrape config; the
Grafana dashboard checked against what the processes export.

Prometheus and promtool come from Debian's ``prometheus`` package (``make ci-deps``
installs it); without them these tests skip and say so.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from metaq.client.admin import Admin, TopicSettings
from metaq.common.record import encode
from metaq.testing import BrokerProcess, DataClient
from metaq.testing.cluster import Cluster, ClusterBuilder, Group
from metaq.testing.nameserver_process import NameServerProcess, free_ports
from metaq.testing.replica_group import GROUP, TOPIC
from metaq.testing.waiting import run_async, wait_until, wait_until_async

MONITORING: Final = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
PROMETHEUS: Final = shutil.which("prometheus")
PROMTOOL: Final = shutil.which("promtool")
MISSING: Final = "needs Debian's prometheus package (make ci-deps installs it as root)"
# Fast failure detection, as in the failover tests: a dead slave leaves the in-sync set
# after 2 s instead of the production 5 s.
FAST: Final = ("--set", "replica_lag_max_ms=2000", "--set", "replication_timeout_ms=1000")
BACKLOG_GROUP: Final = "billing"
SENT: Final = 10
COMMITTED: Final = 3
# What a dashboard expression may name that is not a metric: PromQL's functions and
# keywords never start with these prefixes, so every match is a metric name.
METRIC_NAME: Final = re.compile(r"\b((?:metaq|process|python)_[a-z0-9_]+)\b")
# Exported only by servers with TLS listeners (this cluster is plain); the TLS tests
# scrape it (tls/test_tls_cert_expiry.py).
TLS_ONLY: Final = frozenset({"metaq_tls_cert_expiry_timestamp_seconds"})


@dataclass
class Monitored:
    nameserver: NameServerProcess
    group: Group
    master_id: int

    @property
    def master(self) -> BrokerProcess:
        return self.group.brokers[self.master_id]

    @property
    def slave(self) -> BrokerProcess:
        return self.group.brokers[1 - self.master_id]


def host_port(url: str) -> str:
    return url.removeprefix("http://")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitored]:
    """Two brokers of one group, a master and its sync slave as the controller chose,
    both in its in-sync set; topic TOPIC with SENT messages in queue 0, COMMITTED of them
    consumed by group BACKLOG_GROUP."""
    builder = ClusterBuilder(
        groups=(GROUP,), replicas=2, replication_mode="sync", min_in_sync=2,
        nameserver_args=("--http-port", "0"), broker_args=FAST,
    )  # fmt: skip
    with builder.start(tmp_path_factory.mktemp("monitored")) as started:
        group = started.group(GROUP)
        master_id = group.master()
        group.wait_in_sync([0, 1])
        group.wait_committed_in_sync([0, 1])
        run_async(_leave_backlog(group.brokers[master_id]))
        yield Monitored(started.nameservers[0], group, master_id)


async def _leave_backlog(master: BrokerProcess) -> None:
    await Admin().put_topic(master.http_url, TOPIC, TopicSettings(read_queues=4, write_queues=4))
    client = await DataClient.connect(master.data_host, master.data_port)
    try:
        records = [encode(TOPIC, b"order-%d" % i) for i in range(SENT)]
        await client.send(TOPIC, 0, records)

        async def dispatched() -> bool:  # consume queues are built after the answer
            return (await client.query_offset(TOPIC, 0)).max_offset == SENT

        await wait_until_async(dispatched, 10, f"queue 0 of {TOPIC} holds {SENT} messages")
        await client.commit(BACKLOG_GROUP, [(TOPIC, 0, COMMITTED)])
    finally:
        await client.close()


def scrape_configs(cluster: Monitored) -> list[dict[str, Any]]:
    return [
        {
            "job_name": "metaq-broker",
            "static_configs": [
                {"targets": [host_port(b.http_url) for b in cluster.group.brokers.values()]}
            ],
        },
        {
            "job_name": "metaq-nameserver",
            "static_configs": [{"targets": [cluster.nameserver.http_address]}],
        },
    ]


class Prometheus:
    """A Prometheus server on a loopback port with a temporary storage directory,
    scraping every second."""

    def __init__(self, work: Path, scrapes: list[dict[str, Any]]) -> None:
        (port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(MONITORING / "alerts.yml")],
            "scrape_configs": scrapes,
        }
        work.mkdir(parents=True, exist_ok=True)
        config_path = work / "prometheus.yml"
        config_path.write_text(json.dumps(config))  # JSON is YAML
        self.log_path = work / "prometheus.log"
        with self.log_path.open("wb") as log:
            assert PROMETHEUS is not None
            self.process = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={work / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}" if params else self.url + path
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read()) if path.startswith("/api") else response.read()

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited: {self.log_path.read_text()}")
        try:
            self.get("/-/ready")
        except OSError:
            return False
        return True

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = self.get("/api/v1/query", query=expr)
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The single sample ``expr`` yields now, or None while it yields none."""
        result = self.query(expr)
        if not result:
            return None
        assert len(result) == 1, f"{expr} yields {len(result)} series: {result}"
        return float(result[0]["value"][1])

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)


@contextlib.contextmanager
def running_prometheus(work: Path, scrapes: list[dict[str, Any]]) -> Iterator[Prometheus]:
    if PROMETHEUS is None:
        pytest.skip(MISSING)
    server = Prometheus(work, scrapes)
    try:
        wait_until(server.ready, 15, "prometheus answers /-/ready", poll_s=0.1)
        yield server
    finally:
        server.stop()


@pytest.fixture
def prometheus(tmp_path: Path, cluster: Monitored) -> Iterator[Prometheus]:
    with running_prometheus(tmp_path / "prometheus", scrape_configs(cluster)) as server:
        yield server


def exported_names(url: str) -> set[str]:
    """Every sample name a /metrics page can carry, labelled families without samples
    yet included (their HELP and TYPE lines are there)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [
        target["expr"]
        for row in dashboard["panels"]
        for panel in [row, *row.get("panels", [])]
        for target in panel.get("targets", [])
    ]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_dashboard_and_alerts_name_only_metrics_the_processes_export(cluster: Monitored) -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Cluster overview", "Topic", "Consumer group", "Replication", "Storage"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert {"broker_group", "instance", "topic", "consumer_group"} <= set(variables)
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]

    exported = set().union(
        exported_names(cluster.master.http_url),
        exported_names(cluster.slave.http_url),
        exported_names(f"http://{cluster.nameserver.http_address}"),
        TLS_ONLY,
    )
    alerts = (MONITORING / "alerts.yml").read_text()
    used = {m for expr in dashboard_exprs() for m in METRIC_NAME.findall(expr)}
    used |= set(METRIC_NAME.findall(alerts))
    assert len(used) > 30, "the name pattern found too few metrics to mean anything"
    assert used - exported == set(), "named in the dashboard or alerts but exported by none"


def scraped(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics page: {(name, sorted label pairs): value}."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_counters_that_alerts_watch_are_exported_at_zero_before_their_first_count(
    cluster: Monitored,
) -> None:
    """increase() sees nothing of a series that first appears at 1: the DLQ alert
    would miss a group's first dead letter. Each series is there at zero from when its
    labels are known: the group once it committed here, every refusal reason, every
    broker group the controller knows."""
    master = scraped(cluster.master.http_url)
    assert master[("metaq_send_to_dlq_messages_total", (("group", BACKLOG_GROUP),))] == 0
    for reason in ("disk_full", "not_master", "not_enough_replicas", "out_of_descriptors"):
        assert master[("metaq_rejected_writes_total", (("reason", reason),))] == 0, reason
    for reason in ("unauthenticated", "permission"):
        assert master[("metaq_auth_denied_total", (("reason", reason),))] == 0, reason
    nameserver = scraped(f"http://{cluster.nameserver.http_address}")
    assert ("metaq_controller_failovers_total", (("broker_group", GROUP),)) in nameserver
    assert nameserver[("metaq_auth_denied_total", (("reason", "permission"),))] == 0


def test_the_nameserver_counts_each_topics_writable_queues(cluster: Monitored) -> None:
    """What MetaqTopicNotWritable watches, from a real nameserver: TOPIC's 4 write
    queues on its group's master."""
    key = ("metaq_topic_writable_queues", (("topic", TOPIC),))
    wait_until(
        lambda: scraped(f"http://{cluster.nameserver.http_address}").get(key) == 4,
        15,
        f"the nameserver routes sends of {TOPIC} to 4 queues",
        poll_s=0.2,
    )


def test_prometheus_sees_the_backlog_and_the_in_sync_set_shrink_when_the_slave_dies(
    cluster: Monitored, prometheus: Prometheus
) -> None:
    master = host_port(cluster.master.http_url)
    backlog = f'metaq_consumer_lag_messages{{group="{BACKLOG_GROUP}",instance="{master}"}}'
    wait_until(
        lambda: prometheus.value(backlog) == SENT - COMMITTED,
        15,
        f"prometheus has a backlog of {SENT - COMMITTED} for group {BACKLOG_GROUP}",
        poll_s=0.2,
    )
    # The recording rule the lag alert uses counts the master's view only.
    lag_sum = f'metaq:consumer_lag_messages:sum{{group="{BACKLOG_GROUP}",topic="{TOPIC}"}}'
    wait_until(
        lambda: prometheus.value(lag_sum) == SENT - COMMITTED,
        15,
        "the recording rule sums the master's backlog",
        poll_s=0.2,
    )
    age = prometheus.value(f'metaq_consumer_lag_latency_seconds{{instance="{master}"}}')
    assert age is not None and 0 < age < 120
    in_sync = f'metaq_in_sync_replicas{{instance="{master}"}}'
    controller = f'metaq_controller_in_sync_replicas{{broker_group="{GROUP}"}}'
    # The nameserver is scraped on its own schedule: its first sample may not be in yet.
    wait_until(
        lambda: prometheus.value(in_sync) == 2 and prometheus.value(controller) == 2,
        15,
        "prometheus sees both replicas in sync, at the master and at the controller",
        poll_s=0.2,
    )

    cluster.slave.kill()
    wait_until(
        lambda: prometheus.value(in_sync) == 1,
        20,
        "prometheus sees the master's in-sync set drop to itself",
        poll_s=0.2,
    )
    wait_until(
        lambda: prometheus.value(controller) == 1,
        20,
        "prometheus sees the controller drop the slave from the in-sync set",
        poll_s=0.2,
    )
    assert prometheus.value(f'metaq_replicas{{instance="{master}"}}') == 2
    assert prometheus.value(f'metaq_group_has_master{{broker_group="{GROUP}"}}') == 1
    # The replica alert's condition holds now; alerts_test.yml shows it fire after its
    # minute's grace.
    assert prometheus.query("metaq_in_sync_replicas < metaq_replicas")

    # With its only slave gone, a dead master leaves the group without one.
    cluster.master.kill()
    wait_until(
        lambda: (
            prometheus.value(f'metaq_group_has_master{{broker_group="{GROUP}"}}') == 0
            and prometheus.value("metaq_controller_groups_without_master") == 1
        ),
        20,
        f"prometheus sees group {GROUP} without a master",
        poll_s=0.2,
    )

    # Every dashboard expression is valid PromQL to a real Prometheus (query() asserts
    # "success"), with Grafana's variables as they are at "All".
    for expr in dashboard_exprs():
        if expr.startswith("label_values("):
            continue  # Grafana's, not PromQL
        prometheus.query(re.sub(r"\$\w+", ".*", expr.replace("$__rate_interval", "1m")))


@pytest.mark.skipif(PROMTOOL is None, reason=MISSING)
@pytest.mark.parametrize(
    "args",
    [
        ("check", "rules", "alerts.yml"),
        ("test", "rules", "alerts_test.yml"),
        ("check", "config", "prometheus.yml"),
    ],
    ids=" ".join,
)
def test_promtool_accepts_the_monitoring_files(args: tuple[str, ...]) -> None:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, *args], cwd=MONITORING, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def example_config_with_the_token(token: Path) -> dict[str, Any]:
    """deploy/monitoring/prometheus.yml as an operator of servers with metrics_auth =
    "bearer" makes it: its authorization lines uncommented, naming ``token``."""
    text = (MONITORING / "prometheus.yml").read_text()
    text, uncommented = re.subn(r"(?m)^(\s*)# (authorization:|  credentials_file: .*)$",
                                r"\1\2", text)  # fmt: skip
    assert uncommented == 4, "both jobs' two authorization lines, commented out"
    config: dict[str, Any] = yaml.safe_load(text)
    for job in config["scrape_configs"]:
        assert job["authorization"] == {"credentials_file": "/etc/prometheus/metaq-metrics-token"}
        job["authorization"]["credentials_file"] = str(token)
    return config


def test_prometheus_scrapes_servers_with_metrics_auth_as_the_example_config_says(
    tmp_path: Path, cluster_factory: Callable[[ClusterBuilder], Cluster]
) -> None:
    token = tmp_path / "metrics-token"
    token.write_text("a-token-prometheus-and-the-servers-share\n")
    token.chmod(0o600)
    auth = ["metrics_auth=bearer", f"metrics_auth_file={token}"]
    cluster = cluster_factory(
        ClusterBuilder(
            groups=(GROUP,),
            nameserver_args=("--http-port", "0", "--metrics-auth", "bearer",
                             "--metrics-auth-file", str(token)),
            broker_args=tuple(arg for setting in auth for arg in ("--set", setting)),
            health_headers={"Authorization": "Bearer a-token-prometheus-and-the-servers-share"},
        )
    )  # fmt: skip
    nameserver, broker = cluster.nameservers[0], cluster.broker(GROUP)
    config = example_config_with_the_token(token)
    if PROMTOOL is not None:
        checked = tmp_path / "prometheus.yml"
        checked.write_text(json.dumps({**config, "rule_files": []}))
        command = [PROMTOOL, "check", "config", str(checked)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    jobs = config["scrape_configs"]
    jobs[0]["static_configs"] = [{"targets": [host_port(broker.http_url)]}]
    jobs[1]["static_configs"] = [{"targets": [nameserver.http_address]}]
    with running_prometheus(tmp_path / "prometheus", jobs) as prometheus:
        wait_until(
            lambda: (
                prometheus.value('up{job="metaq-broker"}') == 1
                and prometheus.value('up{job="metaq-nameserver"}') == 1
            ),
            20,
            "prometheus scrapes both servers with the token",
            poll_s=0.2,
        )
        assert prometheus.value('metaq_is_master{job="metaq-broker"}') == 1
        wait_until(
            lambda: prometheus.value(f'metaq_group_has_master{{broker_group="{GROUP}"}}') == 1,
            20,
            "prometheus has the nameserver's view of the group",
            poll_s=0.2,
        )
