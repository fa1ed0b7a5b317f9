"""The benchmark peers' modules live in bench/ and import each other by bare name; make
that folder importable (tests import in importlib mode, so it is not on sys.path)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = str(Path(__file__).resolve().parents[3] / "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)
