"""The side-by-side benchmark's output: a markdown table, a chart and a JSON file of the
raw figures, with metaq's ratio to each peer taken from cells of the same run: one broker
(ASYNC flush) against the one-replica peers, the sync-replicated pair against the
three-replica ones."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from compare_harness import IN_FLIGHT, Latencies
from machine_stalls import Stalls

MODES: Final = ("one_at_a_time", "in_flight", "end_to_end")
MODE_TITLES: Final = {
    "one_at_a_time": "(a) one at a time",
    "in_flight": f"(b) ≤ {IN_FLIGHT:,} in flight",
    "end_to_end": "(c) end to end",
    "pipelined": f"metaq pipelined, {IN_FLIGHT:,} senders",
}
HEADLINE_SIZE: Final = 1024
SATURATED_MS: Final = 100.0
"""An end-to-end p50 above this means the system did not keep up with the offered rate."""
METAQ: Final = "metaq"
METAQ_SYNC: Final = "metaq_sync_replicated"
R3_PEERS: Final = (
    "nats_r3", "rabbitmq_stream_r3", "rabbitmq_quorum_r3", "kafka_r3", "kafka_r3_aiokafka",
)  # fmt: skip
"""Peers replicating three ways, acknowledging once two copies (a majority, or for Kafka's
acks=all every in-sync replica, at least two) hold a message: what metaq's
sync-replicated pair (two copies before the answer) is set against."""
PAIR_PEERS: Final = ("rocketmq_sync_master",)
"""Peers whose master answers once its one slave holds a message too: two copies before
the answer, as metaq's sync-replicated pair."""
REPLICATED_PEERS: Final = R3_PEERS + PAIR_PEERS
ROCKETMQ: Final = "rocketmq"
ROCKETMQ_PYTHON: Final = "rocketmq_python"
ROCKETMQ_SYNC: Final = "rocketmq_sync_master"
TOOL_ROWS: Final = ("kafka_perf", "kafka_r3_perf")
"""A peer's own load generator in another language ((b) only): its servers' capacity,
shown beside the Python clients' rows, not counted among the peers "best" picks from."""
KAFKA: Final = "kafka"
KAFKA_R3: Final = "kafka_r3"
TARGETS: Final = {
    "ratio_vs_rabbitmq_stream_batched": (">=", 1.0),
    "ratio_vs_nats_batched": (">=", 3.0),
    "ratio_vs_nats_sync": (">=", 1.3),
    "e2e_p99_vs_best_peer_ratio": ("<=", 1.0),
    # What auth (users, signed frames) costs: at most 20 % off the plain (b) figure.
    "ratio_auth_vs_plain_batched": (">=", 0.8),
    # What TLS on every listener costs: at most 35 % off the plain (b) figure.
    "ratio_tls_vs_plain_batched": (">=", 0.65),
    "sync_vs_best_r3_batched_ratio": (">=", 1.0),
    "sync_vs_best_r3_one_ratio": (">=", 1.3),
    "sync_e2e_p99_vs_best_r3_ratio": ("<=", 1.0),
    "sync_e2e_p99_vs_best_replicated_ratio": ("<=", 1.0),
    "sync_vs_async_one_ratio": (">=", 0.3),
    "ratio_vs_kafka_batched": (">=", 1.0),
    "ratio_vs_kafka_acks_all_batched": (">=", 1.0),
    "cpu_per_million_vs_kafka_ratio": ("<=", 2.0),
    "send_p50_vs_kafka_ratio": ("<=", 1.0),
    "ratio_vs_rocketmq_python_batched": (">=", 3.0),
    "ratio_vs_rocketmq_sync_master_batched": (">=", 1.0),
    "cpu_per_million_vs_rocketmq_ratio": ("<=", 1.5),
}


@dataclass
class Cell:
    """One measured cell; ``msgs_s`` None when the cell could not run (``note`` says why)."""

    system: str
    mode: str
    size: int
    msgs_s: float | None
    latency: Latencies = field(default_factory=Latencies.none)
    delivered: int | None = None
    sent: int | None = None
    stalls: Stalls | None = None
    """The machine's pauses during an end-to-end cell."""
    cpu_per_million: float | None = None
    """A cost cell's servers' CPU seconds per million acknowledged messages."""
    note: str = ""


