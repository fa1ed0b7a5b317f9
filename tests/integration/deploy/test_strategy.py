"""The playbooks' strategy (deploy/ansible/strategy_plugins/metaq_linear.py): their tasks
run over mitogen when the control machine has it, which most of a deploy run's time
depends on, and over plain ssh, with a warning saying so, when it does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from lab import PLAYBOOKS

STRATEGY = PLAYBOOKS / "strategy_plugins" / "metaq_linear.py"


def test_the_playbooks_run_their_tasks_over_mitogen(tmp_path: Path) -> None:
    # mitogen_get_stack is mitogen's own action: it exists only once mitogen runs the play
    # (hence included at run time, not parsed with the playbook), and answers with the
    # connections a task goes through.
    (tmp_path / "stack.yml").write_text(json.dumps([
        {"name": "Ask mitogen", "mitogen_get_stack": {}, "register": "stack"},
        {"name": "Show it", "ansible.builtin.debug": {"var": "stack.result"}},
    ]))  # fmt: skip
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps([{
        "name": "Which connection runs the tasks",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "vars": {"ansible_python_interpreter": sys.executable},
        "tasks": [{"name": "Include",
                   "ansible.builtin.include_tasks": str(tmp_path / "stack.yml")}],
    }]))  # fmt: skip
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        "ANSIBLE_NOCOLOR": "1",
    }
    ansible = Path(sys.executable).with_name("ansible-playbook")
    done = subprocess.run(
        [str(ansible), "-i", "localhost,", str(playbook)],
        capture_output=True, text=True, env=env, cwd=PLAYBOOKS, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "mitogen is not importable" not in done.stdout + done.stderr
    assert '"method": "local"' in done.stdout, done.stdout[-3000:]


def test_without_mitogen_the_plays_run_over_plain_ssh_and_say_so() -> None:
    # A control machine without mitogen: the same strategy name loads Ansible's own linear.
    probe = (
        "import importlib.util, sys\n"
        "sys.modules['ansible_mitogen'] = None\n"
        f"spec = importlib.util.spec_from_file_location('metaq_linear', {str(STRATEGY)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print(module.StrategyModule.__module__)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ansible.plugins.strategy.linear"], done.stdout
    assert "mitogen is not importable" in done.stderr
    assert "ANSIBLE_STRATEGY=linear" in done.stderr
