"""Consumer group pages: the list, one group (members, committed offsets, lag in messages
and in time), a reset of its offsets by time (a dry run first), and its retry and
dead-letter topics with browse and resend."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import quote

from aiohttp import web

from metaq.client.admin import Admin, StoredMessage
from metaq.common.http import takes_forms
from metaq.common.names import dlq_topic, retry_topic
from metaq.nameserver.console.context import (
    Answer,
    ConsoleContext,
    durability_warning,
    problems_of,
)
from metaq.nameserver.console.page import (
    Html,
    changes,
    errors,
    esc,
    field,
    link,
    not_found,
    notice,
    parse_time_ms,
    render,
    table,
    when,
)
from metaq.nameserver.console.sorting import TableQuery

CURRENT = "/console/groups"
# The newest dead letters listed per queue; older ones are reached on the Messages page.
DEAD_SHOWN = 100
T = TypeVar("T")
P = ParamSpec("P")


def group_href(group: str) -> str:
    return f"{CURRENT}/{quote(group, safe='')}"


def routes(context: ConsoleContext) -> list[web.RouteDef]:
    async def listing(request: web.Request) -> web.Response:
        if request.query.get("group"):
            raise web.HTTPFound(group_href(request.query["group"]))
        return await list_page(context, query=request.query)

    async def one(request: web.Request) -> web.Response:
        return await group_page(context, request.match_info["group"])

    @takes_forms
    async def reset(request: web.Request) -> web.Response:
        return await _reset(context, request)

    @takes_forms
    async def resend(request: web.Request) -> web.Response:
        return await _resend(context, request)

    return [
        web.get(CURRENT, listing),
        web.get(CURRENT + "/{group}", one),
        web.post(CURRENT + "/{group}/reset", reset),
        web.post(CURRENT + "/{group}/resend", resend),
    ]


async def _from_masters(
    context: ConsoleContext,
    call: Callable[Concatenate[Admin, str, P], Awaitable[T]],
    *args: P.args,
    **kwargs: P.kwargs,
) -> list[tuple[str, Answer[T]]]:
    """``call`` on each group's master, by group name."""
    masters = context.masters()
    answers = await asyncio.gather(
        *(context.brokers.ask(b, call, *args, **kwargs) for b in masters.values())
    )
    return list(zip(masters, answers, strict=True))


async def list_page(
    context: ConsoleContext,
    message: str = "",
    problem: str = "",
    query: Mapping[str, str] | None = None,
) -> web.Response:
    choice = TableQuery.of(query or {}, ("group", "members", "lag"), "group")
    offsets, consumers = await asyncio.gather(
        _from_masters(context, Admin.consumer_offsets), _from_masters(context, Admin.consumers)
    )
    problems = [problem, *problems_of([a for _, a in offsets], [a for _, a in consumers])]
    lag: dict[str, int] = {}
    for _, committed in offsets:
        for row in committed.get([]):
            lag[row.group] = lag.get(row.group, 0) + row.lag
    members: dict[str, set[str]] = {}
    for _, live in consumers:
        for group, found in live.get({}).items():
            members.setdefault(group, set()).update(m.client_id for m in found)
    listed: list[dict[str, Any]] = [
        {"group": g, "members": len(members.get(g, ())), "lag": lag.get(g)}
        for g in set(lag) | set(members)
    ]
    listed = choice.rows(listed, lambda f: str(f["group"]), lambda f: f[choice.sort])
    rows = [[link(group_href(f["group"]), f["group"]), f["members"], f["lag"]] for f in listed]
    headings = [
        choice.heading(CURRENT, "group", "group"),
        choice.heading(CURRENT, "members", "live members"),
        choice.heading(CURRENT, "lag", "lag (messages)"),
    ]
    body = (
        notice(message)
        + f'<div id="groups-live" data-live>{errors(problems)}'
        + choice.filter_form(CURRENT, "Filter by name")
        + table(headings, rows, caption="Consumer groups")
        + "</div>"
        + f"""<form method="get" action="{CURRENT}"><fieldset><legend>Open a group</legend>
{field("group", "Group", required="required")}
<button type="submit">Open</button></fieldset></form>"""
    )
    return render("Consumer groups", body, current=CURRENT)


def _age(ms: int) -> str:
    return "—" if ms <= 0 else f"{ms / 1000:.1f} s"


