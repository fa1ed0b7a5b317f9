"""The HTTP auth middleware on an app: routes added later are covered too."""

from __future__ import annotations

import time
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from metaq.common import acl, http
from metaq.common.acl import Acl, Grant, User
from metaq.common.acl_source import AclSource
from metaq.common.http_auth import HEADER, HttpAuth, signed_purpose
from metaq.common.testing import run_async
from metaq.common.users import Credentials, Verifier, sign_request

ADMIN = Credentials("admin", "admin-secret-key-for-http-tests")


def test_a_route_added_after_the_app_was_made_needs_a_user(tmp_path: Path) -> None:
    path = tmp_path / "acl.json"
    table = Acl().with_user(User("admin", Verifier.make("admin", ADMIN.secret_key)))
    acl.save(path, table.grant("admin", Grant("admin", "cluster")))
    refusals: list[str] = []
    app = http.application(HttpAuth(AclSource(path), refusals.append))

    async def console(_request: web.Request) -> web.Response:
        return web.json_response({"console": True})

    app.add_routes([web.get("/console/", console), web.get("/health", console)])

    async def scenario() -> None:
        async with TestClient(TestServer(app)) as client:
            response = await client.get("/console/")
            assert response.status == 401
            assert refusals == ["unauthenticated"]
            assert (await client.get("/health")).status == 200
            proof = sign_request(ADMIN, signed_purpose("GET", "/console/"), b"", time.time())
            response = await client.get("/console/", headers={HEADER: proof})
            assert response.status == 200, await response.text()

    run_async(scenario())
