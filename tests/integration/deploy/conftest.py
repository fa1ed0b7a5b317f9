"""The deploy test's lab lives beside it and uses the chaos suite's network namespaces;
make both importable (tests import in importlib mode, so these folders are not on
sys.path by themselves)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parent / "chaos"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
