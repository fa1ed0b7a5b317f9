"""Topic pages: the list (queues per group, messages per second in and out, retention),
one topic (its route and per-queue offsets), create or extend a topic, send a test
message."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

from aiohttp import web

from metaq.client.admin import Admin, ConsumerMember, TopicSettings
from metaq.common.http import takes_forms
from metaq.common.names import topic_kind
from metaq.nameserver.console.context import (
    Answer,
    ConsoleContext,
    durability_warning,
    problems_of,
)
from metaq.nameserver.console.groups import group_href
from metaq.nameserver.console.page import (
    Html,
    Num,
    changes,
    errors,
    esc,
    field,
    link,
    notice,
    render,
    table,
    when,
)
from metaq.nameserver.console.sorting import TableQuery

CURRENT = "/console/topics"


def topic_href(topic: str) -> str:
    return f"{CURRENT}/{quote(topic, safe='')}"


def routes(context: ConsoleContext) -> list[web.RouteDef]:
    async def listing(request: web.Request) -> web.Response:
        return await list_page(context, query=request.query)

    async def one(request: web.Request) -> web.Response:
        return await topic_page(context, request.match_info["topic"])

    @takes_forms
    async def put(request: web.Request) -> web.Response:
        return await _put_topic(context, request)

    @takes_forms
    async def send(request: web.Request) -> web.Response:
        return await _send_test(context, request)

    return [
        web.get(CURRENT, listing),
        web.post(CURRENT, put),
        web.get(CURRENT + "/{topic}", one),
        web.post(CURRENT + "/{topic}/send", send),
    ]


def _rate(value: float | None) -> Num | None:
    return None if value is None else Num(f"{value:,.1f} msg/s")


_KINDS: Final = {"user": "", "retry": "retry", "dlq": "dead letters", "system": "system"}
_SORTS: Final = ("name", "kind", "stored", "in", "out")


def kind_badge(topic: str) -> Html:
    """The topic's name, marked when it is a retry, dead-letter or system topic."""
    kind = topic_kind(topic)
    badge = f' <span class="kind {kind}">{esc(_KINDS[kind])}</span>' if _KINDS[kind] else ""
    return Html(f'<a href="{esc(topic_href(topic))}">{esc(topic)}</a>{badge}')


async def list_page(
    context: ConsoleContext,
    message: str = "",
    problem: str = "",
    query: Mapping[str, str] | None = None,
) -> web.Response:
    choice = TableQuery.of(query or {}, _SORTS, "name")
    masters = context.masters()
    names = context.registry.topics()
    routes_ = {name: context.registry.route(name) for name in names}
    brokers = list(masters.values())
    ask = context.brokers.ask
    health, offsets, stats = await asyncio.gather(
        asyncio.gather(*(ask(b, Admin.health) for b in brokers)),
        asyncio.gather(*(ask(b, Admin.consumer_offsets) for b in brokers)),
        asyncio.gather(*(ask(b, Admin.stored_counts) for b in brokers)),
    )
    problems = [problem, *sorted(set(problems_of(health, offsets, stats)))]
    stored: dict[str, int] = {}
    for counts in stats:
        for name, count in counts.get({}).items():
            stored[name] = stored.get(name, 0) + count
    consumed: dict[str, int] = {}
    for answer in offsets:
        for row in answer.get([]):
            consumed[row.topic] = consumed.get(row.topic, 0) + row.offset
    retention = sorted({f"{a.value.retention_hours:g} h" for a in health if a.value is not None})
    found: list[dict[str, Any]] = []
    for name in names:
        route = routes_[name]
        if route is None:
            continue
        groups = ", ".join(
            f"{g.broker_name}: {g.read_queues}r/{g.write_queues}w ({g.permission.value})"
            for g in route.groups
        )
        rate_in = rate_out = None
        if name in stored:
            rate_in = context.rates_in.rate(name, stored[name])
        if name in consumed:
            rate_out = context.rates_out.rate(name, consumed[name])
        found.append({"name": name, "kind": topic_kind(name), "groups": groups,
                      "stored": stored.get(name), "in": rate_in, "out": rate_out})  # fmt: skip
    if choice.kind in _KINDS:
        found = [f for f in found if f["kind"] == choice.kind]
    found = choice.rows(found, lambda f: str(f["name"]), lambda f: f[choice.sort])
    rows = [
        [kind_badge(f["name"]), f["groups"], f["stored"], _rate(f["in"]), _rate(f["out"])]
        for f in found
    ]
    kinds = "".join(
        f'<option value="{k}"{" selected" if k == choice.kind else ""}>{k}</option>'
        for k in ("", *_KINDS)
    )
    headings = [
        choice.heading(CURRENT, "name", "topic"),
        "queues per group (read/write)",
        choice.heading(CURRENT, "stored", "messages stored"),
        choice.heading(CURRENT, "in", "in"),
        choice.heading(CURRENT, "out", "out"),
    ]
    body = (
        notice(message)
        + f'<div id="topics-live" data-live>{errors(problems)}'
        + f"<p>Retention: {esc(', '.join(retention) or '—')}. Rates are measured between "
        "two refreshes of this page.</p>"
        + choice.filter_form(
            CURRENT,
            "Filter by name",
            f'<label for="f-kind">kind</label><select id="f-kind" name="kind">{kinds}</select>',
        )
        + table(headings, rows, caption="Topics")
        + "</div>"
        + changes(_put_form(sorted(masters)))
    )
    return render("Topics", body, current=CURRENT)