async def group_page(
    context: ConsoleContext,
    group: str,
    message: str = "",
    problem: str = "",
    preview: str = "",
) -> web.Response:
    offsets, consumers = await asyncio.gather(
        _from_masters(context, Admin.group_offsets, group),
        _from_masters(context, Admin.consumers),
    )
    problems = [problem, *problems_of([a for _, a in offsets], [a for _, a in consumers])]
    member_rows: dict[str, list[Any]] = {}
    for _, live in consumers:
        for m in live.get({}).get(group, []):
            member_rows[m.client_id] = [
                m.client_id,
                m.host or "—",
                m.computer_room or "—",
                m.mode,
                ", ".join(f"{t} ({e or '*'})" for t, e in m.subscriptions),
            ]
    offset_rows = []
    topics: set[str] = set()
    for broker_name, committed in offsets:
        for row in committed.get([]):
            topics.add(row.topic)
            offset_rows.append(
                [
                    broker_name,
                    row.topic,
                    row.queue_id,
                    row.owner,
                    row.offset,
                    row.max_offset,
                    row.lag,
                    _age(row.lag_ms),
                ]
            )
    routes_ = {t: context.registry.route(t) for t in (retry_topic(group), dlq_topic(group))}
    heard_everyone = bool(offsets) and not any(problems)
    known = member_rows or offset_rows or any(routes_.values())
    if heard_everyone and not (known or message or preview):
        # Every master answered and none knows the group: a typo, or a group long gone.
        return not_found(
            f"consumer group {group!r} is not known: no broker holds offsets for it, no "
            "member of it is live and it has no retry or dead-letter topic; check the name "
            "in the list of consumer groups",
            f"<p>{link(CURRENT, 'All consumer groups')}</p>",
        )
    dlq = await _dead_letters(context, group)
    problems += dlq[1]
    body = (
        notice(message)
        + f'<div id="group-live" data-live>{errors(problems)}'
        + table(
            ["client id", "host", "room", "mode", "subscriptions"],
            list(member_rows.values()),
            caption="Members",
        )
        + table(
            [
                "broker group",
                "topic",
                "queue",
                "owner (last pulled by)",
                "committed offset",
                "max offset",
                "lag (messages)",
                "lag (time: oldest unconsumed)",
            ],
            offset_rows,
            caption="Committed offsets",
        )
        + "</div>"
        + preview
        + changes(_reset_form(group, sorted(topics)))
        + changes(_delete_form(group, bool(member_rows)))
        + "<h2>Retry and dead letters</h2><p>"
        + " · ".join(
            f"{esc(name)}: "
            + (
                "not created (nothing failed yet)"
                if r is None
                else f"{sum(g.read_queues for g in r.groups)} queue(s)"
            )
            for name, r in routes_.items()
        )
        + "</p>"
        + dlq[0]
    )
    return render(f"Consumer group {group}", body, current=CURRENT)


def _reset_form(group: str, topics: list[str]) -> str:
    options = "".join(f'<option value="{esc(t)}">{esc(t)}</option>' for t in topics)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"""<form method="post" action="{group_href(group)}/reset"><fieldset>
<legend>Reset offsets by time</legend>
<label for="f-topic">Topic</label><select id="f-topic" name="topic">{options}</select>
{field("time", "Time (UTC, ISO 8601)", now, required="required")}
<button type="submit" name="action" value="preview">Preview (dry run)</button>
<button type="submit" name="action" value="apply">Reset offsets</button>
<p class="muted">Running members of the group are told: each drops what it has in flight
and goes on from the new offsets. Preview shows them without changing anything.</p>
</fieldset></form>"""


def _delete_form(group: str, live: bool) -> str:
    force = (
        '<label><input type="checkbox" name="force" value="1"> Delete although members are '
        "live (they commit their positions again and the group comes back)</label>"
        if live
        else ""
    )
    return f"""<form method="post" action="{group_href(group)}/delete"><fieldset>
<legend>Delete the group</legend>
<label><input type="checkbox" name="retry" value="1"> also {esc(retry_topic(group))}</label>
<label><input type="checkbox" name="dlq" value="1"> also {esc(dlq_topic(group))}</label>
{force}<button type="submit">Delete group {esc(group)}</button>
<p class="muted">Every master forgets the group's committed offsets (as
<code>metaq group delete</code> does), and the retry and dead-letter queues go too when
ticked; a group with live members is refused unless forced.</p></fieldset></form>"""


