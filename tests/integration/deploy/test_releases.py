"""A host's old releases pruned (roles/metaq_common/tasks/prune.yml, the
``metaq_releases_to_prune`` filter) and the inventory's ``metaq_version`` pin held to
the dist (tasks/version.yml). The filter on its own, and the role's tasks run by
ansible-playbook against directories of the test's own (no lab)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from lab import PLAYBOOKS, run_playbook


@pytest.fixture(scope="module")
def filters() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "metaq_release_filter", PLAYBOOKS / "filter_plugins" / "metaq_release.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RELEASES = ["0.1.0", "0.1.1", "0.2.0", "0.10.0", "0.9.0", "lost+found"]


def test_the_newest_are_kept_by_version_not_by_text(filters: ModuleType) -> None:
    prune = filters.metaq_releases_to_prune
    # Running 0.10.0, installing it again: one more kept, 0.9.0, the newest of the rest.
    assert prune(RELEASES, 2, ["0.10.0", "0.10.0"]) == ["0.1.0", "0.1.1", "0.2.0"]
    assert prune(RELEASES, 3, ["0.10.0", "0.10.0"]) == ["0.1.0", "0.1.1"]


def test_the_running_and_the_new_release_always_stay(filters: ModuleType) -> None:
    prune = filters.metaq_releases_to_prune
    # upgrade.yml installing 0.10.0 beside a host running 0.1.1: both fill keep=2.
    assert prune(RELEASES, 2, ["0.1.1", "0.10.0"]) == ["0.1.0", "0.2.0", "0.9.0"]
    # keep=1 cannot drop either of them.
    assert prune(RELEASES, 1, ["0.1.1", "0.10.0"]) == ["0.1.0", "0.2.0", "0.9.0"]
    # A host with no current release yet.
    assert prune(["0.1.0", "0.2.0"], 2, ["", "0.3.0"]) == ["0.1.0"]


def test_keep_must_be_positive(filters: ModuleType) -> None:
    with pytest.raises(ValueError, match="metaq_releases_kept is 0: it must be 1 or more"):
        filters.metaq_releases_to_prune(RELEASES, 0, ["0.2.0"])


def test_the_role_prunes_a_host_s_releases(tmp_path: Path) -> None:
    root = tmp_path / "host"
    releases = root / "opt/metaq/releases"
    for name in ("0.1.0", "0.1.1", "0.2.0", "0.3.0", "backup"):
        (releases / name / "venv").mkdir(parents=True)
    (root / "opt/metaq/current").symlink_to(releases / "0.2.0")
    prune = {"name": "Prune",
             "ansible.builtin.include_role": {"name": "metaq_common",
                                              "tasks_from": "prune.yml"}}  # fmt: skip

    # upgrade.yml's install of 0.3.0 on a host running 0.2.0, the default keep (2).
    run = run_playbook(tmp_path, [prune], metaq_root=str(root), metaq_version="0.3.0",
                       metaq_dist_version="0.3.0")  # fmt: skip

    assert run.returncode == 0, run.stdout + run.stderr
    assert sorted(path.name for path in releases.iterdir()) == ["0.2.0", "0.3.0", "backup"]
    assert (root / "opt/metaq/current").resolve() == releases / "0.2.0"


def test_a_dist_other_than_the_pinned_version_is_refused(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "VERSION").write_text("0.3.0\n")
    check = {"name": "Check the version",
             "ansible.builtin.include_role": {"name": "metaq_common",
                                              "tasks_from": "version.yml"}}  # fmt: skip
    root = str(tmp_path / "host")

    pinned_other = run_playbook(tmp_path, [check], metaq_root=root, metaq_dist_dir=str(dist),
                                metaq_version="0.2.0")  # fmt: skip
    assert pinned_other.returncode != 0, pinned_other.stdout
    assert (f"The inventory pins metaq_version 0.2.0 and the dist ({dist}) is 0.3.0, so nothing "
            "was installed") in pinned_other.stdout, pinned_other.stdout  # fmt: skip

    for pin in ({"metaq_version": "0.3.0"}, {}):
        run = run_playbook(tmp_path, [check], metaq_root=root, metaq_dist_dir=str(dist), **pin)
        assert run.returncode == 0, (pin, run.stdout)
