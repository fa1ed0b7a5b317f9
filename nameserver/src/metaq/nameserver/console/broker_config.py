"""The brokers' live settings (``metaq broker config get|set``): per broker, every setting
it may change while it runs (retention, disk thresholds, cold-read budget, flush
interval, log level, ...) with its value now and whether it was changed live; admins set
one on one broker, which keeps it across its restarts. A setting fixed while the broker
runs, or a value it cannot take, is refused with the broker's reason."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from metaq.client.admin import Admin, BrokerSettings
from metaq.common.http import takes_forms
from metaq.common.model import BrokerView
from metaq.nameserver.console.context import Answer, ConsoleContext
from metaq.nameserver.console.page import Html, changes, errors, esc, notice, render, table

CURRENT = "/console/config"


def routes(context: ConsoleContext) -> list[web.RouteDef]:
    async def page(_request: web.Request) -> web.Response:
        return await config_page(context)

    @takes_forms
    async def set_one(request: web.Request) -> web.Response:
        return await _set(context, request)

    return [web.get(CURRENT, page), web.post(CURRENT, set_one)]


async def config_page(
    context: ConsoleContext, message: str = "", problem: str = ""
) -> web.Response:
    brokers = sorted(
        context.live_brokers(), key=lambda b: (b.state.key.broker_name, b.state.key.broker_id)
    )
    answers = await asyncio.gather(*(context.brokers.ask(b, Admin.broker_config) for b in brokers))
    sections = [_section(b, a) for b, a in zip(brokers, answers, strict=True)]
    body = (
        notice(message)
        + errors([problem, *(a.error for a in answers)])
        + ("".join(sections) or "<p>No broker is registered with this nameserver.</p>")
    )
    return render("Broker settings", body, current=CURRENT)


def _section(broker: BrokerView, answer: Answer[BrokerSettings]) -> str:
    key = str(broker.state.key)
    title = f'<h2 id="broker-{esc(key)}">Broker {esc(key)} ({esc(broker.state.role.value)})</h2>'
    if answer.value is None:
        return title + '<p class="muted">Its settings could not be read (above).</p>'
    found = answer.value
    rows = [
        [
            Html(f"<code>{esc(name)}</code>"),
            _shown(value),
            "yes" if name in found.changed_live else "",
            Html(changes(_form(key, name, value))),
        ]
        for name, value in sorted(found.settings.items())
    ]
    return title + table(
        ["setting", "value", "changed live", ""], rows, caption=f"Settings of {key}"
    )


def _shown(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _form(broker: str, name: str, value: object) -> str:
    ident = f"set-{broker}-{name}"
    return (
        f'<form class="inline" method="post" action="{CURRENT}">'
        f'<input type="hidden" name="broker" value="{esc(broker)}">'
        f'<input type="hidden" name="setting" value="{esc(name)}">'
        f'<label for="{esc(ident)}" class="muted">new value</label>'
        f'<input id="{esc(ident)}" name="value" value="{esc(_shown(value))}" size="12"> '
        f'<button type="submit" aria-label="Set {esc(name)} on {esc(broker)}">Set</button></form>'
    )


async def _set(context: ConsoleContext, request: web.Request) -> web.Response:
    form = await request.post()
    key, name = str(form.get("broker", "")), str(form.get("setting", ""))
    value = str(form.get("value", "")).strip()
    broker = next((b for b in context.live_brokers() if str(b.state.key) == key), None)
    if broker is None:
        return await config_page(context, problem=f"broker {key!r} is not registered now")
    answer = await context.brokers.ask(broker, Admin.set_broker_config, name, value)
    if not answer.ok:
        return await config_page(context, problem=answer.error)
    return await config_page(
        context, message=f"{name} = {_shown(answer.value)} on broker {key} (kept across restarts)"
    )