def _consumers_table(topic: str, answers: list[Answer[dict[str, list[ConsumerMember]]]]) -> str:
    """The live members subscribed to ``topic``, by consumer group (RocketMQ's
    consumerConnection of a topic)."""
    seen: dict[tuple[str, str], list[object]] = {}
    for answer in answers:
        for group, members in answer.get({}).items():
            for m in members:
                expressions = [e for t, e in m.subscriptions if t == topic]
                if expressions:
                    seen[(group, m.client_id)] = [
                        link(group_href(group), group), m.client_id, m.host or "—",
                        m.computer_room or "—", m.mode, ", ".join(e or "*" for e in expressions),
                    ]  # fmt: skip
    return table(
        ["consumer group", "client id", "host", "room", "mode", "subscription"],
        [row for _, row in sorted(seen.items())],
        caption="Consumers",
    )


def _put_form(groups: list[str], name: str = "", queues: int = 4) -> str:
    boxes = "".join(
        f'<label><input type="checkbox" name="group" value="{esc(g)}" checked> {esc(g)}</label>'
        for g in groups
    )
    return f"""<form method="post" action="{CURRENT}"><fieldset>
<legend>Create a topic or change its queues</legend>
{field("name", "Topic", name, required="required")}
{field("read_queues", "Read queues", queues, kind="number", min="1")}
{field("write_queues", "Write queues", queues, kind="number", min="0")}
<span>On groups:</span> {boxes}
<button type="submit">Create or update</button>
</fieldset></form>"""


async def _put_topic(context: ConsoleContext, request: web.Request) -> web.Response:
    form = await request.post()
    name = str(form.get("name", "")).strip()
    try:
        read_queues = int(str(form.get("read_queues", "")))
        write_queues = int(str(form.get("write_queues", "")))
    except ValueError:
        return await list_page(context, problem="read and write queues must be whole numbers")
    wanted = [str(g) for g in form.getall("group", [])]
    masters = context.masters()
    if not name or not wanted:
        return await list_page(context, problem="give the topic a name and pick at least one group")
    missing = [g for g in wanted if g not in masters]
    if missing:
        return await list_page(
            context, problem=f"no master is registered for {missing}; retry later"
        )
    settings = TopicSettings(read_queues, write_queues)
    answers = await asyncio.gather(
        *(context.brokers.ask(masters[g], Admin.put_topic, name, settings) for g in wanted)
    )
    failed = [a.error for a in answers if not a.ok]
    if failed:
        return await list_page(context, problem="; ".join(failed))
    return await list_page(
        context,
        message=f"topic {name}: {read_queues} read / {write_queues} write queues on "
        f"{', '.join(wanted)} (routes show it after the brokers' next heartbeat)",
    )