@dataclass
class SystemInfo:
    key: str
    label: str
    durability: str
    in_flight_how: str


def _find(cells: Sequence[Cell], system: str, mode: str, size: int) -> Cell | None:
    for cell in cells:
        if (cell.system, cell.mode, cell.size) == (system, mode, size):
            return cell
    return None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or not denominator or math.isnan(denominator):
        return None
    if math.isnan(numerator):
        return None
    ratio = numerator / denominator
    # Three decimals, but never rounded to nothing (a saturated peer's p99 is seconds).
    return round(ratio, 3) if ratio >= 0.01 else float(f"{ratio:.2g}")


def _throughput(cells: Sequence[Cell], system: str, mode: str, size: int) -> float | None:
    cell = _find(cells, system, mode, size)
    return None if cell is None else cell.msgs_s


def _p99(cells: Sequence[Cell], system: str, size: int) -> float | None:
    """A (c) cell's p99, None when it did not run or when more than 1 % of what it sent
    never arrived: the p99 of what did is then no p99 of the run (the missing ones are
    later than the drain allowed), so such a cell is nobody's best."""
    cell = _find(cells, system, "end_to_end", size)
    if cell is None or cell.msgs_s is None:
        return None
    if cell.sent and cell.delivered is not None and cell.sent - cell.delivered > cell.sent / 100:
        return None
    return cell.latency.p99_ms


def ratios(cells: Sequence[Cell], peers: Sequence[str], size: int) -> dict[str, float | None]:
    """metaq ÷ each peer: throughput (higher is better for metaq) and e2e p99 (lower)."""
    out: dict[str, float | None] = {}
    for peer in peers:
        for mode, tag in (("one_at_a_time", "sync"), ("in_flight", "batched")):
            out[f"ratio_vs_{peer}_{tag}"] = _ratio(
                _throughput(cells, METAQ, mode, size), _throughput(cells, peer, mode, size)
            )
        out[f"e2e_p99_vs_{peer}_ratio"] = _ratio(_p99(cells, METAQ, size), _p99(cells, peer, size))
    out["e2e_p99_vs_best_peer_ratio"] = e2e_p99_vs_best(cells, METAQ, peers, size)
    return out


def e2e_p99_vs_best(
    cells: Sequence[Cell], mine: str, peers: Sequence[str], size: int
) -> float | None:
    """``mine``'s end-to-end p99 ÷ the lowest of ``peers``' (those of one durability
    class, so the best is one that makes the same promise); None when either is
    missing."""
    return _ratio(_p99(cells, mine, size), _best([_p99(cells, p, size) for p in peers], min))


def _best(values: Sequence[float | None], pick: Any) -> float | None:
    known = [v for v in values if v is not None and not math.isnan(v)]
    return pick(known) if known else None


def sync_ratios(cells: Sequence[Cell], peers: Sequence[str], size: int) -> dict[str, float | None]:
    """metaq's sync-replicated pair ÷ each three-replica peer and ÷ the best of them
    (the highest throughput, the lowest e2e p99), and ÷ metaq's own one broker (a)."""
    out: dict[str, float | None] = {}
    mine_one = _throughput(cells, METAQ_SYNC, "one_at_a_time", size)
    mine_many = _throughput(cells, METAQ_SYNC, "in_flight", size)
    mine_p99 = _p99(cells, METAQ_SYNC, size)
    for peer in peers:
        out[f"sync_vs_{peer}_one_ratio"] = _ratio(
            mine_one, _throughput(cells, peer, "one_at_a_time", size)
        )
        out[f"sync_vs_{peer}_batched_ratio"] = _ratio(
            mine_many, _throughput(cells, peer, "in_flight", size)
        )
        out[f"sync_e2e_p99_vs_{peer}_ratio"] = _ratio(mine_p99, _p99(cells, peer, size))
    out["sync_vs_best_r3_one_ratio"] = _ratio(
        mine_one, _best([_throughput(cells, p, "one_at_a_time", size) for p in peers], max)
    )
    out["sync_vs_best_r3_batched_ratio"] = _ratio(
        mine_many, _best([_throughput(cells, p, "in_flight", size) for p in peers], max)
    )
    out["sync_e2e_p99_vs_best_r3_ratio"] = _ratio(
        mine_p99, _best([_p99(cells, p, size) for p in peers], min)
    )
    out["sync_vs_async_one_ratio"] = _ratio(
        mine_one, _throughput(cells, METAQ, "one_at_a_time", size)
    )
    return out


