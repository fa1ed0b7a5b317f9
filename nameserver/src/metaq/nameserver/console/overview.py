"""The overview: the cluster's health at a glance. Each broker group green, amber or red
with the reason, its master, in-sync set and disk; the busiest topics and the most-lagging
consumer groups, with 15-minute sparklines from the nameserver's samples
(:mod:`metaq.nameserver.console.samples`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from aiohttp import web

from metaq.client.admin import Admin, BrokerHealth
from metaq.common.model import BrokerKey, BrokerView, GroupControl, GroupView
from metaq.nameserver.console.context import ConsoleContext
from metaq.nameserver.console.groups import group_href
from metaq.nameserver.console.page import Html, Num, errors, esc, link, ratio, render, table
from metaq.nameserver.console.samples import TOTAL, Samples
from metaq.nameserver.console.sparkline import sparkline
from metaq.nameserver.console.topics import topic_href

CURRENT = "/console/overview"
TOP: Final = 5
"""How many topics and groups the overview lists."""

Level = Literal["ok", "warn", "down"]
_WORDS: Final[dict[Level, str]] = {"ok": "healthy", "warn": "degraded", "down": "down"}


@dataclass(frozen=True, slots=True)
class Status:
    level: Level
    reason: str

    def badge(self) -> Html:
        return Html(
            f'<span class="status {self.level}">{esc(_WORDS[self.level])}</span> {esc(self.reason)}'
        )


def group_status(
    group: GroupView,
    control: GroupControl | None,
    master: BrokerView | None,
    health: Mapping[BrokerKey, BrokerHealth | None],
) -> Status:
    """Red when the group takes no writes (no master, a master that does not answer or
    refuses writes), amber when it takes them with less safety than it should (a broker
    not answering or out of sync, a disk past the cleaning threshold), else green."""
    if master is None:
        return Status("down", "no master registered: sends to this group are refused")
    mine = health.get(master.state.key)
    if mine is None:
        return Status("down", f"master {master.state.key} does not answer its admin API")
    if not mine.writable:
        return Status("down", f"master {master.state.key} refuses writes: {mine.reason or '?'}")
    live = {b.state.key.broker_id for b in group.brokers}
    in_sync = set(control.in_sync_ids) if control is not None else set(mine.in_sync_ids) or live
    worries = [f"broker {i} is down (in sync, not registered)" for i in sorted(in_sync - live)]
    worries += [f"broker {i} is not in sync" for i in sorted(live - in_sync)]
    for broker in group.brokers:
        key = broker.state.key
        h = health.get(key)
        if h is None:
            if key != master.state.key:
                worries.append(f"broker {key.broker_id} does not answer its admin API")
        elif h.disk_clean_ratio and h.disk_used_ratio >= h.disk_clean_ratio:
            worries.append(
                f"broker {key.broker_id} disk {ratio(h.disk_used_ratio)} used (cleaning "
                f"from {ratio(h.disk_clean_ratio)}, writes stop at {ratio(h.disk_full_ratio)})"
            )
    if worries:
        return Status("warn", "; ".join(worries))
    return Status("ok", f"master {master.state.key.broker_id}, {len(in_sync)} in sync")


def routes(context: ConsoleContext) -> list[web.RouteDef]:
    async def page(_request: web.Request) -> web.Response:
        return await overview_page(context)

    return [web.get(CURRENT, page)]


async def overview_page(context: ConsoleContext) -> web.Response:
    groups = [g for view in context.registry.cluster_info() for g in view.groups]
    brokers = [b for g in groups for b in g.brokers]
    answers = await asyncio.gather(*(context.brokers.ask(b, Admin.health) for b in brokers))
    health = {b.state.key: a.value for b, a in zip(brokers, answers, strict=True)}
    masters = context.masters()
    rows = []
    for g in groups:
        control = context.controller.control(g.broker_name)
        master = masters.get(g.broker_name)
        status = group_status(g, control, master, health)
        in_sync = ", ".join(map(str, control.in_sync_ids)) if control else "not managed"
        disks = [h.disk_used_ratio for b in g.brokers if (h := health[b.state.key]) is not None]
        rows.append(
            [
                link(f"/console/cluster#group-{g.broker_name}", g.broker_name),
                status.badge(),
                master.state.key.broker_id if master else None,
                in_sync,
                Num(ratio(max(disks))) if disks else None,
            ]
        )
    gone = list(context.gone().values())
    samples = context.samples
    body = (
        '<div id="overview-live" data-live>'
        + errors(gone)
        + _totals(samples)
        + table(
            ["broker group", "status", "master", "in sync", "disk used (fullest broker)"],
            rows,
            caption="Broker groups",
        )
        + ("" if groups else "<p>No broker is registered with this nameserver.</p>")
        + _busiest(samples)
        + _lagging(samples)
        + f'<p class="muted">Sampled every {samples.interval_s:g} s; the lines span the '
        "last 15 minutes and fill as samples come in.</p></div>"
    )
    return render("Overview", body, current=CURRENT)


def _rate(value: float | None) -> Num | None:
    return None if value is None else Num(f"{value:,.1f} msg/s")


def _last(values: list[float | None]) -> float | None:
    return values[-1] if values else None


def _totals(samples: Samples) -> str:
    rates_in, rates_out = samples.rates("in:" + TOTAL), samples.rates("out:" + TOTAL)
    return table(
        ["", "now", "last 15 minutes"],
        [
            ["stored", _rate(_last(rates_in)), sparkline(rates_in, "messages stored", " msg/s")],
            ["consumed", _rate(_last(rates_out)), sparkline(rates_out, "consumed", " msg/s")],
        ],
        caption="Cluster throughput",
    )


def _busiest(samples: Samples) -> str:
    topics = [t for t in samples.keys("in:") if t != TOTAL]
    by_rate = sorted(topics, key=lambda t: (-(_last(samples.rates("in:" + t)) or 0.0), t))
    rows = []
    for topic in by_rate[:TOP]:
        rates_in, rates_out = samples.rates("in:" + topic), samples.rates("out:" + topic)
        rows.append(
            [
                link(topic_href(topic), topic),
                _rate(_last(rates_in)),
                sparkline(rates_in, f"{topic} in", " msg/s"),
                _rate(_last(rates_out)),
                sparkline(rates_out, f"{topic} out", " msg/s"),
            ]
        )
    return table(
        ["topic", "in now", "in, 15 min", "out now", "out, 15 min"], rows, caption="Busiest topics"
    )


def _lagging(samples: Samples) -> str:
    groups = samples.keys("lag:")
    by_lag = sorted(groups, key=lambda g: (-(samples.levels("lag:" + g) or [0.0])[-1], g))
    rows = []
    for group in by_lag[:TOP]:
        levels = samples.levels("lag:" + group)
        rows.append(
            [
                link(group_href(group), group),
                Num(f"{levels[-1]:,.0f} msg") if levels else None,
                sparkline(list(levels), f"{group} lag", " msg"),
            ]
        )
    return table(["group", "lag now", "lag, 15 min"], rows, caption="Most-lagging groups")
