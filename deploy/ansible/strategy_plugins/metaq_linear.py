"""``metaq_linear``: Ansible's linear strategy, run over mitogen when the control machine
has it (uv.lock's dev group pins it), else the plain one over ssh, with a warning.

Over plain ssh every task is, on every host, an ssh session that starts a new Python and
unpacks the module into it; mitogen keeps one Python per host for the whole run and runs
the modules in it. ansible.cfg makes this the default strategy; ``ANSIBLE_STRATEGY=linear``
runs plain ssh whatever is installed (docs/deploy.md).
"""

from __future__ import annotations

import importlib
from typing import Any

MITOGEN: str = "ansible_mitogen.plugins.strategy.mitogen_linear"
PLAIN: str = "ansible.plugins.strategy.linear"


def _strategy() -> Any:
    try:
        return importlib.import_module(MITOGEN).StrategyModule
    except ImportError as error:
        display = importlib.import_module("ansible.utils.display").Display()
        display.warning(
            f"mitogen is not importable ({error}): the plays run over plain ssh, several "
            "times slower per task. Install the version uv.lock pins (pip install mitogen) "
            "on the control machine, or set ANSIBLE_STRATEGY=linear to silence this."
        )
        return importlib.import_module(PLAIN).StrategyModule


StrategyModule = _strategy()