async def topic_page(
    context: ConsoleContext, topic: str, message: str = "", problem: str = ""
) -> web.Response:
    route = context.registry.route(topic)
    if route is None:
        return render(
            f"Topic {topic}",
            errors(
                [
                    f"topic {topic!r} is not served by any live "
                    "broker: check its name, or create it on the Topics page"
                ]
            ),
            current=CURRENT,
            status=404,
        )
    members = {g.broker_name: context.registry.members(g.broker_name) for g in route.groups}
    readers = {
        name: next((b for b in brokers if b.state.role.value == "master"), brokers[0])
        for name, brokers in members.items()
        if brokers
    }
    answers, consumers = await asyncio.gather(
        asyncio.gather(
            *(context.brokers.ask(b, Admin.broker_queues, topic) for b in readers.values())
        ),
        asyncio.gather(*(context.brokers.ask(b, Admin.consumers) for b in readers.values())),
    )
    problems = [problem, *problems_of(answers, consumers)]
    route_rows = [
        [
            g.broker_name,
            b.broker_id,
            b.role.value,
            b.data_address,
            b.http_address,
            g.read_queues,
            g.write_queues,
            g.permission.value,
            g.epoch,
        ]
        for g in route.groups
        for b in g.brokers
    ]
    queue_rows = []
    for name, answer in zip(readers, answers, strict=True):
        for q in answer.get([]):
            queue_rows.append(
                [
                    name,
                    q.queue_id,
                    q.min_offset,
                    q.max_offset,
                    when(q.last_stored_ms),
                    link(
                        f"/console/messages?topic={quote(topic, safe='')}&broker="
                        f"{quote(name)}&queue_id={q.queue_id}&offset="
                        f"{max(q.max_offset - 10, q.min_offset)}",
                        "browse",
                    ),
                ]
            )
    send_form = f"""<form method="post" action="{topic_href(topic)}/send"><fieldset>
<legend>Send a test message</legend>
{field("tags", "Tags")}{field("keys", "Keys (space-separated)")}
<label for="f-body">Body</label>
<textarea id="f-body" name="body" rows="2" cols="40" required></textarea>
<button type="submit">Send</button></fieldset></form>"""
    body = (
        notice(message)
        + f'<div id="topic-live" data-live>{errors(problems)}'
        + table(
            [
                "group",
                "broker id",
                "role",
                "data address",
                "http address",
                "read queues",
                "write queues",
                "permission",
                "epoch",
            ],
            route_rows,
            caption="Route",
        )
        + table(
            ["group", "queue", "min offset", "max offset", "last stored", "messages"],
            queue_rows,
            caption="Queues",
        )
        + _consumers_table(topic, consumers)
        + "</div>"
        + changes(
            send_form
            + _put_form(
                sorted(context.masters()),
                topic,
                max((g.read_queues for g in route.groups), default=4),
            )
        )
    )
    return render(f"Topic {topic}", body, current=CURRENT)


async def _send_test(context: ConsoleContext, request: web.Request) -> web.Response:
    topic = request.match_info["topic"]
    form = await request.post()
    route = context.registry.route(topic)
    masters = context.masters()
    writable = [g.broker_name for g in route.groups if g.permission.writable] if route else []
    target = next((masters[g] for g in writable if g in masters), None)
    if target is None:
        return await topic_page(context, topic, problem=f"no master takes writes for {topic!r} now")
    answer = await context.brokers.ask(
        target,
        Admin.store_message,
        topic,
        str(form.get("body", "")),
        tags=str(form.get("tags", "")),
        keys=str(form.get("keys", "")).split(),
    )
    if answer.value is None:
        return await topic_page(context, topic, problem=answer.error)
    stored = answer.value.stored[0]
    return await topic_page(
        context,
        topic,
        message=f"sent: message {stored.msg_id} is queue {stored.queue_id} offset "
        f"{stored.queue_offset} on {target.state.key.broker_name}"
        + durability_warning(answer.value),
    )
