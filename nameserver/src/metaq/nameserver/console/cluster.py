"""The cluster page: broker groups, their brokers and replication, the controller's Raft
group, and a planned switchover per group (a confirmation page, then a POST)."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from metaq.client.admin import Admin, BrokerHealth
from metaq.common.http import takes_forms
from metaq.common.model import BrokerKey, BrokerView, GroupView, Role
from metaq.common.units import size_text
from metaq.nameserver.console.context import ConsoleContext
from metaq.nameserver.console.page import (
    Html,
    changes,
    errors,
    esc,
    may_change,
    notice,
    ratio,
    render,
    table,
)
from metaq.nameserver.controller import ControllerUnavailable, SwitchoverRefused

CURRENT = "/console/cluster"
# The old master refuses writes while the slave catches up; past the fence it takes them
# again by itself, should this nameserver never get to the controller's answer.
CATCH_UP_TIMEOUT_MS = 5000
FENCE_MS = CATCH_UP_TIMEOUT_MS + 10_000
# How long the result page waits for the brokers to register the roles the controller gave
# them (they hear of it within a heartbeat or so); past it the page says they have not yet.
ROLES_SETTLED_TIMEOUT_S = 10.0
ROLES_POLL_S = 0.05


def routes(context: ConsoleContext) -> list[web.RouteDef]:
    async def page(_request: web.Request) -> web.Response:
        return await cluster_page(context)

    async def confirm(request: web.Request) -> web.Response:
        return _confirm_page(context, request)

    @takes_forms
    async def switchover(request: web.Request) -> web.Response:
        return await _switchover(context, request)

    return [
        web.get(CURRENT, page),
        web.get(CURRENT + "/{group}/switchover", confirm),
        web.post(CURRENT + "/{group}/switchover", switchover),
    ]


async def cluster_page(
    context: ConsoleContext, message: str = "", problem: str = ""
) -> web.Response:
    views = context.registry.cluster_info()
    groups = [g for view in views for g in view.groups]
    brokers = [b for g in groups for b in g.brokers]
    answers = await asyncio.gather(*(context.brokers.ask(b, Admin.health) for b in brokers))
    health = {b.state.key: a.value for b, a in zip(brokers, answers, strict=True)}
    gone = context.gone()
    problems = [problem, *gone.values()]
    problems += [a.error for a in answers if a.error]
    sections = [_group_section(context, g, health, problems, set(gone)) for g in groups]
    if not groups:
        sections.append("<p>No broker is registered with this nameserver.</p>")
    body = (
        notice(message)
        + f'<div id="cluster-live" data-live>{errors(problems)}{"".join(sections)}'
        + _controller_section(context)
        + "</div>"
    )
    return render("Cluster", body, current=CURRENT)


def _group_section(
    context: ConsoleContext,
    group: GroupView,
    health: dict[BrokerKey, BrokerHealth | None],
    problems: list[str],
    gone: set[BrokerKey],
) -> str:
    control = context.controller.control(group.broker_name)
    live_ids = {b.state.key.broker_id for b in group.brokers}
    if control is not None:
        for missing in sorted(set(control.in_sync_ids) - live_ids):
            if BrokerKey(group.broker_name, missing) in gone:
                continue  # named already, with its addresses
            problems.append(
                f"broker {group.broker_name}/{missing} is in the controller's in-sync set "
                "but not registered: it is down or cut off from this nameserver"
            )
    rows = []
    master_id = control.master_id if control is not None else None
    lag_bytes: dict[str, int] = {}
    lag_s: dict[str, float] = {}
    for broker in group.brokers:
        answered = health[broker.state.key]
        if broker.state.key.broker_id == master_id and answered is not None:
            lag_bytes = answered.replica_lag_bytes
            lag_s = answered.replica_lag_s
    for broker in group.brokers:
        state = broker.state
        h = health[state.key]
        # The master measures each slave's lag: the bytes of log it does not hold yet, and
        # how long since it last held all of it.
        lag = _lag(lag_bytes, lag_s, str(state.key.broker_id))
        switch: object = None
        if (
            may_change()
            and control is not None
            and state.key.broker_id != master_id
            and state.key.broker_id in control.in_sync_ids
        ):
            switch = Html(
                f'<a href="{CURRENT}/{esc(group.broker_name)}/switchover?to='
                f'{state.key.broker_id}">Make master…</a>'
            )
        rows.append(
            [
                state.key.broker_id,
                state.role.value,
                state.data_address,
                state.http_address,
                state.epoch,
                lag,
                _disk(h),
                h.flush_mode if h else None,
                h.replication_mode if h else state.replication_mode or "unspecified",
                h.commitlog_write_offset if h else state.commitlog_max_offset,
                f"{broker.last_heartbeat_age_s:.1f} s ago",
                switch,
            ]
        )
    in_sync = ", ".join(map(str, control.in_sync_ids)) if control else "not managed"
    master = f"broker {master_id}" if master_id is not None else "—"
    title = (
        f'<h2 id="group-{esc(group.broker_name)}">Group {esc(group.broker_name)}</h2>'
        f"<p>master: {esc(master)} · epoch "
        f"{group.epoch} · in sync (controller): {esc(in_sync)} · room "
        f"{esc(group.computer_room or '—')}</p>"
    )
    return title + table(
        [
            "id",
            "role",
            "data address",
            "http address",
            "epoch",
            "replica lag (behind the master)",
            "disk used (clean at / refuse writes at); free (reserve)",
            "flush",
            "replication",
            "commitlog end",
            "last heartbeat",
            "switchover",
        ],
        rows,
        caption=f"Brokers of {group.broker_name}",
    )


def _lag(lag_bytes: dict[str, int], lag_s: dict[str, float], key: str) -> str | None:
    if key not in lag_bytes:
        return None
    return f"{lag_bytes[key]} B, {lag_s.get(key, 0.0):.1f} s"


def _disk(h: BrokerHealth | None) -> str | None:
    """Both figures writes stop at: use as df counts it beside its thresholds, and the
    bytes available beside the reserve."""
    if h is None:
        return None
    use = f"{ratio(h.disk_used_ratio)} ({ratio(h.disk_clean_ratio)} / {ratio(h.disk_full_ratio)})"
    if h.disk_available_bytes is None:
        return use
    free = size_text(h.disk_available_bytes)
    return f"{use}; {free} free (reserve {size_text(h.disk_reserve_bytes)})"


def _controller_section(context: ConsoleContext) -> str:
    controller = context.controller
    members = controller.settings.peers or (controller.address,)
    rows = [
        [
            m,
            "leader" if m == controller.leader else "follower",
            "this nameserver" if m == controller.address else "",
        ]
        for m in members
    ]
    leader = controller.leader or "none known (no majority?)"
    return f"<h2>Controller</h2><p>Raft leader: {esc(leader)}</p>" + table(
        ["member", "role", ""], rows, caption="Controller members"
    )


def _broker(context: ConsoleContext, group: str, broker_id: int) -> BrokerView | None:
    return next(
        (b for b in context.registry.members(group) if b.state.key.broker_id == broker_id), None
    )


def _confirm_page(context: ConsoleContext, request: web.Request) -> web.Response:
    group = request.match_info["group"]
    control = context.controller.control(group)
    try:
        target = int(request.query.get("to", ""))
    except ValueError:
        return render(
            "Switchover",
            errors(["say which broker id to make master (?to=N)"]),
            current=CURRENT,
            status=400,
        )
    if control is None:
        return render(
            "Switchover",
            errors([f"group {group!r} is not managed by the controller"]),
            current=CURRENT,
            status=404,
        )
    form = changes(f"""<form method="post" action="{CURRENT}/{esc(group)}/switchover">
