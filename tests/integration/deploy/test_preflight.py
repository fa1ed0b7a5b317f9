"""Every playbook that changes the cluster first checks that every host in its scope
answers (preflight.yml), and stops before any other task when one does not, saying which
and how to leave it out. Run by ansible-playbook on this machine (no lab): the hosts
answer over the local connection, but for one whose ssh port is closed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from lab import PLAYBOOKS, VENV_BIN, ansible_env

PREFLIGHT_TASKS = {
    "Check the inventory's groups and metaq_* variables",
    "Check that the hosts named in metaq_exclude_hosts are the inventory's",
    "Leave the excluded hosts out of this run",
    "Connect to the host",
    "Stop the run, nothing changed, when a host did not answer",
    "Note that the host answered",
    "Say which hosts this run leaves out",
}


def inventory(work: Path, **mistakes: dict[str, object]) -> dict[str, Any]:
    """ns1 and the brokers answer over the local connection; ns2 is refused at once
    (nothing listens on port 1). ``mistakes``: variables to add, by host."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
             "metaq_root": str(work / "root")}  # fmt: skip
    gone = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1}
    hosts: dict[str, dict[str, object]] = {
        "ns1": {}, "ns2": gone,
        "a0": {"metaq_broker_group": "broker-a", "metaq_broker_role": "master", "metaq_room": "r1"},
        "a1": {"metaq_broker_group": "broker-a", "metaq_broker_role": "slave", "metaq_room": "r2",
               "metaq_broker_id": 1},
    }  # fmt: skip
    for host, variables in mistakes.items():
        hosts[host] = {**hosts[host], **variables}
    return {"all": {"vars": local, "children": {
        "nameservers": {"hosts": {h: hosts[h] for h in ("ns1", "ns2")}},
        "brokers": {"hosts": {h: hosts[h] for h in ("a0", "a1")}},
    }}}  # fmt: skip


def run(work: Path, playbook: str, *args: str,
        hosts: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    (work / "hosts.yml").write_text(json.dumps(hosts or inventory(work)))
    return subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(work / "hosts.yml"),
         str(PLAYBOOKS / playbook), "-e", "metaq_connect_wait_s=3", *args],
        capture_output=True, text=True, env=ansible_env(work), cwd=PLAYBOOKS, timeout=300,
        check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "playbook", ["site.yml", "upgrade.yml", "rolling_restart.yml", "scale_out.yml"]
)
def test_a_host_that_does_not_answer_stops_the_run_before_any_other_task(
    tmp_path: Path, playbook: str
) -> None:
    done = run(tmp_path, playbook)

    assert done.returncode != 0, done.stdout
    assert re.search(
        r"ns2 did not answer over ssh within 3 s \(.*\), so nothing was changed on any host: "
        r"bring it back, or leave it out of the run with -e metaq_exclude_hosts=ns2\.",
        done.stdout,
    ), done.stdout
    tasks = set(re.findall(r"^TASK \[(.*)\] \**$", done.stdout, re.MULTILINE))
    assert tasks <= PREFLIGHT_TASKS, tasks - PREFLIGHT_TASKS
    assert not (tmp_path / "root").exists()


def test_a_host_named_for_exclusion_must_be_the_inventory_s(tmp_path: Path) -> None:
    done = run(tmp_path, "rolling_restart.yml", "-e", "metaq_exclude_hosts=ns2,nsx")

    assert done.returncode != 0, done.stdout
    assert "metaq_exclude_hosts names nsx, which the inventory does not have" in done.stdout
    tasks = set(re.findall(r"^TASK \[(.*)\] \**$", done.stdout, re.MULTILINE))
    assert tasks <= PREFLIGHT_TASKS, tasks - PREFLIGHT_TASKS


def test_inventory_mistakes_stop_the_run_before_any_host_is_asked(tmp_path: Path) -> None:
    hosts = inventory(tmp_path, a1={"metaq_broker_grup": "broker-b", "metaq_broker_role": "slvae"})
    children = hosts["all"]["children"]
    children["nameserver"] = children.pop("nameservers")

    done = run(tmp_path, "upgrade.yml", hosts=hosts)

    assert done.returncode != 0, done.stdout
    for words in (
        "The inventory has 3 mistake(s), so nothing was changed: ",
        "the inventory has no hosts in group nameservers (its groups: brokers, nameserver): "
        "did you mean nameserver?",
        "metaq_broker_grup (on a1) is no variable the playbooks read: did you mean "
        "metaq_broker_group?",
        "broker a1 has metaq_broker_role 'slvae' (did you mean slave?): it must be master or slave",
    ):
        assert words in done.stdout, done.stdout
    tasks = set(re.findall(r"^TASK \[(.*)\] \**$", done.stdout, re.MULTILINE))
    assert tasks == {"Check the inventory's groups and metaq_* variables"}, tasks