def _one_p50(cells: Sequence[Cell], system: str, size: int) -> float | None:
    cell = _find(cells, system, "one_at_a_time", size)
    return None if cell is None or cell.msgs_s is None else cell.latency.p50_ms


def _cpu(cells: Sequence[Cell], system: str, size: int) -> float | None:
    cell = _find(cells, system, "cost", size)
    return None if cell is None else cell.cpu_per_million


def kafka_ratios(cells: Sequence[Cell], size: int) -> dict[str, float | None]:
    """metaq ÷ Kafka through confluent-kafka: (b) of one broker ÷ Kafka's one broker
    (acks=1), (b) of the sync pair ÷ Kafka's three (acks=all), the servers' CPU per
    million acknowledged of the sync pair ÷ Kafka's three, and (a) send p50 of one broker
    ÷ Kafka's one broker."""
    return {
        "ratio_vs_kafka_batched": _ratio(
            _throughput(cells, METAQ, "in_flight", size),
            _throughput(cells, KAFKA, "in_flight", size),
        ),
        "ratio_vs_kafka_acks_all_batched": _ratio(
            _throughput(cells, METAQ_SYNC, "in_flight", size),
            _throughput(cells, KAFKA_R3, "in_flight", size),
        ),
        "cpu_per_million_vs_kafka_ratio": _ratio(
            _cpu(cells, METAQ_SYNC, size), _cpu(cells, KAFKA_R3, size)
        ),
        "send_p50_vs_kafka_ratio": _ratio(
            _one_p50(cells, METAQ, size), _one_p50(cells, KAFKA, size)
        ),
    }


def rocketmq_ratios(cells: Sequence[Cell], size: int) -> dict[str, float | None]:
    """metaq ÷ RocketMQ 5: (b) of one broker ÷ RocketMQ's one broker through its Python
    client and its Java client, (b) of the sync pair ÷ SYNC_MASTER and SLAVE with the
    Java client, and the servers' CPU per million acknowledged: sync pair ÷ SYNC_MASTER
    pair, one broker ÷ one broker."""
    return {
        "ratio_vs_rocketmq_python_batched": _ratio(
            _throughput(cells, METAQ, "in_flight", size),
            _throughput(cells, ROCKETMQ_PYTHON, "in_flight", size),
        ),
        "ratio_vs_rocketmq_batched": _ratio(
            _throughput(cells, METAQ, "in_flight", size),
            _throughput(cells, ROCKETMQ, "in_flight", size),
        ),
        "ratio_vs_rocketmq_sync_master_batched": _ratio(
            _throughput(cells, METAQ_SYNC, "in_flight", size),
            _throughput(cells, ROCKETMQ_SYNC, "in_flight", size),
        ),
        "cpu_per_million_vs_rocketmq_ratio": _ratio(
            _cpu(cells, METAQ_SYNC, size), _cpu(cells, ROCKETMQ_SYNC, size)
        ),
        "cpu_per_million_async_vs_rocketmq_ratio": _ratio(
            _cpu(cells, METAQ, size), _cpu(cells, ROCKETMQ, size)
        ),
    }


def ratio_to_plain(cells: Sequence[Cell], key: str, size: int) -> float | None:
    """``key``'s (b) ÷ plain metaq's (b), measured in the same run: what a feature costs."""
    return _ratio(
        _throughput(cells, key, "in_flight", size), _throughput(cells, METAQ, "in_flight", size)
    )


def targets_met(headline: dict[str, float | None]) -> dict[str, bool | None]:
    met: dict[str, bool | None] = {}
    for name, (op, bound) in TARGETS.items():
        value = headline.get(name)
        met[name] = None if value is None else (value >= bound if op == ">=" else value <= bound)
    return met


def _num(value: float | None, digits: int = 0) -> str:
    if value is None or math.isnan(value):
        return "—"
    return f"{value:,.{digits}f}"


