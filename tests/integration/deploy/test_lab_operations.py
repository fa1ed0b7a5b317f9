"""The optional parts of the deploy on the lab's sshd hosts, as one scenario
(docs/deploy.md, "The lab test as a scenario"): TLS on, the firewall on, Prometheus on
ns1 (the group ``monitoring``).

- converge: ``site.yml`` deploys all of it; idempotence: a second run reports
  ``changed=0``, as does ``--check --diff``;
- the firewall: every host's metaq ports answer the client host (in
  ``metaq_client_networks``) and a cluster host, and a host in neither (the control
  host) gets no connection to any of them; Raft answers the nameservers only;
- monitoring: the scrape config the role wrote passes ``promtool check config`` and
  names every host; Prometheus started on ns1 with it scrapes every host up over TLS
  through the firewall, and reads each one's certificate expiry;
- certificate renewal: ``renew_certs.yml`` renews nothing at the default 30 days;
  ``--check`` with a window wider than the certificates' life says it would renew every
  host and changes nothing; the real run gives every host a new certificate, restarts
  every process onto it one at a time and leaves the cluster whole and in sync, each
  process reporting the new certificate's end.

Destroy: the lab's teardown (conftest.py) kills every process and deletes the namespaces.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from cryptography import x509
from lab import BROKERS, CLIENT, CONTROL, NAMESERVERS, Lab

from metaq.testing.waiting import wait_until

pytestmark = [pytest.mark.timeout(1800), pytest.mark.lab]

DEPLOYED: Final = (*NAMESERVERS, *BROKERS)
PROMETHEUS_HOST: Final = "ns1"
PORTS: Final = {"ns": (9876, 9880), "broker": (10911, 10912)}
RAFT: Final = 9877
GAUGE: Final = "metaq_tls_cert_expiry_timestamp_seconds"

# Connects to every host:port given at once (a dropped SYN takes the whole timeout) and
# prints which connected.
PROBE: Final = """
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
def probe(target):
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        return True
    except OSError:
        return False
targets = sys.argv[1:]
with ThreadPoolExecutor(len(targets)) as pool:
    print(json.dumps(dict(zip(targets, pool.map(probe, targets)))))
