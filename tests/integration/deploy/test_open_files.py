"""Where the hard open-file limit is below metaq_nofile (a container's), the control
script starts the service with as many as it allows and says so, in the service's log
and in the play. Run by ansible-playbook on this machine (no lab): the role's service
tasks start a stand-in program with start-stop-daemon and stop it again."""

from __future__ import annotations

import resource
import shutil
import subprocess
from pathlib import Path

import pytest
from lab import run_playbook

HARD = resource.getrlimit(resource.RLIMIT_NOFILE)[1]


@pytest.mark.skipif(shutil.which("start-stop-daemon") is None, reason="needs start-stop-daemon")
@pytest.mark.skipif(HARD == resource.RLIM_INFINITY, reason="no hard open-file limit here")
def test_a_hard_limit_below_metaq_nofile_is_said_in_the_log_and_the_play(tmp_path: Path) -> None:
    root = tmp_path / "host"
    for folder in ("etc/metaq", "run/metaq", "var/log/metaq", "var/lib/metaq"):
        (root / folder).mkdir(parents=True)
    program = root / "opt/metaq/current/venv/bin/metaq-broker"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\nexec sleep 60\n")
    program.chmod(0o755)
    ctl = root / "etc/metaq/metaq-broker.ctl"
    tasks = [
        {"name": "Load the broker role", "ansible.builtin.include_role": {
            "name": "metaq_broker", "tasks_from": "noop.yml", "public": True}},
        {"name": "Install and start the service", "ansible.builtin.include_role": {
            "name": "metaq_common", "tasks_from": "service.yml"},
         "vars": {"metaq_service": "broker", "metaq_service_ctl": str(ctl),
                  "metaq_service_settings": {}}},
    ]  # fmt: skip
    try:
        run = run_playbook(tmp_path, tasks, metaq_root=str(root), metaq_user="root",
                           metaq_group="root", metaq_use_systemd=False,
                           metaq_nofile=HARD * 2)  # fmt: skip

        assert run.returncode == 0, run.stdout + run.stderr
        assert (f"WARNING: metaq-broker on localhost gets at most {HARD} open files (the hard "
                f"limit), below metaq_nofile {HARD * 2}") in run.stdout, run.stdout  # fmt: skip
        log = (root / "var/log/metaq/broker.log").read_text()
        assert (f"metaq-broker: open files limited to {HARD} by the hard limit, below "
                f"metaq_nofile {HARD * 2}") in log, log  # fmt: skip
    finally:
        if ctl.exists():
            subprocess.run([str(ctl), "stop"], capture_output=True, timeout=90, check=False)
