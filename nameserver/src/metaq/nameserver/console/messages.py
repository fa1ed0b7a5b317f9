"""The message page: look messages up by id, by key, by queue and offset, or by a time
range, and show each one whole with its delivery state per consumer group and its trace
(what clients with tracing on wrote of its send, deliveries and retry hops, as ``metaq
trace`` shows it; :mod:`metaq.client.trace`). A time range
is listed a row per message (each linking to the message whole), a page at a time:
:data:`PAGE_PER_QUEUE` messages of each queue, the next page going on where each queue
stopped."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime
import json
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlencode

from aiohttp import web

from metaq.client.admin import Admin, CommittedOffset, StoredMessage
from metaq.client.trace import CONSUME, SEND, TraceEvent, decode_events
from metaq.common.model import BrokerView, GroupRoute
from metaq.common.names import TRACE_TOPIC
from metaq.nameserver.console.context import Answer, ConsoleContext, problems_of
from metaq.nameserver.console.page import (
    errors,
    esc,
    field,
    link,
    parse_time_ms,
    render,
    table,
    when,
)

CURRENT = "/console/messages"
LIMIT = 20
PAGE_PER_QUEUE = 20
"""Messages of each queue on one page of a time range (rows, so a page stays readable)."""
PREVIEW_CHARS = 80


@dataclass
class Found:
    """What a search found, with the broker each message came from."""

    messages: list[tuple[BrokerView, StoredMessage]] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    asked: str = ""
    listed: bool = False
    """A time range: a row per message rather than each one whole."""
    more: dict[tuple[str, int], int] = dataclasses.field(default_factory=dict)
    """(broker group, queue) -> the queue offset the next page starts at, for each queue
    that holds more of the range than this page shows."""
    end_ms: int = 0
    """The range's end, pinned (``now`` at the first page) so later pages keep it."""
    next_offset: int | None = None
    """A queue read from an offset: where its next page starts, when it holds more."""


def _resume_points(values: list[str]) -> dict[tuple[str, int], int]:
    """``QUEUE:OFFSET:BROKER_GROUP`` (the next-page link's ``resume``) by queue;
    ValueError for anything else."""
    points = {}
    for value in values:
        queue, offset, broker_name = value.split(":", 2)
        points[(broker_name, int(queue))] = int(offset)
    return points


def routes(context: ConsoleContext) -> list[web.RouteDef]:
    async def page(request: web.Request) -> web.Response:
        return await messages_page(context, request)

    return [web.get(CURRENT, page)]


def _reader(context: ConsoleContext, broker_name: str) -> BrokerView | None:
    brokers = context.registry.members(broker_name)
    return next((b for b in brokers if b.state.role.value == "master"), None) or (
        brokers[0] if brokers else None
    )


async def _search(context: ConsoleContext, q: dict[str, str]) -> Found:
    """The messages ``q`` asks for."""
    ask = context.brokers.ask
    if q.get("msg_id"):
        msg_id = q["msg_id"].strip()
        masters = [b for b in context.live_brokers() if b.state.role.value == "master"]
        held = await asyncio.gather(*(ask(b, Admin.broker_message, msg_id) for b in masters))
        found = [(b, a.value) for b, a in zip(masters, held, strict=True) if a.value is not None]
        problems = problems_of(held)
        if not found and not problems:
            problems.append(f"no live broker has a message with id {msg_id}")
        return Found(found, problems, f"message id {msg_id}")
    topic = q.get("topic", "").strip()
    if not topic:
        return Found(problems=["give a topic (or a message id)"])
    route = context.registry.route(topic)
    if route is None:
        return Found(problems=[f"topic {topic!r} is not served by any live broker"])
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
            return Found(problems=[f"pick the broker group of the queue ({', '.join(readers)})"])
        try:
            queue_id, offset = int(q.get("queue_id", "0")), int(q["offset"])
        except ValueError:
            return Found(problems=["the queue and the offset are whole numbers"])
        # One more than a page, to know whether there is a next one.
        read = await ask(broker, Admin.read_queue, topic, queue_id, offset=offset, limit=LIMIT + 1)
        got = read.get([])
        return Found(
            [(broker, m) for m in got[:LIMIT]],
            problems_of([read]),
            f"{topic} queue {queue_id} from offset {offset}",
            listed=True,
            next_offset=got[LIMIT].queue_offset if len(got) > LIMIT else None,
        )
    elif q.get("from"):
        return await _time_range(context, q, topic, readers, route.groups)
    else:
        return Found(problems=["give a key, a queue offset or a start time with the topic"])
    answers = await asyncio.gather(*(call for _, call in calls))
    listed = [(b, m) for (b, _), a in zip(calls, answers, strict=True) for m in a.get([])]
    return Found(listed, problems_of(answers), asked)