"""


@pytest.fixture(scope="module")
def cluster(lab: Lab) -> Iterator[Lab]:
    lab.configure(
        monitoring=[PROMETHEUS_HOST],
        metaq_tls=True,
        metaq_tls_local_dir=str(lab.work / "tls"),
        metaq_firewall=True,
        metaq_client_networks=[f"{lab.net.address(CLIENT)}/32"],
        # Nothing manages services in the lab's namespaces; the test starts Prometheus.
        metaq_prometheus_manage_service=False,
    )
    run = lab.playbook("site.yml")
    print(f"site.yml (first run, TLS, firewall, monitoring): {run.seconds:.1f} s")
    assert run.returncode == 0, run.failure()
    yield lab


def targets(lab: Lab, hosts: tuple[str, ...]) -> list[str]:
    return [f"{lab.net.address(h)}:{port}" for h in hosts
            for port in PORTS["ns" if h in NAMESERVERS else "broker"]]  # fmt: skip


def probe(lab: Lab, node: str, addresses: list[str]) -> dict[str, bool]:
    done = subprocess.run(lab.net.command(node, [sys.executable, "-c", PROBE, *addresses]),
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    found: dict[str, bool] = json.loads(done.stdout)
    return found


def expiry_gauges(lab: Lab) -> dict[str, float]:
    """Each deployed host's ``metaq_tls_cert_expiry_timestamp_seconds``, scraped over
    HTTPS from the client host (the firewall admits it), by host."""
    urls = {h: f"https://{lab.net.address(h)}:{PORTS['ns' if h in NAMESERVERS else 'broker'][1]}"
            for h in DEPLOYED}  # fmt: skip
    script = (
        "import json, ssl, sys, urllib.request\n"
        "ctx = ssl.create_default_context(cafile=sys.argv[1])\n"
        "out = {}\n"
        "for host, url in json.loads(sys.argv[2]).items():\n"
        "    text = urllib.request.urlopen(url + '/metrics', timeout=10, context=ctx).read()\n"
        f"    line = [l for l in text.decode().splitlines() if l.startswith('{GAUGE} ')][0]\n"
        "    out[host] = float(line.split()[1])\n"
        "print(json.dumps(out))\n"
    )
    done = lab.client([sys.executable, "-c", script, str(lab.tls_ca), json.dumps(urls)])
    assert done.returncode == 0, done.stderr
    found: dict[str, float] = json.loads(done.stdout)
    return found


def not_after(path: Path) -> float:
    return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc.timestamp()


def pids(lab: Lab) -> dict[str, int]:
    return {f"{p.parents[2].name}/{p.stem}": int(p.read_text())
            for p in lab.work.glob("hosts/*/run/metaq/*.pid")}  # fmt: skip


def whole_and_in_sync(lab: Lab) -> bool:
    brokers = lab.cluster()
    return (len(brokers) == len(BROKERS) and all(b["in_sync"] is True for b in brokers)
            and sum(b["role"] == "master" for b in brokers) == 2)  # fmt: skip


def test_a_second_site_run_and_a_check_run_change_nothing(cluster: Lab) -> None:
    lab = cluster
    again = lab.playbook("site.yml")
    print(f"site.yml (second run): {again.seconds:.1f} s")
    assert again.returncode == 0, again.failure()
    assert again.changed() == 0, again.changed_tasks()
    check = lab.playbook("site.yml", "--check", "--diff")
    print(f"site.yml --check --diff: {check.seconds:.1f} s")
    assert check.returncode == 0, check.failure()
    assert check.changed() == 0, check.changed_tasks()


def test_the_firewall_admits_the_cluster_and_the_client_networks_only(cluster: Lab) -> None:
    lab = cluster
    every = targets(lab, DEPLOYED)
    assert probe(lab, CLIENT, every) == dict.fromkeys(every, True)
    assert probe(lab, "b1", every) == dict.fromkeys(every, True)
    # The control host is neither in the inventory's groups nor in metaq_client_networks.
    assert probe(lab, CONTROL, every) == dict.fromkeys(every, False)
    raft = [f"{lab.net.address(h)}:{RAFT}" for h in NAMESERVERS]
    assert probe(lab, "ns2", raft) == dict.fromkeys(raft, True)
    assert probe(lab, CLIENT, raft) == dict.fromkeys(raft, False)
    # The table is the role's, in each host's own network namespace.
    listed = subprocess.run(lab.net.command("a0", ["nft", "list", "table", "inet", "metaq"]),
                            capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    assert "10911" in listed.stdout and lab.net.address(CLIENT) in listed.stdout, listed.stdout
    # And the cluster works through it: the client reaches it, the brokers are in sync.
    assert whole_and_in_sync(lab), lab.cluster()


def test_prometheus_on_the_monitoring_host_scrapes_every_host(cluster: Lab) -> None:
    lab = cluster
    config = lab.root(PROMETHEUS_HOST) / "etc/prometheus/prometheus.yml"
    checked = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True,
                             text=True, timeout=60, check=False)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert (lab.root(PROMETHEUS_HOST) / "var/lib/grafana/dashboards/metaq.json").exists()
    jobs = {job["job_name"]: job for job in yaml.safe_load(config.read_text())["scrape_configs"]}
    named = {job: sorted(t for c in found["static_configs"] for t in c["targets"])
             for job, found in jobs.items()}  # fmt: skip
    assert named == {
        "metaq-broker": sorted(f"{lab.net.address(h)}:10912" for h in BROKERS),
        "metaq-nameserver": sorted(f"{lab.net.address(h)}:9880" for h in NAMESERVERS),
    }
    assert jobs["metaq-broker"]["scheme"] == "https"

    address = f"{lab.net.address(PROMETHEUS_HOST)}:9090"
    storage = lab.work / "prometheus-data"
    with (lab.work / "prometheus.log").open("wb") as log:
        server = subprocess.Popen(
            lab.net.command(PROMETHEUS_HOST, [
                "prometheus", f"--config.file={config}", f"--storage.tsdb.path={storage}",
                f"--web.listen-address={address}"]),
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:

        def api(path: str) -> Any:
            done = subprocess.run(
                lab.net.command(PROMETHEUS_HOST, [sys.executable, "-c",
                    "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1],"
                    " timeout=5).read().decode())", f"http://{address}/api/v1/{path}"]),
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            return json.loads(done.stdout)["data"] if done.returncode == 0 else None

        def every_target_up() -> bool:
            found = api("targets")
            return found is not None and sorted(
                t["labels"]["host"] for t in found["activeTargets"] if t["health"] == "up"
            ) == sorted(DEPLOYED)

        wait_until(every_target_up, 120, "Prometheus scrapes every host up")
        expiring = api(f"query?query={GAUGE}")["result"]
        assert sorted(r["metric"]["host"] for r in expiring) == sorted(DEPLOYED), expiring
        rules = [r["name"] for g in api("rules")["groups"] for r in g["rules"]]
        assert "MetaqTlsCertificateExpiring" in rules, rules
    finally:
        os.kill(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_renew_certs_renews_and_rolls_every_certificate_in_the_window(cluster: Lab) -> None:
    lab = cluster
    local = Path(str(lab.settings["metaq_tls_local_dir"]))
    before = {h: (local / f"{h}.crt").read_bytes() for h in DEPLOYED}
    running = pids(lab)

    nothing = lab.playbook("renew_certs.yml")
    print(f"renew_certs.yml (nothing due): {nothing.seconds:.1f} s")
    assert nothing.returncode == 0, nothing.failure()
    assert nothing.changed() == 0, nothing.changed_tasks()

    check = lab.playbook("renew_certs.yml", "--check", "-e", "metaq_tls_renew_days=1000")
    assert check.returncode == 0, check.failure()
    assert check.output.count(", within metaq_tls_renew_days (1000): renewed") == len(DEPLOYED)
    assert {h: (local / f"{h}.crt").read_bytes() for h in DEPLOYED} == before
    assert pids(lab) == running

    renew = lab.playbook("renew_certs.yml", "-e", "metaq_tls_renew_days=1000")
    print(f"renew_certs.yml (every host, {len(running)} restarts): {renew.seconds:.1f} s")
    assert renew.returncode == 0, renew.failure()
    for host in DEPLOYED:
        assert (local / f"{host}.crt").read_bytes() != before[host], host
        installed = lab.root(host) / "etc/metaq/tls/node.crt"
        assert installed.read_bytes() == (local / f"{host}.crt").read_bytes(), host
    now = pids(lab)
    assert now.keys() == running.keys()
    assert [k for k in now if now[k] == running[k]] == [], "a process was not restarted"
    # Masters switched over before their restart, as rolling_restart.yml does.
    switched = [t for t in renew.changed_tasks() if "Switch the group's master over" in t]
    assert len(switched) == 2, switched
    assert whole_and_in_sync(lab), lab.cluster()
    assert expiry_gauges(lab) == {h: not_after(local / f"{h}.crt") for h in DEPLOYED}
