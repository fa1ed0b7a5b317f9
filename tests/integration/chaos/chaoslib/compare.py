"""The figures of ``make bench-failover-compare`` from each system's checked history: per
system, the time from each kill to the next acknowledged send (p50 and max, nearest
rank, as the checker's own figures) and the acknowledged messages lost, and metaq's p50
as a ratio of each peer's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from chaoslib.checker import Result, percentile

SYSTEMS: Final = ("metaq", "rocketmq", "kafka")
PEERS: Final = ("rocketmq", "kafka")


def failover_figures(results: Mapping[str, Result]) -> dict[str, Any]:
    """The last line's keys for the systems that ran; a loss count only for a run that
    completed, a ratio only when both sides have a p50 and the peer's is not zero."""
    figures: dict[str, Any] = {}
    for system, result in results.items():
        if system not in SYSTEMS:
            raise ValueError(f"unknown system {system!r}: expected one of {', '.join(SYSTEMS)}")
        resumes = result.failover_resumes
        figures[f"kills_{system}"] = sum(1 for w in result.windows if w.failover)
        figures[f"failover_p50_s_{system}"] = round(percentile(resumes, 50), 3) if resumes else None
        figures[f"failover_max_s_{system}"] = round(max(resumes), 3) if resumes else None
        completed = _completed(result)
        figures[f"completed_{system}"] = completed
        figures[f"lost_acked_{system}"] = len(result.lost) if completed else None
        figures[f"violations_{system}"] = len(result.violations)
    for peer in PEERS:
        ours, theirs = figures.get("failover_p50_s_metaq"), figures.get(f"failover_p50_s_{peer}")
        figures[f"failover_p50_vs_{peer}_ratio"] = (
            round(ours / theirs, 4) if ours is not None and theirs else None
        )
    return figures


def _completed(result: Result) -> bool:
    """Whether the run got to its read: one that broke off (a peer that would not start,
    a round that gave up) read nothing, so its unread messages are not losses."""
    return result.acknowledged > 0 and not any(
        c["name"] == "scenario-completed" and not c["ok"] for c in result.checks
    )


def table(results: Mapping[str, Result]) -> str:
    """One markdown row per system: kills, kill to next ack p50/max, acknowledged, lost
    (``-`` for a run that broke off)."""
    rows = [
        "| system | kills | kill → next ack p50 s | max s | acknowledged | lost | violations |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for system, result in results.items():
        resumes = result.failover_resumes
        p50 = f"{percentile(resumes, 50):.2f}" if resumes else "-"
        top = f"{max(resumes):.2f}" if resumes else "-"
        kills = sum(1 for w in result.windows if w.failover)
        lost = len(result.lost) if _completed(result) else "-"
        rows.append(f"| {system} | {kills} | {p50} | {top} | {result.acknowledged:,} "
                    f"| {lost} | {len(result.violations)} |")  # fmt: skip
    return "\n".join(rows)
