"""The consumer's malloc thresholds: buffers come from the heap and freed memory stays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

PROBE = textwrap.dedent(
    """
    import ctypes, json, sys
    from metaq.client.malloc import keep_freed_memory

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    applied = [keep_freed_memory() for _ in range(2)] if sys.argv[1] == "on" else []
    before = libc.mallinfo2().hblks  # allocations the kernel mapped on their own
    big = bytearray(2 * 1024 * 1024)  # a pull's answer or two
    mapped = libc.mallinfo2().hblks - before
    heap = [bytearray(1024 * 1024) for _ in range(32)]
    del heap  # 32 MiB freed at the top of the heap
    kept = libc.mallinfo2().keepcost  # what the heap still holds at its top
    print(json.dumps({"applied": applied, "mapped": mapped, "kept": kept}))
    """
)


def probe(mode: str, **env: str) -> dict[str, Any]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], env={**environ, **env}, check=True,
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    result: dict[str, Any] = json.loads(out)
    return result


pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="glibc's malloc",
)


def test_buffers_come_from_the_heap_and_freed_memory_stays_there() -> None:
    default = probe("off")
    tuned = probe("on")

    assert tuned["applied"] == [True, False]  # once per process
    assert default["mapped"] == 1 and tuned["mapped"] == 0
    assert default["kept"] < 1 << 20 and tuned["kept"] >= 32 << 20


def test_an_environment_that_sets_malloc_itself_is_left_alone() -> None:
    for env in ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"},
                {"MALLOC_TRIM_THRESHOLD_": "1048576"}):  # fmt: skip
        result = probe("on", **env)
        assert result["applied"] == [False, False]
        assert result["mapped"] == 1
