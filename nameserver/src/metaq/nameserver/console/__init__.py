"""The web console every nameserver serves under ``/console/`` (docs/operations.md).

Server-rendered pages, a stylesheet and a little script for live refresh, all from this
package (no build step, nothing from elsewhere). Broker-side figures come from the
brokers' HTTP admin APIs, each call bounded by ``console_broker_timeout_ms``: a page
shows what it could gather and says in plain words what it could not. Changes (a
switchover, a topic, a reset, a resend) are POST forms only.
"""

from __future__ import annotations

from aiohttp import web

from metaq.nameserver.console import (
    broker_config,
    cluster,
    group_delete,
    groups,
    messages,
    overview,
    producers,
    scheduled,
    topics,
    users,
)
from metaq.nameserver.console.context import ConsoleContext
from metaq.nameserver.console.page import middleware, static_routes

__all__ = ["ConsoleContext", "add_routes"]


def add_routes(app: web.Application, context: ConsoleContext) -> None:
    """Every console route, registered on ``app`` (so its middlewares cover them all)."""

    async def home(_request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/console/overview")

    app.add_routes([web.get("/", home), web.get("/console", home), web.get("/console/", home)])
    app.middlewares.append(middleware())
    app.add_routes(static_routes())
    for module in (
        overview,
        cluster,
        broker_config,
        topics,
        groups,
        group_delete,
        producers,
        scheduled,
        messages,
        users,
    ):
        app.add_routes(module.routes(context))

    async def start_sampling(_app: web.Application) -> None:
        context.sampler.start()

    app.on_startup.append(start_sampling)
    app.on_cleanup.append(lambda _app: context.close())