def _ratio_text(value: float | None) -> str:
    """Two decimals, or two significant digits for a ratio that small."""
    if value is not None and 0 < value < 0.01:
        return f"{value:.2g}"
    return _num(value, 2)


def _stalls_text(cell: Cell | None) -> str:
    if cell is None or cell.stalls is None:
        return "—"
    return cell.stalls.text() + ("" if cell.stalls.realtime else " (not real-time)")


def _cell_text(cell: Cell | None) -> str:
    if cell is None:
        return "not run"
    if cell.msgs_s is None:
        return cell.note or "cannot"
    return _num(cell.msgs_s)


def markdown(
    cells: Sequence[Cell], systems: Sequence[SystemInfo], sizes: Sequence[int], rate: float,
    headline: dict[str, Any], when: str,
) -> str:  # fmt: skip
    lines = [
        f"# metaq side by side — {when}",
        "",
        f"msgs/s and send latency (ms); (c) offers {rate:,.0f} msgs/s open-loop and times each "
        "message from its scheduled send to the consumer's callback.",
        "",
        "| system | size | (a) msgs/s | (a) p50 | (a) p99 | (a) p99.9 | (b) msgs/s "
        "| (c) p50 | (c) p99 | (c) p99.9 | (c) delivered | (c) machine stalls |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for info in systems:
        for size in sizes:
            one = _find(cells, info.key, "one_at_a_time", size)
            many = _find(cells, info.key, "in_flight", size)
            e2e = _find(cells, info.key, "end_to_end", size)
            one_lat = one.latency if one is not None else Latencies.none()
            e2e_lat = e2e.latency if e2e is not None and e2e.msgs_s is not None else None
            delivered = (
                f"{e2e.delivered:,} / {e2e.sent:,}"
                if e2e is not None and e2e.sent is not None and e2e.delivered is not None
                else _cell_text(e2e)
            )
            lines.append(
                f"| {info.label} | {size} B | {_cell_text(one)} | {_num(one_lat.p50_ms, 2)} "
                f"| {_num(one_lat.p99_ms, 2)} | {_num(one_lat.p999_ms, 2)} | {_cell_text(many)} "
                + (
                    f"| {_num(e2e_lat.p50_ms, 2)} | {_num(e2e_lat.p99_ms, 2)} "
                    f"| {_num(e2e_lat.p999_ms, 2)} "
                    if e2e_lat is not None
                    else f"| {_cell_text(e2e)} | — | — "
                )
                + f"| {delivered} | {_stalls_text(e2e)} |"
            )
    lines += [
        "",
        "(c) machine stalls: the pauses of a CPU during the cell (how many, for how long in "
        "all, the longest), seen by a real-time process per CPU that only sleeps. They land "
        "on whichever system's cell is running and show in its p99 and p99.9.",
    ]
    labels = {s.key: s.label for s in systems}
    saturated = sorted(
        {labels.get(c.system, c.system) for c in cells
         if c.mode == "end_to_end" and c.msgs_s is not None and c.latency.p50_ms > SATURATED_MS}
    )  # fmt: skip
    if saturated:
        lines += [
            "",
            f"(c) of {', '.join(saturated)}: the offered rate is more than it sustains here "
            "with its producer and consumer in one process, so its latency is mostly "
            "queueing in the client.",
        ]
    extra = [c for c in cells if c.mode == "pipelined"]
    if extra:
        pipelined = MODE_TITLES["pipelined"]
        lines += ["", f"metaq's other way to keep sends in flight, {pipelined}:", ""]
    for cell in extra:
        lines.append(
            f"- {labels.get(cell.system, cell.system)}, {cell.size} B: {_num(cell.msgs_s)} msgs/s "
            f"(send p50 {_num(cell.latency.p50_ms, 2)} ms, p99 {_num(cell.latency.p99_ms, 2)} ms)"
        )
    apart = (*REPLICATED_PEERS, *TOOL_ROWS)
    peers = [s.key for s in systems if not s.key.startswith(METAQ) and s.key not in apart]
    lines += [
        "",
        "## metaq (one broker, ASYNC flush) ÷ each peer, same run",
        "",
        "Throughput: metaq ÷ peer (above 1: metaq faster). End-to-end p99: metaq ÷ peer "
        "(below 1: metaq lower).",
        "",
        "| peer | size | (a) one at a time | (b) in flight | (c) e2e p99 |",
        "|---|---:|---:|---:|---:|",
    ]
    for peer in peers:
        for size in sizes:
            r = ratios(cells, [peer], size)
            lines.append(
                f"| {labels[peer]} | {size} B | {_ratio_text(r[f'ratio_vs_{peer}_sync'])} "
                f"| {_ratio_text(r[f'ratio_vs_{peer}_batched'])} "
                f"| {_ratio_text(r[f'e2e_p99_vs_{peer}_ratio'])} |"
            )
    r3_peers = [s.key for s in systems if s.key in REPLICATED_PEERS]
    lines += [
        "",
        "## metaq (master and slave, sync replication) ÷ each replicating peer, same run",
        "",
        "Each side answers once two copies hold a message (metaq: the master and its "
        "slave; the peers: a majority of three, Kafka's acks=all every in-sync replica, "
        "RocketMQ's SYNC_MASTER its SLAVE). "
        "Throughput: metaq ÷ peer (above 1: metaq faster). End-to-end p99: metaq ÷ peer "
        "(below 1: metaq lower).",
        "",
        "| peer | size | (a) one at a time | (b) in flight | (c) e2e p99 |",
        "|---|---:|---:|---:|---:|",
    ]
    for peer in r3_peers:
        for size in sizes:
            r = sync_ratios(cells, [peer], size)
            lines.append(
                f"| {labels[peer]} | {size} B | {_ratio_text(r[f'sync_vs_{peer}_one_ratio'])} "
                f"| {_ratio_text(r[f'sync_vs_{peer}_batched_ratio'])} "
                f"| {_ratio_text(r[f'sync_e2e_p99_vs_{peer}_ratio'])} |"
            )
    for size in sizes:
        own = sync_ratios(cells, [], size)["sync_vs_async_one_ratio"]
        lines.append(f"\nmetaq's own (a), sync replication ÷ one broker, {size} B: "
                     f"{_ratio_text(own)}")  # fmt: skip
    costs = [c for c in cells if c.mode == "cost"]
    if costs:
        lines += [
            "",
            "## Cost: the servers' CPU per million acknowledged messages",
            "",
            "The same rate of 1 KiB messages offered to each, open-loop with no consumer; "
            "user + system CPU of every server process (/proc/<pid>/stat) over the cell.",
            "",
            "| system | size | offered | acknowledged msgs/s | CPU s per million |",
            "|---|---:|---:|---:|---:|",
        ]
        for cell in costs:
            lines.append(
                f"| {labels.get(cell.system, cell.system)} | {cell.size} B "
                f"| {_num(cell.sent)} | {_num(cell.msgs_s)} | {_num(cell.cpu_per_million, 1)} |"
            )
    tools = [s.key for s in systems if s.key in TOOL_ROWS]
    if tools:
        lines += ["", "Kafka's own Java producer (ProducerPerformance), (b) only:", ""]
        for key in tools:
            for size in sizes:
                mine = METAQ_SYNC if key == "kafka_r3_perf" else METAQ
                lines.append(
                    f"- {labels[key]}, {size} B: {_cell_text(_find(cells, key, 'in_flight', size))}"
                    f" msgs/s; {labels.get(mine, mine)} (b) ÷ it: "
                    + _ratio_text(_ratio(_throughput(cells, mine, "in_flight", size),
                                         _throughput(cells, key, "in_flight", size)))
                )  # fmt: skip
    lines += [
        "",
        "## Targets (1 KiB)",
        "",
        "| figure | value | target | met |",
        "|---|---:|---|---|",
    ]
    for name, (op, bound) in TARGETS.items():
        value = headline.get(name)
        met = headline["targets_met"].get(name)
        verdict = "—" if met is None else ("yes" if met else "**no**")
        lines.append(f"| `{name}` | {_num(value, 2)} | {op} {bound} | {verdict} |")
    lines += ["", "## Durability and how (b) sends", "", "| system | durability | (b) |"]
    lines.append("|---|---|---|")
    for info in systems:
        lines.append(f"| {info.label} | {info.durability} | {info.in_flight_how} |")
    return "\n".join(lines) + "\n"


def chart(cells: Sequence[Cell], systems: Sequence[SystemInfo], sizes: Sequence[int],
          path: Path) -> None:  # fmt: skip
    """Throughput of (a) and (b), and p99 of (a) and (c), by system, one bar per size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("one_at_a_time", "msgs/s", "(a) one at a time — msgs/s"),
        ("in_flight", "msgs/s", f"(b) ≤ {IN_FLIGHT:,} in flight — msgs/s"),
        ("one_at_a_time", "p99", "(a) one at a time — send p99 ms"),
        ("end_to_end", "p99", "(c) end to end — p99 ms"),
    ]
    figure, axes = plt.subplots(2, 2, figsize=(13, 8))
    width = 0.8 / len(sizes)
    for ax, (mode, what, title) in zip(axes.flat, panels, strict=True):
        shown: list[float] = []
        for i, size in enumerate(sizes):
            values = []
            for info in systems:
                cell = _find(cells, info.key, mode, size)
                value = None
                if cell is not None and cell.msgs_s is not None:
                    value = cell.msgs_s if what == "msgs/s" else cell.latency.p99_ms
                values.append(0.0 if value is None or math.isnan(value) else value)
            xs = [x + (i - (len(sizes) - 1) / 2) * width for x in range(len(systems))]
            ax.bar(xs, values, width, label=f"{size} B")
            shown += [v for v in values if v > 0]
        ax.set_title(title)
        # Linear unless the figures span orders of magnitude, so bar lengths stay honest.
        if shown and max(shown) / min(shown) > 20:
            ax.set_yscale("log")
            title += " (log scale)"
            ax.set_title(title)
        ax.set_xticks(range(len(systems)))
        ax.set_xticklabels([s.label for s in systems], rotation=20, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _sweep(cells: Sequence[Cell], system: str) -> list[Cell]:
    found = [c for c in cells if c.system == system and c.mode == "sweep" and c.msgs_s]
    return sorted(found, key=lambda c: float(c.note))


def sweep_markdown(cells: Sequence[Cell], systems: Sequence[SystemInfo]) -> str:
    """The sweep's cells: offered and acknowledged msgs/s, send p50/p99/p99.9 (ms)."""
    lines = [
        "",
        "## Sweep: 1 KiB sends offered open loop at fixed rates",
        "",
        "| system | offered msgs/s | acknowledged msgs/s | p50 ms | p99 ms | p99.9 ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for info in systems:
        for c in _sweep(cells, info.key):
            lat = c.latency
            lines.append(
                f"| {info.label} | {float(c.note):,.0f} | {c.msgs_s or 0:,.0f} | "
                f"{lat.p50_ms:.2f} | {lat.p99_ms:.2f} | {lat.p999_ms:.2f} |"
            )
    return "\n".join(lines) + "\n"


def sweep_chart(cells: Sequence[Cell], systems: Sequence[SystemInfo], path: Path) -> None:
    """Send p50 and p99 against acknowledged msgs/s, one line per system (log axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(13, 5), sharex=True)
    for ax, (what, title) in zip(axes, (("p50_ms", "send p50"), ("p99_ms", "send p99")),
                                 strict=True):  # fmt: skip
        for info in systems:
            points = _sweep(cells, info.key)
            if points:
                xs = [c.msgs_s or 0.0 for c in points]
                ys = [getattr(c.latency, what) for c in points]
                ax.plot(xs, ys, marker="o", label=info.label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("acknowledged msgs/s (1 KiB, offered open loop)")
        ax.set_ylabel(f"{title}, ms (from the send's tick)")
        ax.set_title(f"{title} against throughput")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def raw(cells: Sequence[Cell], systems: Sequence[SystemInfo]) -> dict[str, Any]:
    return {
        "cells": [asdict(cell) for cell in cells],
        "systems": {s.key: asdict(s) for s in systems},
    }


def strict_json(value: Any) -> Any:
    """``value`` with every NaN as None, so what json.dumps writes is strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strict_json(v) for v in value]
    return value
