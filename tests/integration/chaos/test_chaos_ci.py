"""The CI selection of the chaos suite: scenarios 1-4 with a fixed seed (docs/chaos.md).

Each builds its own cluster on network namespaces (loopback when they cannot be made),
runs the workload through its faults, and fails on any invariant the checker finds
broken; the checker's table is printed either way. ``make chaos`` runs every scenario.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from chaoslib.scenarios import SCENARIOS, run_scenario

SEED = 20240605


@pytest.mark.parametrize("number", [1, 2, 3, 4], ids=lambda n: SCENARIOS[n].name)
@pytest.mark.timeout(240)
def test_chaos_scenario_keeps_every_invariant(number: int, tmp_path: Path) -> None:
    scenario = SCENARIOS[number]
    result = run_scenario(scenario, tmp_path / scenario.name, seed=SEED + number, short=True)
    print(result.table())
    if result.skipped:
        pytest.skip(result.skipped)
    assert not result.violations, f"{scenario.summary}:\n{result.table()}"
