"""What the lab cannot run, exercised without touching this machine: the lab has no
systemd (network namespaces, no init) and the ``vm.*`` sysctls are global to the kernel.

- The role's systemd unit, rendered by ansible-playbook from the role's template and
  defaults, passes ``systemd-analyze verify`` (which reads unit files offline, no
  running systemd needed): every key known, ``ExecStart`` an executable that exists, the
  broker's ``LimitNICE`` a value systemd takes, the hardening keys (``ProtectSystem=strict``
  with only the state, data and log directories writable, ``MemoryMax`` from
  ``metaq_memory_max``) values systemd takes.
- The role's OS-tuning tasks (``metaq_tune_os: true``), run in ``--check --diff`` mode
  against this machine: the diff shows the sysctls and open-file limits they would
  write, the handler that would apply the sysctls is reached and, in check mode, runs
  nothing; no file is written.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from lab import PLAYBOOKS, VENV_BIN, run_playbook

SYSTEMD_ANALYZE = "/usr/bin/systemd-analyze"


@pytest.mark.skipif(not Path(SYSTEMD_ANALYZE).exists(),
                    reason="needs systemd-analyze (make ci-deps installs systemd)")  # fmt: skip
def test_the_role_s_systemd_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    root = tmp_path / "host"
    # ExecStart must name an executable: the release's venv is this checkout's.
    (root / "opt/metaq/current").mkdir(parents=True)
    (root / "opt/metaq/current/venv").symlink_to(VENV_BIN.parent)
    units = tmp_path / "units"
    units.mkdir()
    render = [
        {"name": f"Render the {service} unit",
         "ansible.builtin.template": {
             "src": str(PLAYBOOKS / "roles/metaq_common/templates/service.unit.j2"),
             "dest": f"{units}/metaq-{service}.service", "mode": "0644"},
         "vars": {"metaq_service": service, "metaq_service_settings": settings}}
        for service, settings in (
            ("nameserver", {"controller_dir": f"{root}/var/lib/metaq/nameserver/controller"}),
            ("broker", {"nice": -5, "data_dir": "/srv/metaq-data"}),
        )
    ]  # fmt: skip
    run = run_playbook(tmp_path, render, metaq_root=str(root), metaq_user="root",
                       metaq_group="root", metaq_memory_max="6G")  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    for service in ("nameserver", "broker"):
        unit = units / f"metaq-{service}.service"
        text = unit.read_text()
        assert "Restart=on-failure" in text and "LimitNOFILE=131072" in text, text
        # The broker may take the CPU priority it is configured with; the nameserver keeps 0.
        assert ("LimitNICE=-5" in text) == (service == "broker"), text
        for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
                     "PrivateTmp=yes", "MemoryMax=6G"):  # fmt: skip
            assert f"\n{line}\n" in text, text
        # Writable: the state and log directories, and a data directory set elsewhere.
        writable = [f"{root}/var/lib/metaq", f"{root}/var/log/metaq"]
        writable += ["/srv/metaq-data"] if service == "broker" else []
        assert f"\nReadWritePaths={' '.join(writable)}\n" in text, text
        verify = subprocess.run(
            [SYSTEMD_ANALYZE, "verify", "--man=no", str(unit)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        # verify warns on stderr (an unknown key, a missing binary) and still exits 0.
        assert verify.returncode == 0 and verify.stderr == "", f"{unit}:\n{text}\n{verify.stderr}"


def test_memory_max_is_unlimited_unless_set(tmp_path: Path) -> None:
    unit = tmp_path / "metaq-broker.service"
    render = [{"name": "Render the broker unit",
               "ansible.builtin.template": {
                   "src": str(PLAYBOOKS / "roles/metaq_common/templates/service.unit.j2"),
                   "dest": str(unit), "mode": "0644"},
               "vars": {"metaq_service": "broker", "metaq_service_settings": {}}}]  # fmt: skip
    run = run_playbook(tmp_path, render, metaq_root=str(tmp_path / "host"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "\nMemoryMax=infinity\n" in unit.read_text(), unit.read_text()


def test_os_tuning_in_check_mode_shows_the_sysctls_and_limits_and_writes_nothing(
    tmp_path: Path,
) -> None:
    root = tmp_path / "host"
    for folder in ("etc/sysctl.d", "etc/security/limits.d"):
        (root / folder).mkdir(parents=True)
    tune = [{"name": "Tune the OS", "ansible.builtin.include_role": {
        "name": "metaq_common", "tasks_from": "tune.yml"}}]  # fmt: skip
    run = run_playbook(tmp_path, tune, "--check", "--diff", metaq_root=str(root),
                       metaq_user="metaq")  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    for line in ("+vm.dirty_background_ratio = 10", "+vm.dirty_ratio = 40",
                 "+vm.max_map_count = 655360", "+vm.swappiness = 0",
                 "+metaq soft nofile 131072", "+metaq hard nofile 131072"):  # fmt: skip
        assert line in run.stdout, run.stdout
    assert "RUNNING HANDLER [metaq_common : Apply sysctl settings]" in run.stdout, run.stdout
    assert "changed=" in run.stdout and "failed=0" in run.stdout, run.stdout
    assert not any(root.rglob("*.conf")), list(root.rglob("*"))
