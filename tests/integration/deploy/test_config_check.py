"""The roles' config task judges a new config with the program's own loader before it
replaces the old one (``metaq-<service> --check-config``): a bad value fails the task
with the loader's message and leaves the file a running process started from as it was,
so nothing is noted for a restart. Run by ansible-playbook against this machine (no lab);
the lab test (test_deploy_safety.py) shows the running broker staying up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lab import VENV_BIN, run_playbook

GOOD = {
    "broker": {"broker_name": "broker-a", "data_port": 10911, "store": {"retention_hours": 72}},
    "nameserver": {"grpc_port": 9876, "controller_dir": "/var/lib/metaq/nameserver"},
}
MISTAKE = {"broker": ("bogus_key", 1), "nameserver": ("grcp_port", 9877)}


def render(work: Path, root: Path, service: str, settings: dict[str, Any]) -> Any:
    tasks = [
        # The service role's handlers take what the config task notifies.
        {"name": "Load the service role", "ansible.builtin.include_role": {
            "name": f"metaq_{service}", "tasks_from": "noop.yml", "public": True}},
        {"name": "Render the config", "ansible.builtin.include_role": {
            "name": "metaq_common", "tasks_from": "config.yml"},
         "vars": {"metaq_service": service, "metaq_service_settings": settings}},
    ]  # fmt: skip
    return run_playbook(work, tasks, metaq_root=str(root), metaq_group="root")


@pytest.mark.parametrize("service", ["broker", "nameserver"])
def test_a_config_the_program_refuses_fails_the_task_and_keeps_the_old_file(
    tmp_path: Path, service: str
) -> None:
    root = tmp_path / "host"
    (root / "etc/metaq").mkdir(parents=True)
    # The release the service runs: this checkout's venv, whose loader judges the file.
    (root / "opt/metaq/current").mkdir(parents=True)
    (root / "opt/metaq/current/venv").symlink_to(VENV_BIN.parent)
    config = root / "etc/metaq" / f"{service}.toml"

    first = render(tmp_path, root, service, GOOD[service])
    assert first.returncode == 0, first.stdout + first.stderr
    before = config.read_text()

    key, value = MISTAKE[service]
    second = render(tmp_path, root, service, {**GOOD[service], key: value})

    assert second.returncode != 0, second.stdout
    assert "failed to validate" in second.stdout, second.stdout
    assert f"{key}: unknown key '{key}'" in second.stdout, second.stdout
    assert config.read_text() == before
    assert "RUNNING HANDLER" not in second.stdout, second.stdout
