"""Sparklines drawn on the server as inline SVG: no script, no library, readable by a
screen reader from its label."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from metaq.nameserver.console.page import Html, esc

WIDTH: Final = 120
HEIGHT: Final = 24


def sparkline(values: Sequence[float | None], label: str, unit: str = "") -> Html:
    """A line through ``values`` (oldest first; None leaves a gap), scaled from zero to
    the largest, with ``label`` and the latest, lowest and highest values as its name."""
    known = [v for v in values if v is not None]
    if len(values) < 2 or not known:
        return Html('<span class="muted">collecting…</span>')
    top = max(known) or 1.0
    step = WIDTH / (len(values) - 1)
    lines: list[list[str]] = [[]]
    for i, value in enumerate(values):
        if value is None:
            lines.append([])
            continue
        y = HEIGHT - 1 - (HEIGHT - 2) * value / top
        lines[-1].append(f"{i * step:.1f},{y:.1f}")
    paths = "".join(
        f'<polyline points="{" ".join(points)}"/>' for points in lines if len(points) > 1
    )
    name = (
        f"{label}: now {_num(known[-1])}{unit}, lowest {_num(min(known))}{unit}, "
        f"highest {_num(max(known))}{unit}"
    )
    return Html(
        f'<svg class="spark" role="img" aria-label="{esc(name)}" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}"><title>{esc(name)}</title>'
        f"{paths}</svg>"
    )


def _num(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 or value == int(value) else f"{value:.1f}"