async def _reset(context: ConsoleContext, request: web.Request) -> web.Response:
    group = request.match_info["group"]
    form = await request.post()
    topic = str(form.get("topic", ""))
    dry_run = str(form.get("action", "preview")) != "apply"
    try:
        stamp = parse_time_ms(str(form.get("time", "")))
    except ValueError:
        return await group_page(
            context,
            group,
            problem="the time is neither ISO 8601 "
            "(2024-05-01T12:00:00) nor milliseconds since the epoch",
        )
    route = context.registry.route(topic)
    if route is None:
        return await group_page(
            context, group, problem=f"topic {topic!r} is not served by any live broker"
        )
    masters = context.masters()
    targets = [masters[g.broker_name] for g in route.groups if g.broker_name in masters]
    missing = [g.broker_name for g in route.groups if g.broker_name not in masters]
    answers = await asyncio.gather(
        *(
            context.brokers.ask(b, Admin.reset_group, group, topic, stamp, dry_run=dry_run)
            for b in targets
        )
    )
    problems = problems_of(answers)
    problems += [f"group {g} has no master now: its queues were not reset" for g in missing]
    problems += [
        f"{b.state.key.broker_name}: the reset is committed on the master, but no slave "
        "confirmed it within the replication timeout: a failover now could lose it"
        for b, a in zip(targets, answers, strict=True)
        if a.value is not None and not dry_run and not a.value.replicated
    ]
    rows = [
        [b.state.key.broker_name, q.queue_id, q.before, q.after]
        for b, a in zip(targets, answers, strict=True)
        if a.value is not None
        for q in a.value.queues
    ]
    what = "Dry run: the offsets a reset would commit" if dry_run else "Offsets committed"
    heading = f"{esc(what)} ({esc(topic)}, {esc(when(stamp))})"
    preview = f'<section aria-label="{esc(what)}"><h2>{heading}</h2>'
    preview += table(["broker group", "queue", "before", "after"], rows) + "</section>"
    live = sorted({c for a in answers if a.value is not None for c in a.value.live_members})
    if live:
        told = f"{len(live)} live member(s) told, each goes on from these offsets: " + ", ".join(
            live
        )
    else:
        told = "no member is consuming the topic: the group starts from these offsets"
    message = "" if dry_run or problems else f"reset {group} on {topic} to {when(stamp)}; {told}"
    return await group_page(
        context, group, message=message, problem="; ".join(problems), preview=preview
    )


async def _dead_letters(context: ConsoleContext, group: str) -> tuple[str, list[str]]:
    """The newest dead letters (at most :data:`DEAD_SHOWN` per queue) with a resend
    button each, and what could not be read."""
    topic = dlq_topic(group)
    route = context.registry.route(topic)
    if route is None:
        return "<p>No dead letters.</p>", []
    problems: list[str] = []
    readers = []
    for g in route.groups:
        reader = context.masters().get(g.broker_name)
        if reader is None:
            problems.append(f"group {g.broker_name} has no master: its dead letters are not shown")
        else:
            readers.append(reader)
    bounds = await asyncio.gather(
        *(context.brokers.ask(b, Admin.broker_queues, topic) for b in readers)
    )
    reads = [
        (b, q.queue_id, max(q.min_offset, q.max_offset - DEAD_SHOWN))
        for b, answer in zip(readers, bounds, strict=True)
        for q in answer.get([])
    ]
    problems += problems_of(bounds)
    answers = await asyncio.gather(
        *(
            context.brokers.ask(b, Admin.read_queue, topic, queue_id, offset=at, limit=DEAD_SHOWN)
            for b, queue_id, at in reads
        )
    )
    rows = []
    for (broker, _, _), answer in zip(reads, answers, strict=True):
        if answer.value is None:
            problems.append(answer.error)
            continue
        for m in answer.value:
            rows.append(_dead_row(group, broker.state.key.broker_name, m))
    return table(
        ["message id", "original topic", "dead since", "last failure", "body", ""],
        rows,
        caption="Dead letters",
    ), problems


def _dead_row(group: str, broker_name: str, m: StoredMessage) -> list[Any]:
    props = m.properties
    msg_id = props.get("ORIGIN_MSG_ID") or m.msg_id
    button = Html(
        changes(
            f'<form class="inline" method="post" action="{group_href(group)}/resend">'
            f'<input type="hidden" name="broker" value="{esc(broker_name)}">'
            f'<input type="hidden" name="msg_id" value="{esc(msg_id)}">'
            f'<button type="submit" aria-label="Resend {esc(msg_id)}">Resend</button>'
            "</form>"
        )
    )
    body = m.body[:80] if m.body_encoding == "text" else "(binary: see Messages)"
    return [
        msg_id,
        props.get("RETRY_TOPIC", "?"),
        when(m.store_timestamp_ms),
        props.get("LAST_FAILURE", ""),
        body,
        button,
    ]


async def _resend(context: ConsoleContext, request: web.Request) -> web.Response:
    group = request.match_info["group"]
    form = await request.post()
    broker_name, msg_id = str(form.get("broker", "")), str(form.get("msg_id", ""))
    master = context.masters().get(broker_name)
    if master is None:
        return await group_page(
            context, group, problem=f"group {broker_name!r} has no master now; retry later"
        )
    answer = await context.brokers.ask(master, Admin.resend_dead_letters, group, [msg_id])
    if answer.value is None:
        return await group_page(context, group, problem=answer.error)
    stored = answer.value.stored[0]
    return await group_page(
        context,
        group,
        message=f"resent {msg_id} to {stored.topic} as message {stored.msg_id}"
        + durability_warning(answer.value),
    )
