"""The chaos suite's library lives beside its tests; make it importable (tests import in
importlib mode, so this folder is not on sys.path by itself), and bench/ too: its Kafka
and RocketMQ systems run the benchmark peers' modules, which import each other by name."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for folder in (str(HERE), str(HERE.parents[2] / "bench")):
    if folder not in sys.path:
        sys.path.insert(0, folder)