<input type="hidden" name="to" value="{target}">
<input type="hidden" name="epoch" value="{control.epoch}">
<button type="submit">Confirm switchover to broker {target}</button>
<a href="{CURRENT}">Cancel</a>
</form>""")
    body = f"""<p>Make broker <strong>{target}</strong> the master of group
<strong>{esc(group)}</strong> (now broker {control.master_id}, epoch {control.epoch})?
The master stops taking writes until broker {target} holds its whole log (at most
{CATCH_UP_TIMEOUT_MS / 1000:g} s), then the controller makes broker {target} master at
epoch {control.epoch + 1}. Nothing is lost.</p>
{form}"""
    return render(f"Switchover of {group}", body, current=CURRENT)


async def _switchover(context: ConsoleContext, request: web.Request) -> web.Response:
    group = request.match_info["group"]
    form = await request.post()
    try:
        target = int(str(form.get("to", "")))
        epoch = int(str(form.get("epoch", "")))
    except ValueError:
        return await cluster_page(
            context, problem="the switchover form lacks its broker id or epoch"
        )
    master = context.masters().get(group)
    if master is None:
        return await cluster_page(
            context, problem=f"group {group!r} has no master to hand over from"
        )
    started = time.monotonic()
    handed = await context.brokers.ask(
        master, Admin.handover, target, timeout_ms=CATCH_UP_TIMEOUT_MS, fence_ms=FENCE_MS
    )
    if not handed.ok:
        return await cluster_page(
            context, problem=f"the master refused the handover: {handed.error}"
        )
    try:
        control = await context.controller.switchover(group, target, epoch)
    except (SwitchoverRefused, ControllerUnavailable) as exc:
        resumed = await context.brokers.ask(master, Admin.resume_writes)
        tail = "" if resumed.ok else f"; writes resume by themselves later ({resumed.error})"
        return await cluster_page(context, problem=f"the controller refused: {exc}{tail}")
    elapsed_ms = (time.monotonic() - started) * 1000
    message = (
        f"{group}: broker {control.master_id} is master at epoch {control.epoch} "
        f"(handed over in {elapsed_ms:.0f} ms)"
    )
    if not await _roles_settled(context, group, control.master_id, control.epoch):
        message += (
            f"; the brokers have not all registered their new roles within "
            f"{ROLES_SETTLED_TIMEOUT_S:g} s, so the table below may still show old ones: it "
            "updates by itself as they do"
        )
    return await cluster_page(context, message=message)


async def _roles_settled(context: ConsoleContext, group: str, master_id: int, epoch: int) -> bool:
    """Whether the registry shows the switchover's roles (broker ``master_id`` master at
    ``epoch``, every other member slave), waiting up to :data:`ROLES_SETTLED_TIMEOUT_S`:
    the controller decides at once, the brokers re-register on hearing of it, and the page
    drawn before that would show the old roles."""

    def settled() -> bool:
        members = context.registry.members(group)
        return any(b.state.key.broker_id == master_id for b in members) and all(
            (b.state.role is Role.MASTER and b.state.epoch >= epoch)
            if b.state.key.broker_id == master_id
            else b.state.role is Role.SLAVE
            for b in members
        )

    give_up = time.monotonic() + ROLES_SETTLED_TIMEOUT_S
    while not settled():
        if time.monotonic() >= give_up:
            return False
        await asyncio.sleep(ROLES_POLL_S)  # the registry has no change signal to await
    return True
