"""The message page: look messages up by id, by key, by queue and offset, or by a time
range, and show each one whole with its delivery state per consumer group."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
from collections.abc import Awaitable

from aiohttp import web

from metaq.client.admin import Admin, CommittedOffset, StoredMessage
from metaq.nameserver.console.context import Answer, ConsoleContext, problems_of
from metaq.nameserver.console.page import errors, esc, field, parse_time_ms, render, table
from metaq.nameserver.model import BrokerView

CURRENT = "/console/messages"
LIMIT = 20


def routes(context: ConsoleContext) -> list[web.RouteDef]:
    async def page(request: web.Request) -> web.Response:
        return await messages_page(context, request)

    return [web.get(CURRENT, page)]


def _reader(context: ConsoleContext, broker_name: str) -> BrokerView | None:
    brokers = context.registry.members(broker_name)
    return next((b for b in brokers if b.state.role.value == "master"), None) or (
        brokers[0] if brokers else None
    )


async def _search(
    context: ConsoleContext, q: dict[str, str]
) -> tuple[list[tuple[BrokerView, StoredMessage]], list[str], str]:
    """(found messages with the broker they came from, problems, what was asked)."""
    ask = context.brokers.ask
    if q.get("msg_id"):
        msg_id = q["msg_id"].strip()
        masters = [b for b in context.live_brokers() if b.state.role.value == "master"]
        held = await asyncio.gather(*(ask(b, Admin.broker_message, msg_id) for b in masters))
        found = [(b, a.value) for b, a in zip(masters, held, strict=True) if a.value is not None]
        problems = problems_of(held)
        if not found and not problems:
            problems.append(f"no live broker has a message with id {msg_id}")
        return found, problems, f"message id {msg_id}"
    topic = q.get("topic", "").strip()
    if not topic:
        return [], ["give a topic (or a message id)"], ""
    route = context.registry.route(topic)
    if route is None:
        return [], [f"topic {topic!r} is not served by any live broker"], ""
    readers = {g.broker_name: _reader(context, g.broker_name) for g in route.groups}
    calls: list[tuple[BrokerView, Awaitable[Answer[list[StoredMessage]]]]]
    if q.get("key"):
        key = q["key"].strip()
        asked = f"key {q['key']} in {topic}"
        calls = [
            (b, ask(b, Admin.broker_messages_by_key, topic, key))
            for b in readers.values()
            if b is not None
        ]
    elif q.get("offset"):
        broker = readers.get(q.get("broker", ""))
        if broker is None:
            return [], [f"pick the broker group of the queue ({', '.join(readers)})"], ""
        try:
            queue_id, offset = int(q.get("queue_id", "0")), int(q["offset"])
        except ValueError:
            return [], ["the queue and the offset are whole numbers"], ""
        asked = f"{topic} queue {queue_id} from offset {offset}"
        read = ask(broker, Admin.read_queue, topic, queue_id, offset=offset, limit=LIMIT)
        calls = [(broker, read)]
    elif q.get("from"):
        try:
            start = parse_time_ms(q["from"])
            end = parse_time_ms(q["to"]) if q.get("to") else None
        except ValueError:
            return [], ["times are ISO 8601 (UTC when no zone) or ms since the epoch"], ""
        asked = f"{topic} stored from {q['from']} to {q.get('to') or 'now'}"
        calls = [
            (
                b,
                ask(b, Admin.read_queue, topic, queue_id, from_ms=start, to_ms=end, limit=LIMIT),
            )
            for g in route.groups
            if (b := readers[g.broker_name]) is not None
            for queue_id in range(g.read_queues)
        ]
    else:
        return [], ["give a key, a queue offset or a start time with the topic"], ""
    answers = await asyncio.gather(*(call for _, call in calls))
    listed = [(b, m) for (b, _), a in zip(calls, answers, strict=True) for m in a.get([])]
    return listed, problems_of(answers), asked


def _body(message: StoredMessage) -> str:
    """Text as it is, JSON pretty-printed, anything else as hex."""
    if message.body_encoding != "text":
        raw = base64.b64decode(message.body)
        return "hex: " + " ".join(f"{b:02x}" for b in raw[:4096])
    text = message.body
    try:
        return "JSON:\n" + json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


async def _delivery(
    context: ConsoleContext, found: list[tuple[BrokerView, StoredMessage]]
) -> dict[str, Answer[list[CommittedOffset]]]:
    """Each involved broker's committed consumer offsets, by broker group."""
    brokers = {b.state.key.broker_name: b for b, _ in found}
    answers = await asyncio.gather(
        *(context.brokers.ask(b, Admin.consumer_offsets) for b in brokers.values())
    )
    return dict(zip(brokers, answers, strict=True))


