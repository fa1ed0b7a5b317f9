"""The deploy test's lab lives beside it and uses the chaos suite's network namespaces;
make both importable (tests import in importlib mode, so these folders are not on
sys.path by themselves). ``lab``: one lab per test module that asks for it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parent / "chaos"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from lab import REPO, Lab, unavailable  # noqa: E402  (importable once the path is set)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    why = unavailable()
    if why:
        pytest.skip(why)
    work = tmp_path_factory.mktemp("deploy-lab")
    dist = work / "dist"
    started = time.monotonic()
    subprocess.run([sys.executable, str(REPO / "deploy" / "build_dist.py"), "--out", str(dist)],
                   check=True, capture_output=True)  # fmt: skip
    print(f"make dist: {time.monotonic() - started:.1f} s")
    made = Lab.create(work, dist)
    try:
        yield made
    finally:
        made.destroy()
