"""The producers page: every producer connected to a live broker that said who it is
(RocketMQ's producerConnection), by producer group, with the brokers it is connected to."""

from __future__ import annotations

import asyncio

from aiohttp import web

from metaq.client.admin import Admin
from metaq.nameserver.console.context import ConsoleContext, problems_of
from metaq.nameserver.console.page import errors, render, table, when

CURRENT = "/console/producers"
_HEADERS = ("producer group", "client id", "host", "room", "version", "language",
            "connected since", "brokers")  # fmt: skip


def routes(context: ConsoleContext) -> list[web.RouteDef]:
    async def page(_request: web.Request) -> web.Response:
        return await producers_page(context)

    return [web.get(CURRENT, page)]


async def producers_page(context: ConsoleContext) -> web.Response:
    brokers = context.live_brokers()
    answers = await asyncio.gather(*(context.brokers.ask(b, Admin.producers) for b in brokers))
    seen: dict[tuple[str, str], list[object]] = {}
    on: dict[tuple[str, str], set[str]] = {}
    for broker, answer in zip(brokers, answers, strict=True):
        for p in answer.get([]):
            key = (p.group, p.client_id)
            on.setdefault(key, set()).add(str(broker.state.key))
            seen[key] = [
                p.group or "—", p.client_id, p.host or "—", p.computer_room or "—",
                p.client_version or "—", p.language or "—",
                when(p.since_ms) if p.since_ms else None,
            ]  # fmt: skip
    rows = [[*row, ", ".join(sorted(on[key]))] for key, row in sorted(seen.items())]
    body = (
        '<div id="producers-live" data-live>'
        + errors(problems_of(answers))
        + table(
            [
                "producer group",
                "client id",
                "host",
                "room",
                "version",
                "language",
                "connected since",
                "brokers",
            ],
            rows,
            caption="Producers",
        )
        + '<p class="muted">Producers that introduced themselves on their connection (every '
        "metaq client does); a producer does not say which topics it sends to.</p></div>"
    )
    return render("Producers", body, current=CURRENT)