async def _time_range(
    context: ConsoleContext,
    q: dict[str, str],
    topic: str,
    readers: dict[str, BrokerView | None],
    groups: Sequence[GroupRoute],
) -> Found:
    """One page of the messages of ``topic`` stored in the range: at most
    :data:`PAGE_PER_QUEUE` of each queue (one more is read to know whether there are more),
    from the range's start, or on a later page from where each queue stopped."""
    try:
        start = parse_time_ms(q["from"])
        end = parse_time_ms(q["to"]) if q.get("to") else int(time.time() * 1000)
    except ValueError:
        return Found(problems=["times are ISO 8601 (UTC when no zone) or ms since the epoch"])
    try:
        resume = _resume_points(q.get("resume", "").split() if q.get("resume") else [])
    except ValueError:
        return Found(problems=["this next-page link is damaged: search the time range again"])
    asked = f"{topic} stored from {when(start)} to {when(end)}"
    ask = context.brokers.ask
    queues = [
        (b, queue_id)
        for g in groups
        if (b := readers[g.broker_name]) is not None
        for queue_id in range(g.read_queues)
        if not resume or (g.broker_name, queue_id) in resume
    ]
    calls = [
        ask(b, Admin.read_queue, topic, queue_id, from_ms=start, to_ms=end,
            limit=PAGE_PER_QUEUE + 1)
        if not resume
        else ask(b, Admin.read_queue, topic, queue_id,
                 offset=resume[(b.state.key.broker_name, queue_id)], limit=PAGE_PER_QUEUE + 1)
        for b, queue_id in queues
    ]  # fmt: skip
    answers = await asyncio.gather(*calls)
    found = Found(problems=problems_of(answers), asked=asked, listed=True, end_ms=end)
    for (broker, queue_id), answer in zip(queues, answers, strict=True):
        # Read by offset, a later page's messages may run past the range's end: the
        # queue's part of the range ends there.
        read = answer.get([])
        in_range = [m for m in read if start <= m.store_timestamp_ms <= end]
        ended = len(in_range) < len(read) and read[-1].store_timestamp_ms > end
        page = in_range[:PAGE_PER_QUEUE]
        found.messages += [(broker, m) for m in page]
        key = (broker.state.key.broker_name, queue_id)
        if len(in_range) > PAGE_PER_QUEUE:
            found.more[key] = in_range[PAGE_PER_QUEUE].queue_offset
        elif len(read) > PAGE_PER_QUEUE and not ended:
            found.more[key] = read[-1].queue_offset + 1
    found.messages.sort(key=lambda bm: (bm[1].store_timestamp_ms, bm[1].commitlog_offset))
    return found


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


@dataclass
class Traced:
    """The trace events of a message, and what could not be asked."""

    events: list[TraceEvent]
    problems: list[str]


async def _trace(context: ConsoleContext, msg_ids: Sequence[str]) -> dict[str, Traced]:
    """The trace events of each message, from every broker group holding the trace
    topic (one key lookup per message and group)."""
    route = context.registry.route(TRACE_TOPIC)
    if route is None:
        return {i: Traced([], []) for i in msg_ids}
    readers = [b for g in route.groups if (b := _reader(context, g.broker_name)) is not None]
    ask = context.brokers.ask
    out = {}
    for msg_id in msg_ids:
        answers = await asyncio.gather(
            *(ask(b, Admin.broker_messages_by_key, TRACE_TOPIC, msg_id, limit=1000)
              for b in readers)
        )  # fmt: skip
        bodies = (m.body for a in answers for m in a.get([]) if m.body_encoding == "text")
        out[msg_id] = Traced(decode_events(msg_id, bodies), problems_of(answers))
    return out


