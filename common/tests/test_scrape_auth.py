"""metrics_auth: the credentials /metrics and /health's detail need, on an aiohttp app."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from metaq.common.auth import ClusterSecret
from metaq.common.http_auth import SignedRequests, scrape_guard, shows_detail, sign_headers
from metaq.common.scrape_auth import (
    MetricsAuth,
    MetricsAuthError,
    ScrapeCredentials,
    config_problems,
    load_scrape_credentials,
)
from metaq.common.server_names import ServerNames, http_target
from metaq.testing.waiting import run_async

TOKEN = "a-scrape-token-of-enough-length"
SECRET = ClusterSecret(b"0123456789abcdef0123", "test")


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_bearer_and_basic_credentials_admit_only_their_own_header() -> None:
    bearer = ScrapeCredentials(MetricsAuth.BEARER, TOKEN, "prometheus", "test")
    assert bearer.admits(f"Bearer {TOKEN}") and bearer.admits(f"bearer  {TOKEN} ")
    for header in (None, "", f"Bearer {TOKEN}x", f"Basic {TOKEN}", _basic("prometheus", TOKEN)):
        assert not bearer.admits(header), header
    basic = ScrapeCredentials(MetricsAuth.BASIC, TOKEN, "prometheus", "test")
    assert basic.admits(_basic("prometheus", TOKEN))
    for header in (_basic("other", TOKEN), _basic("prometheus", TOKEN + "x"), "Basic !!",
                   f"Bearer {TOKEN}"):  # fmt: skip
        assert not basic.admits(header), header
    assert TOKEN not in repr(bearer) and TOKEN not in repr(basic)
    assert bearer.challenge.startswith("Bearer realm=")
    assert basic.challenge.startswith("Basic realm=")


def test_the_secret_comes_from_a_file_and_a_weak_or_missing_one_stops_the_start(
    tmp_path: Path,
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    os.chmod(token, 0o600)
    loaded = load_scrape_credentials(MetricsAuth.BEARER, str(token), "prometheus")
    assert loaded is not None and loaded.admits(f"Bearer {TOKEN}")
    assert load_scrape_credentials(MetricsAuth.NONE, "", "prometheus") is None
    with pytest.raises(MetricsAuthError, match=r"metrics_auth_file .*missing: cannot read"):
        load_scrape_credentials(MetricsAuth.BEARER, str(tmp_path / "missing"), "prometheus")
    token.write_text("short")
    with pytest.raises(MetricsAuthError, match="5 characters; it needs 16"):
        load_scrape_credentials(MetricsAuth.BEARER, str(token), "prometheus")
    assert config_problems(MetricsAuth.NONE, "", "") == []
    assert "needs metrics_auth_file" in config_problems(MetricsAuth.BEARER, "", "x")[0]
    assert "metrics_auth_user" in config_problems(MetricsAuth.BASIC, "f", "a:b")[0]


def _app(
    credentials: ScrapeCredentials, names: ServerNames, refusals: list[str]
) -> web.Application:
    signed = SignedRequests(names, SECRET)
    app = web.Application(middlewares=[scrape_guard(credentials, signed, refusals.append)])

    async def health(request: web.Request) -> web.Response:
        if not shows_detail(request):
            return web.json_response({"status": "ok"})
        return web.json_response({"status": "ok", "detail": "topics and addresses"})

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text="metaq_up 1\n")

    app.add_routes([web.get("/health", health), web.get("/metrics", metrics)])
    return app


def test_metrics_need_the_credentials_and_health_shows_detail_only_with_them() -> None:
    credentials = ScrapeCredentials(MetricsAuth.BEARER, TOKEN, "prometheus", "test")
    names, refusals = ServerNames(), []

    async def scenario() -> None:
        async with TestClient(TestServer(_app(credentials, names, refusals))) as client:
            names.listening(client.port, client.host)
            refused = await client.get("/metrics")
            assert refused.status == 401
            assert refused.headers["WWW-Authenticate"] == 'Bearer realm="metaq metrics"'
            assert "Authorization: Bearer" in (await refused.json())["error"]
            wrong = {"Authorization": f"Bearer {TOKEN}-old"}
            for path in ("/metrics", "/health"):  # a stale secret hears about it
                assert (await client.get(path, headers=wrong)).status == 401
            right = {"Authorization": f"Bearer {TOKEN}"}
            scraped = await client.get("/metrics", headers=right)
            assert scraped.status == 200 and "metaq_up" in await scraped.text()
            assert await (await client.get("/health")).json() == {"status": "ok"}
            detailed = await (await client.get("/health", headers=right)).json()
            assert detailed["detail"] == "topics and addresses"
            # A cluster member's signature (the console asking a broker) counts too.
            target = http_target(client.host, client.port)
            for path in ("/health", "/metrics"):
                member = sign_headers("GET", target, path, b"", secret=SECRET)
                answer = await client.get(path, headers=member)
                assert answer.status == 200, await answer.text()

    run_async(scenario())
    assert refusals == ["metrics_auth"] * 3
