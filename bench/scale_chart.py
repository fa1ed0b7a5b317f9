"""The panels of one ``make bench-scale`` dimension, before and after, as one PNG."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def draw(
    rows: Sequence[dict[str, Any]],
    before: Sequence[dict[str, Any]],
    x_key: str,
    panels: Sequence[tuple[str, str]],
    title: str,
    path: Path,
    *,
    columns: int = 4,
) -> None:
    """One panel per (key, title), ``x_key`` on a log axis; rows lacking a key are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = -(-len(panels) // columns)
    figure, axes = plt.subplots(
        lines, columns, figsize=(4.25 * columns, 3.5 * lines), squeeze=False
    )
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (key, panel_title) in zip(axes.flat, panels, strict=False):
        for series, label, style in ((before, "before", "o--"), (rows, "after", "o-")):
            points = [(r[x_key], r[key]) for r in series if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points, strict=True), style, label=label)
        ax.set_xscale("log")
        ax.set_title(panel_title)
        ax.set_xlabel(x_key)
        ax.grid(True, alpha=0.3)
        if before:
            ax.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
