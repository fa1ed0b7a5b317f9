"""The Ansible playbooks against real sshd hosts (network namespaces; docs/deploy.md):
site.yml deploys the cluster from the wheelhouse, a second run changes nothing, the
rendered configs are what the programs' own loaders accept, and a rolling restart under
a steady producer loses no acknowledged message (the chaos suite's checker).

The steps share one lab and run in order; each says how long it took.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from chaoslib.checker import check
from chaoslib.cluster import python_path
from chaoslib.history import read_history
from chaoslib.workload import ConsumerSpec, ProducerSpec, WorkloadSpec
from lab import BROKERS, CLIENT, NAMESERVERS, REPO, SCALE_OUT, Lab

from metaq.broker.config import load_config as load_broker_config
from metaq.nameserver.config import load_config as load_nameserver_config
from metaq.testing.waiting import wait_until

pytestmark = [pytest.mark.timeout(1800), pytest.mark.lab]

NEXT_VERSION = "0.1.0.post1"


def test_site_deploys_a_cluster_a_client_uses_through_the_nameservers(lab: Lab) -> None:
    run = lab.playbook("site.yml")
    print(f"site.yml (first run): {run.seconds:.1f} s")
    assert run.returncode == 0, run.failure()

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
        config = load_nameserver_config(
            ["--config", str(lab.root(host) / "etc/metaq/nameserver.toml")]
        )
        assert config.listen_host == lab.net.address(host)
        assert len(config.controller_peers) == 2
        assert Path(config.cluster_secret_file).stat().st_mode & 0o777 == 0o600
        assert config.auth_enabled
        assert Path(config.auth_acl_file).stat().st_mode & 0o777 == 0o600
    for host, (group, broker_id) in BROKERS.items():
        config = load_broker_config(["--config", str(lab.root(host) / "etc/metaq/broker.toml")])
        assert (config.broker_name, config.broker_id) == (group, broker_id)
        assert config.replication_mode.value == "sync"
        assert config.nice == -5
        assert config.store.commitlog_segment_bytes == 8388608
        assert len(config.nameservers) == 3
        assert config.auth_enabled and Path(config.auth_acl_file).exists()


def test_site_again_changes_nothing_and_check_mode_reports_no_change(lab: Lab) -> None:
    again = lab.playbook("site.yml")
    print(f"site.yml (second run): {again.seconds:.1f} s")
    assert again.returncode == 0, again.failure()
    assert again.changed() == 0, again.changed_tasks()
    check = lab.playbook("site.yml", "--check", "--diff")
    print(f"site.yml --check --diff: {check.seconds:.1f} s")
    assert check.returncode == 0, check.failure()
    assert check.changed() == 0, check.changed_tasks()


def test_rolling_restart_and_a_config_change_lose_no_acknowledged_message(lab: Lab) -> None:
    created = lab.metaq("topic", "create", "deploy-roll", "--queues", "4", "--timeout", "20")
    assert created.returncode == 0, created.stderr
    history = lab.work / "roll-history.jsonl"
    spec = WorkloadSpec(
        nameservers=lab.nameserver_addresses(), history=str(history),
        producers=[ProducerSpec("p0", "deploy-roll", "any", rate_hz=40.0, send_timeout_s=5.0,
                                retries=4)],
        consumers=[ConsumerSpec("deploy-roll-readers", ["deploy-roll"], concurrency=4)],
        drain_timeout_s=30.0, drain_max_s=60.0,
    )  # fmt: skip
    spec_path = lab.work / "roll-workload.json"
    spec_path.write_text(spec.dump())
    argv = ["env", python_path(), sys.executable, "-m", "chaoslib.workload", str(spec_path)]
    with (lab.work / "roll-workload.log").open("wb") as log:
        workload = subprocess.Popen(lab.net.command(CLIENT, argv), stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **lab.client_env()})  # fmt: skip
    try:
        wait_until(lambda: _acked(history) >= 40, 60, "the producer's first sends are acknowledged")
        run = lab.playbook("rolling_restart.yml")
        print(f"rolling_restart.yml: {run.seconds:.1f} s")
        assert run.returncode == 0, run.failure()
        before = _acked(history)
        wait_until(lambda: _acked(history) >= before + 40, 60, "sends go on after the restart")
        _change_a_broker_setting_with_site(lab)
        before = _acked(history)
        wait_until(lambda: _acked(history) >= before + 40, 60, "sends go on after site.yml")
    finally:
        workload.send_signal(signal.SIGTERM)
        workload.wait(timeout=120)
    events = list(read_history(history))
    result = check(events)
    print(result.table())
    acks = sorted(e["t"] for e in events if e["type"] == "ok")
    longest = max(b - a for a, b in itertools.pairwise(acks))
    print(f"rolling restart: {len(acks)} acknowledged sends, longest wait between two: "
          f"{longest:.2f} s")  # fmt: skip
    assert result.acknowledged > 0 and not result.lost, result.table()
    assert not result.violations, result.table()


def _change_a_broker_setting_with_site(lab: Lab) -> None:
    """site.yml with a changed broker key restarts the brokers the rolling way: one at a
    time, the slaves of the moment first, the nameservers not at all."""
    slaves = {b["broker_name"] + str(b["broker_id"]) for b in lab.cluster() if b["role"] == "slave"}
    pids = {h: _pid(lab, h, "broker") for h in BROKERS}
    nameserver_pids = {h: _pid(lab, h, "nameserver") for h in NAMESERVERS}
    lab.change_broker_settings(replica_lag_max_ms=2500)
    run = lab.playbook("site.yml")
    print(f"site.yml (a broker key changed): {run.seconds:.1f} s")
    assert run.returncode == 0, run.failure()
    restarts = [line.rsplit("[", 1)[-1].rstrip("]") for line in run.changed_tasks()
                if "Restart with start-stop-daemon" in line]  # fmt: skip
    # serial: 1 gives each restart its own task, so each line is a host restarted alone.
    assert sorted(restarts) == sorted(BROKERS), run.changed_tasks()
    by_host = {h: f"{group}{broker_id}" for h, (group, broker_id) in BROKERS.items()}
    assert {by_host[h] for h in restarts[:2]} == slaves, (restarts, slaves)
    for host in BROKERS:
        config = load_broker_config(["--config", str(lab.root(host) / "etc/metaq/broker.toml")])
        assert config.replica_lag_max_ms == 2500
        assert _pid(lab, host, "broker") != pids[host], f"{host}'s broker did not restart"
    assert {h: _pid(lab, h, "nameserver") for h in NAMESERVERS} == nameserver_pids


def _pid(lab: Lab, host: str, service: str) -> int:
    return int((lab.root(host) / "run/metaq" / f"{service}.pid").read_text())


def _acked(history: Path) -> int:
    if not history.exists():
        return 0
    return sum(1 for e in read_history(history) if e["type"] == "ok")


def test_scale_out_adds_a_group_that_takes_sends_and_gives_consumers_queues(lab: Lab) -> None:
    lab.scale_out()
    # Limited to the new hosts: the hosts already deployed need nothing from it.
    run = lab.playbook("scale_out.yml", "--limit", ",".join(SCALE_OUT))
    print(f"scale_out.yml: {run.seconds:.1f} s")
    assert run.returncode == 0, run.failure()
    groups = {str(b["broker_name"]) for b in lab.cluster()}
    assert groups == {"broker-a", "broker-b", "broker-c"}
    route = lab.metaq("topic", "route", "deploy-roll", "--json")
    assert route.returncode == 0, route.stderr
    assert "broker-c" in route.stdout, route.stdout
    # A sharding key picks one queue of all the groups' queues (12 here); a few keys reach
    # broker-c's (keys hash the same on every run, so this is not left to chance).
    on_c, sent_count = set(), 0
    for key in range(24):
        sent = lab.metaq("send", "deploy-roll", f"after scale-out {key}", "--sharding-key",
                         f"key-{key}", "--json")  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        sent_count += 1
        result = json.loads(sent.stdout)["results"][0]
        if result["broker"] == "broker-c":
            on_c.add(result["msg_id"])
            break
    assert on_c, "no key's send landed on the new group broker-c"
    # The rolling restart's consumer group gets broker-c's queues and reads what is there.
    read = lab.metaq("consume", "deploy-roll", "-g", "deploy-roll-readers", "--count",
                     str(sent_count), "--timeout", "30", "--json")  # fmt: skip
    assert read.returncode == 0, read.stderr
    consumed = {json.loads(line)["msg_id"] for line in read.stdout.splitlines() if line.strip()}
    assert on_c <= consumed, f"broker-c's messages {on_c} not read; read {consumed}"


def test_upgrade_moves_every_process_to_the_new_version(lab: Lab) -> None:
    dist = lab.work / "dist-next"
    subprocess.run([sys.executable, str(REPO / "deploy" / "build_dist.py"), "--out", str(dist),
                    "--version", NEXT_VERSION], check=True, capture_output=True)  # fmt: skip
    run = lab.playbook("upgrade.yml", "-e", f"metaq_dist_dir={dist}")
    print(f"upgrade.yml: {run.seconds:.1f} s")
    assert run.returncode == 0, run.failure()
    for host in lab.hosts:
        port = 9880 if host in NAMESERVERS else 10912
        health = _get_json(f"http://{lab.net.address(host)}:{port}/health")
        assert health["version"] == NEXT_VERSION, (host, health)


def _get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        body: dict[str, object] = json.loads(answer.read())
    return body


def test_status_shows_the_cluster_and_stop_stops_every_process(lab: Lab) -> None:
    status = lab.playbook("status.yml")
    assert status.returncode == 0, status.failure()
    assert "broker-c" in status.output, status.output[-3000:]
    pidfiles = list(lab.work.glob("hosts/*/run/metaq/*.pid"))
    assert len(pidfiles) == len(lab.hosts), pidfiles
    pids = [int(p.read_text()) for p in pidfiles]
    stop = lab.playbook("stop.yml")
    print(f"stop.yml: {stop.seconds:.1f} s")
    assert stop.returncode == 0, stop.failure()
    wait_until(lambda: not any(_alive(pid) for pid in pids), 30, "every metaq process exited")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
