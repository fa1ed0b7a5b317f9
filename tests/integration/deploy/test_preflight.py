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

import pytest
from lab import PLAYBOOKS, VENV_BIN, ansible_env

PREFLIGHT_TASKS = {
    "Check that the hosts named in metaq_exclude_hosts are the inventory's",
    "Leave the excluded hosts out of this run",
    "Connect to the host",
    "Stop the run, nothing changed, when a host did not answer",
}


def run(work: Path, playbook: str, *args: str) -> subprocess.CompletedProcess[str]:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
             "metaq_root": str(work / "root")}  # fmt: skip
    # Refused at once: nothing listens on port 1.
    gone = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1}
    inventory = {"all": {"vars": local, "children": {
        "nameservers": {"hosts": {"ns1": {}, "ns2": gone}},
        "brokers": {"hosts": {"a0": {"metaq_broker_role": "master"},
                              "a1": {"metaq_broker_role": "slave"}}},
    }}}  # fmt: skip
    (work / "hosts.yml").write_text(json.dumps(inventory))
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
