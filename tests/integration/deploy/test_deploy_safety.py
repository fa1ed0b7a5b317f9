"""The playbooks refuse to half-apply (docs/deploy.md, "Before a run changes anything"),
on the deploy lab's sshd hosts:

- a config value the broker's own loader refuses fails site.yml before the file is
  replaced, and the running brokers stay up;
- a host that does not answer ssh stops upgrade.yml before any host gets the new release,
  and a run that names it in metaq_exclude_hosts goes on without it;
- a group that lost its master stops rolling_restart.yml before anything restarts,
  saying in one sentence which member is down; metaq_allow_degraded starts anyway and
  restarts the dead master among the slaves, before the master promoted after it.

One lab, deployed once by site.yml; each test leaves the cluster whole and in sync.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from lab import BROKERS, NAMESERVERS, REPO, Lab

from metaq.testing.waiting import wait_until

pytestmark = [pytest.mark.timeout(900), pytest.mark.lab]

NEXT_VERSION = "0.1.0.post2"


@pytest.fixture(scope="module")
def cluster(lab: Lab) -> Iterator[Lab]:
    run = lab.playbook("site.yml")
    print(f"site.yml (first run): {run.seconds:.1f} s")
    assert run.returncode == 0, run.failure()
    yield lab


def pids(lab: Lab) -> dict[str, int]:
    """Every running metaq process's pid, by ``host/service``."""
    return {f"{p.parents[2].name}/{p.stem}": int(p.read_text())
            for p in lab.work.glob("hosts/*/run/metaq/*.pid")}  # fmt: skip


def whole_and_in_sync(lab: Lab) -> bool:
    brokers = lab.cluster()
    return (len(brokers) == len(BROKERS) and all(b["in_sync"] is True for b in brokers)
            and sum(b["role"] == "master" for b in brokers) == 2)  # fmt: skip


def errors_of(output: str) -> list[str]:
    """The first line of each task failure Ansible reports."""
    return [line for line in output.splitlines() if line.startswith("[ERROR]: Task failed")]


def test_a_broker_key_the_loader_refuses_fails_site_and_the_brokers_stay_up(cluster: Lab) -> None:
    lab = cluster
    before = pids(lab)
    configs = {h: (lab.root(h) / "etc/metaq/broker.toml").read_text() for h in BROKERS}
    lab.change_broker_settings(bogus_key=1)
    try:
        run = lab.playbook("site.yml")
    finally:
        del lab.broker_settings["bogus_key"]
        lab.change_broker_settings()
    print(f"site.yml (an unknown broker key): {run.seconds:.1f} s")

    assert run.returncode != 0, run.output[-3000:]
    assert "failed to validate" in run.output, run.failure()
    assert "bogus_key: unknown key 'bogus_key'" in run.output, run.failure()
    assert pids(lab) == before, "a running process was restarted"
    for host, text in configs.items():
        assert (lab.root(host) / "etc/metaq/broker.toml").read_text() == text, host
    assert whole_and_in_sync(lab), lab.cluster()


