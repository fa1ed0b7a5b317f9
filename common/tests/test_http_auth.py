"""The HTTP auth middleware on an app: routes added later are covered too."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from metaq.common import acl, http, http_auth
from metaq.common.acl import Acl, Grant, User
from metaq.common.acl_source import AclSource
from metaq.common.auth import ClusterSecret
from metaq.common.http_auth import HttpAuth, SignedRequests, sign_headers
from metaq.common.login_guard import FREE_FAILURES
from metaq.common.server_names import ServerNames, http_target
from metaq.common.users import ITERATIONS, Credentials, Verifier
from metaq.testing.waiting import run_async

ADMIN = Credentials("admin", "admin-secret-key-for-http-tests")


def _listening(client: TestClient[web.Request, web.Application], names: ServerNames) -> str:
    """The test server's name, now that it has its port (as a server sets its names once
    bound)."""
    names.listening(client.port, client.host)
    return http_target(client.host, client.port)


def test_a_route_added_after_the_app_was_made_needs_a_user(tmp_path: Path) -> None:
    path = tmp_path / "acl.json"
    table = Acl().with_user(User("admin", Verifier.make("admin", ADMIN.secret_key)))
    acl.save(path, table.grant("admin", Grant("admin", "cluster")))
    refusals: list[str] = []
    names = ServerNames()
    app = http.application(HttpAuth(SignedRequests(names, None, AclSource(path)), refusals.append))

    async def console(_request: web.Request) -> web.Response:
        return web.json_response({"console": True})

    app.add_routes([web.get("/console/", console), web.get("/health", console)])

    async def scenario() -> None:
        async with TestClient(TestServer(app)) as client:
            target = _listening(client, names)
            response = await client.get("/console/")
            assert response.status == 401
            assert refusals == ["unauthenticated"]
            assert (await client.get("/health")).status == 200
            signed = sign_headers("GET", target, "/console/", b"", credentials=ADMIN)
            response = await client.get("/console/", headers=signed)
            assert response.status == 200, await response.text()

    run_async(scenario())


SECRET = ClusterSecret(b"0123456789abcdef0123", "test")


def _app(tmp_path: Path, refusals: list[str]) -> tuple[web.Application, ServerNames]:
    path = tmp_path / "acl.json"
    table = Acl().with_user(User("admin", Verifier.make("admin", ADMIN.secret_key)))
    acl.save(path, table.grant("admin", Grant("admin", "cluster")))
    names = ServerNames()
    app = http.application(
        HttpAuth(SignedRequests(names, SECRET, AclSource(path)), refusals.append)
    )

    @http.takes_forms
    async def form(_request: web.Request) -> web.Response:
        return web.json_response({"posted": True})

    async def page(_request: web.Request) -> web.Response:
        return web.json_response({"page": True})

    app.add_routes([web.get("/console/topics", page), web.post("/console/topics", form)])
    return app, names


def test_a_cluster_member_signs_with_the_secret_once(tmp_path: Path) -> None:
    refusals: list[str] = []
    app, names = _app(tmp_path, refusals)

    async def scenario() -> None:
        async with TestClient(TestServer(app)) as client:
            target = _listening(client, names)
            signed = sign_headers("GET", target, "/console/topics", b"", secret=SECRET)
            response = await client.get("/console/topics", headers=signed)
            assert response.status == 200, await response.text()
            response = await client.get("/console/topics", headers=signed)
            assert response.status == 401 and "replay" in await response.text()
            other = ClusterSecret(b"fedcba9876543210fedc", "test")
            forged = sign_headers("GET", target, "/console/topics", b"", secret=other)
            response = await client.get("/console/topics", headers=forged)
            assert response.status == 401 and "cluster secret" in await response.text()

    run_async(scenario())
    assert refusals == ["replay", "bad_signature"]


@pytest.mark.parametrize("signer", ["member", "user"])
def test_a_request_signed_for_another_server_is_refused_and_stays_good_for_its_own(
    tmp_path: Path, signer: str
) -> None:
    refusals: list[str] = []
    app, names = _app(tmp_path, refusals)
    secret, credentials = (SECRET, None) if signer == "member" else (None, ADMIN)

    def sign(target: str, now_s: float | None = None) -> dict[str, str]:
        return sign_headers(
            "GET", target, "/console/topics", b"", secret=secret, credentials=credentials,
            now_s=now_s,
        )  # fmt: skip

    async def scenario() -> None:
        async with TestClient(TestServer(app)) as client:
            target = _listening(client, names)
            elsewhere = http_target(client.host, client.port + 1)
            for_other = sign(elsewhere)
            response = await client.get("/console/topics", headers=for_other)
            assert response.status == 401
            error = (await response.json())["error"]
            assert f"signed for server '{elsewhere}'" in error, error
            assert f"this server is {target}" in error, error
            # Claiming this server's name instead breaks the proof, which covers the name.
            claimed = {**for_other, http_auth.TARGET_HEADER: target}
            response = await client.get("/console/topics", headers=claimed)
            assert response.status == 401
            # Requests alike in all else, signed in one millisecond: different request
            # ids, so neither is the other's replay.
            now = time.time()
            for _ in range(2):
                mine = sign(target, now)
                response = await client.get("/console/topics", headers=mine)
                assert response.status == 200, await response.text()
            unbound = {k: v for k, v in mine.items() if k != http_auth.TARGET_HEADER}
            response = await client.get("/console/topics", headers=unbound)
            assert response.status == 401
            assert http_auth.TARGET_HEADER in (await response.json())["error"]

    run_async(scenario())
    assert refusals[0] == "wrong_server"
    assert refusals[-1] == "unbound"


def test_a_browser_goes_to_login_and_a_session_posts_forms_only_from_this_site(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with TestClient(TestServer(_app(tmp_path, [])[0])) as client:
            page = await client.get(
                "/console/topics?x=1", headers={"Accept": "text/html"}, allow_redirects=False
            )
            assert page.status == 303
            assert page.headers["Location"] == "/login?next=/console/topics?x%3D1"
            # A tool asking for JSON gets the 401 saying what to do instead.
            assert (await client.get("/console/topics")).status == 401
            login = await client.post(
                "/login", json={"access_key": "admin", "secret_key": ADMIN.secret_key}
            )
            assert login.status == 200
            assert "Secure" not in login.headers["Set-Cookie"]  # plain HTTP here
            for headers, status in (
                ({"Sec-Fetch-Site": "same-origin"}, 200),
                ({"Sec-Fetch-Site": "cross-site"}, 403),
                ({"Origin": "http://evil.example"}, 403),
                ({"Origin": "null"}, 403),
            ):
                posted = await client.post("/console/topics", data={"a": "1"}, headers=headers)
                assert posted.status == status, (headers, await posted.text())

    run_async(scenario())


def test_an_unknown_users_login_derives_a_key_as_a_known_users_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[tuple[str, int]] = []
    real = http_auth._proves

    def spy(access_key: str, secret_key: str, verifier: Verifier) -> bool:
        checked.append((access_key, verifier.iterations))
        return real(access_key, secret_key, verifier)

    monkeypatch.setattr(http_auth, "_proves", spy)

    async def scenario() -> None:
        async with TestClient(TestServer(_app(tmp_path, [])[0])) as client:
            for user in ("admin", "nobody"):
                wrong = {"access_key": user, "secret_key": "not-the-secret-key-at-all"}
                assert (await client.post("/login", json=wrong)).status == 401

    run_async(scenario())
    # The same slow derivation for both: the answer's timing tells nothing of who exists.
    assert checked == [("admin", ITERATIONS), ("nobody", ITERATIONS)]


def test_failed_logins_are_held_back_longer_and_longer(tmp_path: Path) -> None:
    refusals: list[str] = []

    async def scenario() -> None:
        async with TestClient(TestServer(_app(tmp_path, refusals)[0])) as client:
            wrong = {"access_key": "admin", "secret_key": "not-the-secret-key-at-all"}
            for _ in range(FREE_FAILURES):
                assert (await client.post("/login", json=wrong)).status == 401
            held = await client.post("/login", json=wrong)
            assert held.status == 401  # the sixth failure is answered, and sets a wait
            held = await client.post("/login", json=wrong)
            assert held.status == 429
            assert held.headers["Retry-After"] == "1"
            assert "too many failed logins" in (await held.json())["error"]
            # Even the right key waits: the guard holds the user, not the guess.
            right = {"access_key": "admin", "secret_key": ADMIN.secret_key}
            assert (await client.post("/login", json=right)).status == 429

    run_async(scenario())
    assert refusals.count("throttled") == 2


@web.middleware
async def _from(request: web.Request, handler: http.Handler) -> web.StreamResponse:
    """Test scaffolding: the request as if it came from the address in X-Test-Remote."""
    return await handler(request.clone(remote=request.headers.get("X-Test-Remote", "127.0.0.1")))


def test_without_auth_console_changes_come_from_this_host_or_a_cluster_member() -> None:
    refusals: list[str] = []
    names = ServerNames()
    guard = http_auth.loopback_or_member(
        "/console/", SignedRequests(names, SECRET), refusals.append
    )
    app = web.Application(middlewares=[_from, guard])

    async def changed(_request: web.Request) -> web.Response:
        return web.json_response({"changed": True})

    app.add_routes([web.get("/console/x", changed), web.post("/console/x", changed)])
    app.add_routes([web.post("/elsewhere", changed)])
    far = {"X-Test-Remote": "10.0.0.5"}

    async def scenario() -> None:
        async with TestClient(TestServer(app)) as client:
            target = _listening(client, names)
            assert (await client.get("/console/x", headers=far)).status == 200  # reading
            refused = await client.post("/console/x", headers=far)
            assert refused.status == 403
            assert "only from this host" in (await refused.json())["error"]
            assert (await client.post("/console/x")).status == 200  # from loopback
            assert (await client.post("/elsewhere", headers=far)).status == 200
            signed = {**far, **sign_headers("POST", target, "/console/x", b"", secret=SECRET)}
            assert (await client.post("/console/x", headers=signed)).status == 200
            assert (await client.post("/console/x", headers=signed)).status == 401  # replay

    run_async(scenario())
    assert refusals == ["not_local", "replay"]


def test_a_user_without_admin_gets_a_styled_page_saying_what_they_hold_and_can_log_out(
    tmp_path: Path,
) -> None:
    path = tmp_path / "acl.json"
    reader = Credentials("reader", "reader-secret-key-for-http-tests")
    table = Acl().with_user(User("reader", Verifier.make("reader", reader.secret_key)))
    acl.save(path, table.grant("reader", Grant("sub", "group:billing")))
    css = "/console/static/console.css"
    app = http.application(
        HttpAuth(SignedRequests(ServerNames(), None, AclSource(path)), None, css)
    )

    async def sheet(_request: web.Request) -> web.Response:
        return web.Response(text="body {}", content_type="text/css")

    async def page(_request: web.Request) -> web.Response:
        return web.Response(text="the console", content_type="text/html")

    app.add_routes([web.get(css, sheet), web.get("/console/topics", page)])
    html_page = {"Accept": "text/html"}

    async def scenario() -> None:
        async with TestClient(TestServer(app)) as client:
            login_page = await (await client.get("/login")).text()
            assert f'<link rel="stylesheet" href="{css}">' in login_page
            assert (await client.get(css)).status == 200  # before logging in, as the page is
            login = await client.post(
                "/login", json={"access_key": "reader", "secret_key": reader.secret_key}
            )
            assert login.status == 200
            refused = await client.get("/console/topics", headers=html_page)
            assert refused.status == 403
            assert refused.content_type == "text/html"
            text = await refused.text()
            assert "logged in as <strong>reader</strong>" in text, text
            assert "<code>sub group:billing</code>" in text, text
            assert f'href="{css}"' in text and 'action="/logout"' in text, text
            # A tool still gets the JSON refusal.
            assert "error" in await (await client.get("/console/topics")).json()
            out = await client.post(
                "/logout", headers={"Sec-Fetch-Site": "same-origin"}, allow_redirects=False
            )
            assert (out.status, out.headers["Location"]) == (303, "/login")
            after = await client.get("/console/topics", headers=html_page, allow_redirects=False)
            assert after.status == 303 and after.headers["Location"].startswith("/login?next=")

    run_async(scenario())
