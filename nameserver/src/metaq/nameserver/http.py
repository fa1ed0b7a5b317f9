"""The nameserver's HTTP endpoint for people and scrapers: health, cluster and routes as JSON,
and the web console (:mod:`metaq.nameserver.console`)."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from metaq.common import http
from metaq.common.http_auth import (
    HttpAuth,
    SignedRequests,
    loopback_or_member,
    scrape_guard,
    shows_detail,
)
from metaq.common.names import shown
from metaq.common.scrape_auth import ScrapeCredentials
from metaq.common.server_names import ServerNames
from metaq.common.version import installed_version
from metaq.nameserver import acl_http
from metaq.nameserver.cluster_acl import ClusterAcl
from metaq.nameserver.console import ConsoleContext
from metaq.nameserver.console import add_routes as add_console_routes
from metaq.nameserver.console.page import STYLESHEET
from metaq.nameserver.metrics import NameServerMetrics
from metaq.nameserver.registry import Registry


def _json(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def _respond(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=lambda v: json.dumps(v, default=_json))


def make_app(
    registry: Registry,
    metrics: NameServerMetrics | None = None,
    signed: SignedRequests | None = None,
    count: Callable[[str], None] | None = None,
    console: ConsoleContext | None = None,
    scrape: ScrapeCredentials | None = None,
    cluster_acl: ClusterAcl | None = None,
) -> web.Application:
    """``GET /health``, ``GET /cluster``, ``GET /route/{topic}`` (404 for an unknown topic),
    with ``metrics`` ``GET /metrics`` (Prometheus text format, open to scrapers), and with
    ``console`` the web console under ``/console/`` (``/`` leads there). ``signed`` holds
    this server's names, its cluster secret and, with users, its ACL: then all but
    /health and /metrics need a user or a cluster member's signature; without users, the
    console's changes are taken only from this host or signed by a cluster member
    (``metaq.common.http_auth``). With ``scrape`` (``metrics_auth``), /metrics and the
    detail of /health need those credentials. With ``cluster_acl``, ``GET /acl`` and
    ``PUT /acl`` read and change the cluster's users and grants
    (:mod:`metaq.nameserver.acl_http`)."""
    count = count or (lambda _reason: None)
    signed = signed or SignedRequests(ServerNames(), None)

    async def health(request: web.Request) -> web.Response:
        if not shows_detail(request):
            return _respond({"status": "ok"})
        return _respond(
            {
                "status": "ok",
                "version": installed_version("metaq-nameserver"),
                "topics": len(registry.topics()),
            }
        )

    async def cluster(_request: web.Request) -> web.Response:
        return _respond(
            {
                "broker_expiry_s": registry.broker_expiry_s,
                "clusters": [dataclasses.asdict(c) for c in registry.cluster_info()],
            }
        )

    async def route(request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        found = registry.route(topic)
        if found is None:
            return _respond(
                {"error": f"topic {shown(topic)} is not served by any live broker"}, 404
            )
        return _respond(dataclasses.asdict(found))

    async def metrics_page(_request: web.Request) -> web.Response:
        assert metrics is not None
        response = web.Response(body=metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    stylesheet = STYLESHEET if console is not None else ""
    # The console's pages, read-only, for users holding view cluster (its read-only role).
    viewable = ("/", "/console", "/console/") if console is not None else ()
    auth = HttpAuth(signed, count, stylesheet, viewable) if signed.source is not None else None
    app = http.application(auth)
    if scrape is not None:
        app.middlewares.append(scrape_guard(scrape, signed, count))
    app.add_routes(
        [
            web.get("/health", health),
            web.get("/cluster", cluster),
            web.get("/route/{topic}", route),
        ]
    )
    if metrics is not None:
        app.add_routes([web.get("/metrics", metrics_page)])
    if cluster_acl is not None:
        app.add_routes(acl_http.routes(cluster_acl))
    if console is not None:
        if signed.source is None:
            app.middlewares.append(loopback_or_member("/console/", signed, count))
        add_console_routes(app, console)
    return app