def _trace_table(traced: Traced) -> str:
    rows = []
    for e in traced.events:
        if e.kind in (SEND, CONSUME):
            where = f"{e.broker} queue {e.queue_id} offset {e.queue_offset}"
            if e.kind == CONSUME and e.via != e.topic:
                where += f" via {e.via}"
        else:
            where = f"to {e.via}"
        rows.append(
            [
                when(e.time_ms), e.kind, e.group, e.client_id, e.host, e.attempt or None,
                e.status or None,
                f"{e.cost_ms:.1f} ms" if e.kind in (SEND, CONSUME) else None, where,
            ]
        )  # fmt: skip
    if not rows:
        return errors(traced.problems) + (
            "<p>No trace: neither its producer nor its consumers had tracing on.</p>"
        )
    return errors(traced.problems) + table(
        ["time", "step", "group", "client", "host", "attempt", "outcome", "took", "where"],
        rows,
        caption="Trace",
    )


def _shown(
    broker: BrokerView,
    m: StoredMessage,
    offsets: Answer[list[CommittedOffset]],
    traced: Traced,
) -> str:
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
        + _trace_table(traced)
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
    found = await _search(context, q)
    if found.listed:
        shown = _listing(q, found)
    else:
        offsets = await _delivery(context, found.messages)
        traces = await _trace(context, [m.msg_id for _, m in found.messages])
        shown = "".join(
            _shown(b, m, offsets[b.state.key.broker_name], traces[m.msg_id])
            for b, m in found.messages
        )
    summary = (
        f"<p>{len(found.messages)} message(s) for {esc(found.asked)}"
        + (f" (page {esc(q.get('page', '1'))})" if found.listed else "")
        + ".</p>"
        if found.asked
        else ""
    )
    return render("Messages", forms + errors(found.problems) + summary + shown, current=CURRENT)


def _preview(m: StoredMessage) -> str:
    if m.body_encoding != "text":
        return f"(binary, {m.size} B)"
    text = " ".join(m.body.split())
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


_LISTED: Final = ("stored", "broker group", "queue", "offset", "message id", "tags", "keys",
                  "size", "body (start)")  # fmt: skip


def _listing(q: dict[str, str], found: Found) -> str:
    """A time range's or a queue's page: a row per message linking to it whole, and when
    there is more than a page shows, where and the link to the next page."""
    rows = [
        [
            when(m.store_timestamp_ms),
            b.state.key.broker_name,
            m.queue_id,
            m.queue_offset,
            link(f"{CURRENT}?{urlencode({'msg_id': m.msg_id})}", m.msg_id),
            m.tags or None,
            " ".join(m.keys) or None,
            f"{m.size} B",
            _preview(m),
        ]
        for b, m in found.messages
    ]
    page = int(q["page"]) + 1 if q.get("page", "").isdigit() else 2
    if "offset" in q:
        listing = table(_LISTED, rows, caption="Messages of the queue")
        if found.next_offset is None:
            return listing + "<p>That is the end of the queue.</p>"
        href = f"{CURRENT}?{urlencode({**q, 'offset': str(found.next_offset), 'page': str(page)})}"
        return (
            listing
            + f'<p class="notice" role="status">A page shows {LIMIT} messages; the queue holds '
            f"more from offset {found.next_offset}. "
            + str(link(href, f"Next page ({page}) →"))
            + "</p>"
        )
    listing = table(_LISTED, rows, caption="Messages in the time range")
    if not found.more:
        return listing + "<p>That is all the range holds.</p>"
    capped = ", ".join(f"{name} queue {queue}" for name, queue in sorted(found.more))
    resume = " ".join(f"{queue}:{at}:{name}" for (name, queue), at in sorted(found.more.items()))
    after = {"topic": q["topic"], "from": q["from"], "to": str(found.end_ms)}
    href = f"{CURRENT}?{urlencode({**after, 'resume': resume, 'page': str(page)})}"
    return (
        listing
        + f'<p class="notice" role="status">Truncated: a page shows at most {PAGE_PER_QUEUE} '
        f"messages of each queue, and {esc(capped)} hold(s) more of this range. "
        + str(link(href, f"Next page ({page}) →"))
        + "</p>"
    )
