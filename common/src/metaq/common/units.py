"""Quantities as operators read them, the same in refusals, the console and the CLI."""

from __future__ import annotations

from typing import Final

_MIB: Final = 1 << 20
_GIB: Final = 1 << 30


def size_text(nbytes: int) -> str:
    """Bytes in GiB from 1 GiB up, else in MiB, to one decimal: ``42.0 GiB``."""
    if nbytes >= _GIB:
        return f"{nbytes / _GIB:.1f} GiB"
    return f"{nbytes / _MIB:.1f} MiB"