def test_an_unreachable_host_stops_upgrade_before_any_host_changes(cluster: Lab) -> None:
    lab = cluster
    dist = lab.work / "dist-next"
    subprocess.run([sys.executable, str(REPO / "deploy" / "build_dist.py"), "--out", str(dist),
                    "--version", NEXT_VERSION], check=True, capture_output=True)  # fmt: skip
    before = pids(lab)
    current = {h: os.readlink(lab.root(h) / "opt/metaq/current") for h in lab.hosts
               if (lab.root(h) / "opt/metaq/current").exists()}  # fmt: skip
    lab.stop_sshd("b1")
    try:
        run = lab.playbook("upgrade.yml", "-e", f"metaq_dist_dir={dist}",
                           "-e", "metaq_connect_wait_s=10")  # fmt: skip
        print(f"upgrade.yml (b1 unreachable): {run.seconds:.1f} s")

        assert run.returncode != 0, run.output[-3000:]
        assert "b1 did not answer over ssh within 10 s" in run.output, run.failure()
        assert "metaq_exclude_hosts=b1" in run.output, run.failure()
        assert not list(lab.work.glob(f"hosts/*/opt/metaq/releases/{NEXT_VERSION}"))
        assert {h: os.readlink(lab.root(h) / "opt/metaq/current") for h in current} == current
        assert pids(lab) == before

        # Named as excluded, the rest of the cluster rolls without it.
        rolled = lab.playbook("rolling_restart.yml", "-e", "metaq_exclude_hosts=b1")
        print(f"rolling_restart.yml (b1 excluded): {rolled.seconds:.1f} s")
        assert rolled.returncode == 0, rolled.failure()
        assert "Left out of this run (metaq_exclude_hosts): b1" in rolled.output
        after = pids(lab)
        assert after["b1/broker"] == before["b1/broker"]
        for host in set(BROKERS) - {"b1"}:
            assert after[f"{host}/broker"] != before[f"{host}/broker"], host
        assert all(after[f"{h}/nameserver"] == before[f"{h}/nameserver"] for h in NAMESERVERS)
    finally:
        lab.restore_sshd("b1")
    wait_until(lambda: whole_and_in_sync(lab), 90, "the cluster is whole and in sync")


def test_a_group_that_lost_its_master_stops_rolling_restart_before_any_restart(
    cluster: Lab,
) -> None:
    """The harder of a group short of a member: the one gone was the master, so the
    nameservers list it down with the role it last had, beside the slave promoted after
    it. The degraded run must restart it among the slaves, before that new master."""
    lab = cluster
    group_a = [b for b in lab.cluster() if b["broker_name"] == "broker-a" and not b["down"]]
    (master,) = [b for b in group_a if b["role"] == "master"]
    dead_id = master["broker_id"]
    dead = next(h for h, (group, i) in BROKERS.items() if (group, i) == ("broker-a", dead_id))
    pid_file = lab.root(dead) / "run/metaq/broker.pid"
    os.kill(int(pid_file.read_text()), signal.SIGTERM)
    wait_until(lambda: not _alive(int(pid_file.read_text())), 60, f"{dead}'s broker exited")

    def promoted() -> bool:
        group = [b for b in lab.cluster() if b["broker_name"] == "broker-a"]
        return any(b["role"] == "master" and not b["down"] and b["broker_id"] != dead_id
                   for b in group) and not any(b["broker_id"] == dead_id and b["in_sync"]
                                               for b in group)  # fmt: skip

    wait_until(promoted, 90, f"broker-a's slave promoted and {dead} no longer counted in sync")
    before = pids(lab)

    run = lab.playbook("rolling_restart.yml")
    print(f"rolling_restart.yml ({dead} down): {run.seconds:.1f} s")

    assert run.returncode != 0, run.output[-3000:]
    errors = errors_of(run.output)
    assert len(errors) == 1, errors
    assert (
        f"Nothing was restarted: broker {dead_id} of broker-a ({dead}) is down: " in (errors[0])
    ), errors
    # One sentence, not the cluster's JSON.
    assert len(errors[0]) < 1000 and '"brokers"' not in run.output, errors
    assert pids(lab) == before

    degraded = lab.playbook("rolling_restart.yml", "-e", "metaq_allow_degraded=true")
    print(f"rolling_restart.yml ({dead} down, metaq_allow_degraded): {degraded.seconds:.1f} s")
    assert degraded.returncode == 0, degraded.failure()
    assert (
        f"Degraded start accepted (metaq_allow_degraded): broker {dead_id} of broker-a ({dead})"
        in degraded.output
    )
    # The dead master's restart started it again: the group is whole once more.
    wait_until(lambda: whole_and_in_sync(lab), 90, "the cluster is whole and in sync")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
