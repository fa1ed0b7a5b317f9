"""What waits on each broker group's master: delayed messages (how many, and per tier of
the timer wheel how many and when its head next moves or is delivered) and transactional
half messages waiting for their producer's commit or rollback (the check-back)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from metaq.client.admin import Admin, ScheduledWork
from metaq.nameserver.console.context import Answer, ConsoleContext, problems_of
from metaq.nameserver.console.page import Num, errors, render, table, when

CURRENT = "/console/scheduled"


def routes(context: ConsoleContext) -> list[web.RouteDef]:
    async def page(_request: web.Request) -> web.Response:
        return await scheduled_page(context)

    return [web.get(CURRENT, page)]


async def scheduled_page(context: ConsoleContext) -> web.Response:
    masters = context.masters()
    answers = await asyncio.gather(
        *(context.brokers.ask(b, Admin.scheduled) for b in masters.values())
    )
    found = dict(zip(masters, answers, strict=True))
    body = (
        '<div id="scheduled-live" data-live>'
        + errors(problems_of(answers))
        + table(
            [
                "broker group",
                "delayed messages",
                "next due",
                "half messages waiting",
                "oldest since",
                "most check-backs (of max)",
                "discarded",
            ],
            [_summary(name, a) for name, a in sorted(found.items())],
            caption="Waiting per broker group",
        )
        + table(
            ["broker group", "tier", "holds messages due", "messages", "head next moves"],
            [
                [name, t.tier, Num(f"≥ {t.waits_s:,} s ahead"), t.pending, when(t.next_due_ms)]
                for name, a in sorted(found.items())
                if a.value is not None and a.value.delayed is not None
                for t in a.value.delayed.tiers
            ],
            caption="Timer wheel",
        )
        + '<p class="muted">A delayed message waits in the tier of its remaining time and '
        "moves down as it comes due. A half message is checked back with its producer "
        "once it is older than the check-after time, and discarded after the last check."
        "</p></div>"
    )
    if not masters:
        body += "<p>No broker group has a master now.</p>"
    return render("Delayed and transactions", body, current=CURRENT)


def _summary(name: str, answer: Answer[ScheduledWork]) -> list[object]:
    work = answer.value
    if work is None:
        return [name, None, None, None, None, None, None]
    delayed, txn = work.delayed, work.transactions
    return [
        name,
        delayed.pending if delayed else None,
        when(delayed.next_due_ms) if delayed else None,
        txn.pending if txn else None,
        when(txn.oldest_ms) if txn else None,
        Num(f"{txn.most_checks} / {txn.max_checks}") if txn else None,
        txn.discarded if txn else None,
    ]