def _shown(broker: BrokerView, m: StoredMessage, offsets: Answer[list[CommittedOffset]]) -> str:
    stamp = datetime.datetime.fromtimestamp(m.store_timestamp_ms / 1000, datetime.UTC)
    headers: list[list[object]] = [
        ["message id", m.msg_id],
        ["topic", m.topic],
        ["broker group", broker.state.key.broker_name],
        ["queue", m.queue_id],
        ["queue offset", m.queue_offset],
        ["commitlog offset", m.commitlog_offset],
        ["stored", stamp.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"],
        ["tags", m.tags or "—"],
        ["keys", " ".join(m.keys) or "—"],
        ["size", f"{m.size} B" + (" (compressed)" if m.compressed else "")],
    ]
    props = [[k, v] for k, v in sorted(m.properties.items())]
    states = [
        [
            row.group,
            row.offset,
            "consumed" if m.queue_offset < row.offset else "not consumed yet",
        ]
        for row in offsets.get([])
        if row.topic == m.topic and row.queue_id == m.queue_id
    ]
    delivery = (
        table(["consumer group", "committed offset", "state"], states, caption="Delivery")
        if offsets.ok
        else errors([f"delivery state unknown: {offsets.error}"])
    )
    return (
        f"<article><h2>Message {esc(m.msg_id)}</h2>"
        + table(["header", "value"], headers, caption="Headers")
        + table(["property", "value"], props, caption="Properties")
        + f"<h3>Body</h3><pre>{esc(_body(m))}</pre>"
        + (
            delivery
            if states or not offsets.ok
            else "<p>No consumer group has committed an offset on this queue.</p>"
        )
        + "</article>"
    )


async def messages_page(context: ConsoleContext, request: web.Request) -> web.Response:
    q = {k: v for k, v in request.query.items() if v.strip()}
    groups = context.registry.group_names()
    options = "".join(
        f'<option value="{esc(g)}"{" selected" if q.get("broker") == g else ""}>{esc(g)}</option>'
        for g in groups
    )
    forms = f"""<form method="get" action="{CURRENT}"><fieldset><legend>By message id</legend>
{field("msg_id", "Message id (32 hex digits)", q.get("msg_id", ""), size="34")}
<button type="submit">Look up</button></fieldset></form>
<form method="get" action="{CURRENT}"><fieldset><legend>By key</legend>
{field("topic", "Topic", q.get("topic", ""), form="k-")}{field("key", "Key", q.get("key", ""))}
<button type="submit">Look up</button></fieldset></form>
<form method="get" action="{CURRENT}"><fieldset><legend>By queue and offset</legend>
{field("topic", "Topic", q.get("topic", ""), form="q-")}
<label for="f-broker">Broker group</label><select id="f-broker" name="broker">{options}</select>
{field("queue_id", "Queue", q.get("queue_id", "0"), kind="number", min="0")}
{field("offset", "Offset", q.get("offset", ""), kind="number", min="0")}
<button type="submit">Read</button></fieldset></form>
<form method="get" action="{CURRENT}"><fieldset><legend>By time range</legend>
{field("topic", "Topic", q.get("topic", ""), form="t-")}
{field("from", "From (UTC, ISO 8601)", q.get("from", ""))}{field("to", "To", q.get("to", ""))}
<button type="submit">Search</button></fieldset></form>"""
    if not q:
        return render("Messages", forms, current=CURRENT)
    found, problems, asked = await _search(context, q)
    offsets = await _delivery(context, found)
    shown = "".join(_shown(b, m, offsets[b.state.key.broker_name]) for b, m in found)
    summary = f"<p>{len(found)} message(s) for {esc(asked)}.</p>" if asked else ""
    return render("Messages", forms + errors(problems) + summary + shown, current=CURRENT)
