"""The chaos suite's library lives beside its tests; make it importable (tests import in
importlib mode, so this folder is not on sys.path by itself)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
