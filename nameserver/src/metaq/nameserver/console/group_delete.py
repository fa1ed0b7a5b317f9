"""Deleting a consumer group from its page, with the broker calls ``metaq group delete``
makes through :meth:`metaq.client.admin.Admin.delete_group`: every master forgets the
group's committed offsets (refused while it has live members, unless forced) and, when
asked, its retry and dead-letter topics go too."""

from __future__ import annotations

import asyncio

from aiohttp import web

from metaq.client.admin import Admin
from metaq.common.http import takes_forms
from metaq.common.names import dlq_topic, retry_topic
from metaq.nameserver.console.context import ConsoleContext, problems_of
from metaq.nameserver.console.groups import CURRENT, group_page, list_page


def routes(context: ConsoleContext) -> list[web.RouteDef]:
    @takes_forms
    async def delete(request: web.Request) -> web.Response:
        return await _delete(context, request)

    return [web.post(CURRENT + "/{group}/delete", delete)]


async def _delete(context: ConsoleContext, request: web.Request) -> web.Response:
    group = request.match_info["group"]
    form = await request.post()
    force = form.get("force") == "1"
    masters = list(context.masters().values())
    if not masters:
        return await group_page(context, group, problem="no broker group has a master now")
    answers = await asyncio.gather(
        *(context.brokers.ask(m, Admin.delete_group_offsets, group, force=force) for m in masters)
    )
    problems = problems_of(answers)
    if problems:
        # A master with live members refuses, naming them: nothing more is deleted.
        return await group_page(context, group, problem="; ".join(problems))
    deleted = sum(a.get((0, []))[0] for a in answers)
    live = sorted({m for a in answers for m in a.get((0, []))[1]})
    topics = [t for asked, t in ((form.get("retry"), retry_topic(group)),
                                 (form.get("dlq"), dlq_topic(group))) if asked == "1"]  # fmt: skip
    removed = await asyncio.gather(
        *(context.brokers.ask(m, Admin.remove_topic, t) for t in topics for m in masters)
    )
    problems = problems_of(removed)
    message = f"consumer group {group} deleted: {deleted} committed offset(s) forgotten"
    if topics:
        message += f"; {', '.join(topics)} removed"
    if live:
        message += (
            f"; its live members ({', '.join(live)}) commit their positions again, and the "
            "group comes back"
        )
    return await list_page(context, message=message, problem="; ".join(problems))
