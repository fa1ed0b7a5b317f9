"""The Ansible playbooks against real sshd hosts (network namespaces; docs/deploy.md):
site.yml deploys the cluster from the wheelhouse, a second run changes nothing, and the
rendered configs are what the programs' own loaders accept.

The steps share one lab and run in order; each says how long it took.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab import BROKERS, NAMESERVERS, REPO, Lab, unavailable

from metaq.broker.config import load_config as load_broker_config
from metaq.nameserver.config import load_config as load_nameserver_config

pytestmark = pytest.mark.timeout(420)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    why = unavailable()
    if why:
        pytest.skip(why)
    work = tmp_path_factory.mktemp("deploy-lab")
    dist = work / "dist"
    started = time.monotonic()
    subprocess.run([sys.executable, str(REPO / "deploy" / "build_dist.py"), "--out", str(dist)],
                   check=True, capture_output=True)  # fmt: skip
    print(f"make dist: {time.monotonic() - started:.1f} s")
    made = Lab.create(work, dist)
    try:
        yield made
    finally:
        made.destroy()


def test_site_deploys_a_cluster_a_client_uses_through_the_nameservers(lab: Lab) -> None:
    run = lab.playbook("site.yml")
    print(f"site.yml (first run): {run.seconds:.1f} s")
    assert run.returncode == 0, run.output[-6000:]

    brokers = lab.cluster()
    by_group: dict[str, list[dict[str, object]]] = {}
    for broker in brokers:
        by_group.setdefault(str(broker["broker_name"]), []).append(broker)
    assert sorted(by_group) == ["broker-a", "broker-b"]
    for group, members in by_group.items():
        assert sorted(str(m["role"]) for m in members) == ["master", "slave"], members
        assert all(m["in_sync"] is True for m in members), f"{group} not in sync: {members}"
        assert all(m["replication_mode"] == "sync" for m in members), members

    created = lab.metaq("topic", "create", "deploy-smoke", "--queues", "4", "--timeout", "20")
    assert created.returncode == 0, created.stderr
    sent = lab.metaq("send", "deploy-smoke", "hello from the client host")
    assert sent.returncode == 0, sent.stderr + sent.stdout
    read = lab.metaq("consume", "deploy-smoke", "-g", "smoke", "--from", "first", "--count",
                     "1", "--timeout", "20")  # fmt: skip
    assert read.returncode == 0, read.stderr
    assert "hello from the client host" in read.stdout


def test_rendered_configs_load_with_the_programs_own_loaders(lab: Lab) -> None:
    for host in NAMESERVERS:
        config = load_nameserver_config(["--config", str(lab.root(host) / "etc/metaq/nameserver.toml")])
        assert config.listen_host == lab.net.address(host)
        assert len(config.controller_peers) == 2
        assert Path(config.cluster_secret_file).stat().st_mode & 0o777 == 0o600
    for host, (group, broker_id) in BROKERS.items():
        config = load_broker_config(["--config", str(lab.root(host) / "etc/metaq/broker.toml")])
        assert (config.broker_name, config.broker_id) == (group, broker_id)
        assert config.replication_mode.value == "sync"
        assert config.store.commitlog_segment_bytes == 8388608
        assert len(config.nameservers) == 3


def test_site_again_changes_nothing_and_check_mode_reports_no_change(lab: Lab) -> None:
    again = lab.playbook("site.yml")
    print(f"site.yml (second run): {again.seconds:.1f} s")
    assert again.returncode == 0, again.output[-6000:]
    assert again.changed() == 0, again.output[-6000:]
    check = lab.playbook("site.yml", "--check", "--diff")
    print(f"site.yml --check --diff: {check.seconds:.1f} s")
    assert check.returncode == 0, check.output[-6000:]
    assert check.changed() == 0, check.output[-6000:]
