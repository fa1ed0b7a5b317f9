"""Where the services' logs go, bounded (docs/deploy.md, "Logs"), run by ansible-playbook
against files of the test's own (no lab):

- without systemd, the role's logrotate file, run by the real ``logrotate`` on a log a
  process holds open for appending, as the control script's start-stop-daemon does:
  the old lines move to the rotated file and the process's next lines start the log
  again (copytruncate; a rename would leave it writing to the rotated file);
- under systemd, the journald drop-in, in ``--check --diff`` mode: the bounds it would
  write, the journald restart reached and, in check mode, nothing written or restarted.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lab import run_playbook

LOGROTATE = shutil.which("logrotate") or "/usr/sbin/logrotate"
LOGS = {"name": "Bound the logs",
        "ansible.builtin.include_role": {"name": "metaq_common",
                                         "tasks_from": "logs.yml"}}  # fmt: skip
# Appends a line for each line it reads, to a file it opened once for appending.
WRITER = ("import sys\n"
          "log = open(sys.argv[1], 'a', buffering=1)\n"
          "for line in sys.stdin:\n"
          "    log.write(line)\n"
          "    print('ok', flush=True)\n")  # fmt: skip


@pytest.mark.skipif(not Path(LOGROTATE).exists(),
                    reason="needs logrotate (make ci-deps installs it)")  # fmt: skip
def test_logrotate_copies_and_truncates_a_log_held_open_for_appending(tmp_path: Path) -> None:
    root = tmp_path / "host"
    logs = tmp_path / "log"
    logs.mkdir()
    run = run_playbook(tmp_path, [LOGS], metaq_root=str(root), metaq_log_dir=str(logs),
                       metaq_use_systemd=False, metaq_user="root", metaq_group="root")  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    conf = root / "etc/logrotate.d/metaq"
    assert "copytruncate" in conf.read_text(), conf.read_text()
    assert not (root / "etc/systemd").exists()

    log = logs / "broker.log"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(log)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert writer.stdin is not None and writer.stdout is not None

    def write(line: str) -> None:
        assert writer.stdin is not None and writer.stdout is not None
        writer.stdin.write(line + "\n")
        writer.stdin.flush()
        assert writer.stdout.readline() == "ok\n"

    try:
        write("before the rotation")
        rotated = subprocess.run(
            [LOGROTATE, "--force", "--state", str(tmp_path / "state"), str(conf)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert rotated.returncode == 0, rotated.stdout + rotated.stderr
        write("after the rotation")
    finally:
        writer.stdin.close()
        writer.wait(timeout=30)
        writer.stdout.close()
    assert (logs / "broker.log.1").read_text() == "before the rotation\n"
    # Appending: the next line lands at the start of the truncated file, no hole before it.
    assert log.read_text() == "after the rotation\n"


def test_journald_is_bounded_under_systemd(tmp_path: Path) -> None:
    root = tmp_path / "host"
    (root / "etc/systemd/journald.conf.d").mkdir(parents=True)
    run = run_playbook(tmp_path, [LOGS], "--check", "--diff", metaq_root=str(root),
                       metaq_use_systemd=True)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    for line in ("+[Journal]", "+Compress=yes", "+MaxRetentionSec=14day", "+SystemKeepFree=10%",
                 "+SystemMaxUse=4G"):  # fmt: skip
        assert line in run.stdout, run.stdout
    assert "RUNNING HANDLER [metaq_common : Restart journald]" in run.stdout, run.stdout
    # The drop-in is the one change: no logrotate file where systemd runs.
    assert "changed=1 " in run.stdout, run.stdout
    assert not any(root.rglob("*.conf")), list(root.rglob("*"))
