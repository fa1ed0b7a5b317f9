"""The playbooks' tags (docs/deploy.md, "Tags"), as ``ansible-playbook --list-tags`` and
``--list-tasks --tags`` read them (no host is touched): ``binaries``, ``config``, ``tls``,
``monitoring``, ``firewall`` and ``restart`` each where their tasks are, and the checks and variable
loads every partial run needs tagged ``always``."""

from __future__ import annotations

import re
import subprocess

import pytest
from lab import PLAYBOOKS, VENV_BIN

PLAY = re.compile(
    r"^\s*play #\d+ \([^)]*\): (?P<name>.*?)\tTAGS: .*\n\s*TASK TAGS: \[(?P<tags>.*)\]$",
    re.MULTILINE,
)


def ansible(*args: str) -> str:
    done = subprocess.run([str(VENV_BIN / "ansible-playbook"), *args], capture_output=True,
                          text=True, cwd=PLAYBOOKS, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def task_tags(playbook: str) -> dict[str, set[str]]:
    """Each play's name (the last of that name, for a play imported twice) and the tags of
    its tasks."""
    found = {m["name"]: {t.strip() for t in m["tags"].split(",") if t.strip()}
             for m in PLAY.finditer(ansible("--list-tags", playbook))}  # fmt: skip
    assert found, playbook
    return found


def test_site_tags_each_kind_of_change_and_restarts_what_it_changed() -> None:
    plays = task_tags("site.yml")
    assert {"binaries", "config", "tls", "monitoring"} <= plays[
        "Install the release and the secret on every host"]  # fmt: skip
    for play in ("Nameservers", "Brokers deployed as masters", "Brokers deployed as slaves"):
        assert plays[play] == {"always", "config"}, (play, plays[play])
    # The restarts run under any of the tags that note a change, and under restart.
    assert {"restart", "config", "binaries", "tls", "monitoring"} <= plays["Brokers, one at a time"]
    for play in ("Check the inventory", "Check every host answers before touching any",
                 "Sort brokers by their deployed role"):  # fmt: skip
        assert "always" in plays[play], (play, plays[play])
    assert plays["Firewall the cluster's ports"] == {"always", "firewall"}
    assert plays["Prometheus for the cluster"] == {"always", "monitoring"}


def test_renew_certs_renews_under_tls_and_restarts_under_restart() -> None:
    plays = task_tags("renew_certs.yml")
    assert plays["Renew the certificates that end soon"] == {"always", "tls"}
    assert {"restart", "tls"} <= plays["Brokers, one at a time"]


@pytest.mark.parametrize("playbook", ["rolling_restart.yml", "upgrade.yml"])
def test_the_rolling_playbooks_restart_under_restart(playbook: str) -> None:
    plays = task_tags(playbook)
    for play in ("Check the cluster is whole and order the brokers, slaves first",
                 "Nameservers, one at a time", "Brokers, one at a time"):  # fmt: skip
        assert "restart" in plays[play], (play, plays[play])
    assert plays["Check every host answers before touching any"] >= {"always"}


def test_upgrade_installs_under_binaries_and_scale_out_creates_topics_under_config() -> None:
    assert "binaries" in task_tags("upgrade.yml")["Install the new release beside the running one"]
    assert "config" in task_tags("scale_out.yml")["Give existing topics queues on the new groups"]


@pytest.mark.parametrize(
    ("tag", "runs", "skips"),
    [
        ("tls", "Install the CA, this host's certificate and its key", "Install metaq into the"),
        ("binaries", "Install metaq into the release's venv", "Install the cluster secret (mode"),
        ("config", "Install the cluster secret", "Make the cluster's CA"),
        ("monitoring", "Install the metrics secret", "Install the cluster secret (mode"),
    ],
)
def test_a_tagged_site_run_keeps_its_checks_and_leaves_the_rest(tag: str, runs: str,
                                                                 skips: str) -> None:  # fmt: skip
    listed = ansible("--list-tasks", "--tags", tag, "site.yml")
    assert runs in listed and skips not in listed, listed
    # The inventory check and the connection check run whatever the tags.
    assert "Check the inventory's groups and metaq_* variables" in listed, listed
    assert "Connect to the host" in listed, listed
