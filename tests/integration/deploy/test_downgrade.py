"""A dist older than the release a host runs is refused before anything is installed
(site.yml through metaq_common, upgrade.yml before its install), unless
metaq_allow_downgrade says the rollback is meant. Versions compare as PEP 440 has them.
Run by ansible-playbook against this machine (no lab)."""

from __future__ import annotations

from pathlib import Path

from lab import run_playbook


def host_running(root: Path, version: str) -> Path:
    (root / "opt/metaq/releases" / version).mkdir(parents=True)
    (root / "opt/metaq/current").symlink_to(root / "opt/metaq/releases" / version)
    return root


# The dist is of the version each test names (the pin check: test_releases.py).
SAME_DIST = "{{ metaq_version }}"
CHECK = {"name": "Refuse a downgrade",
         "ansible.builtin.include_role": {"name": "metaq_common",
                                          "tasks_from": "version.yml"}}  # fmt: skip


def test_an_older_dist_is_refused_saying_both_versions(tmp_path: Path) -> None:
    root = host_running(tmp_path / "host", "0.2.0")

    run = run_playbook(tmp_path, [CHECK], metaq_root=str(root), metaq_version="0.1.0",
                       metaq_dist_dir="/dists/old", metaq_dist_version=SAME_DIST)  # fmt: skip

    assert run.returncode != 0, run.stdout
    assert ("localhost runs metaq 0.2.0 and the dist (/dists/old) is 0.1.0, an older release, "
            "so nothing was installed") in run.stdout, run.stdout  # fmt: skip
    assert "-e metaq_allow_downgrade=true" in run.stdout


def test_a_newer_or_equal_dist_or_a_meant_rollback_goes_on(tmp_path: Path) -> None:
    root = host_running(tmp_path / "host", "0.2.0")
    cases = [
        {"metaq_version": "0.2.0"},
        {"metaq_version": "0.2.0.post1"},
        {"metaq_version": "0.10.0"},  # newer, though it sorts first as text
        {"metaq_version": "0.1.0", "metaq_allow_downgrade": True},
    ]
    tasks = [{**CHECK, "name": f"Check {case}", "vars": case} for case in cases]

    run = run_playbook(tmp_path, tasks, metaq_root=str(root), metaq_dist_dir="/dists/x",
                       metaq_dist_version=SAME_DIST)  # fmt: skip

    assert run.returncode == 0, run.stdout
    assert run.stdout.count("Refuse to install a release older than the one the host runs") == 4


def test_a_host_with_no_release_yet_goes_on(tmp_path: Path) -> None:
    run = run_playbook(tmp_path, [CHECK], metaq_root=str(tmp_path / "new-host"),
                       metaq_version="0.1.0", metaq_dist_dir="/dists/x",
                       metaq_dist_version=SAME_DIST)  # fmt: skip
    assert run.returncode == 0, run.stdout
