"""Who may use the HTTP APIs and consoles of brokers and nameservers.

With ``auth_enabled`` the middleware of :func:`metaq.common.http.application` lets
through only ``/health``, ``/metrics``, ``/login``, ``/logout`` (and the pages' stylesheet)
unauthenticated; every other route,
including ones added to the app later (the console), needs a user holding ``admin
cluster``, proven one of two ways:

- **Tools** sign each request: header ``X-Metaq-User`` with
  :func:`metaq.common.users.sign_request` over :func:`_purpose` and the body,
  within the clock window; each proof is taken once (a replay within the window is
  refused).
- **People** log in: ``POST /login`` with JSON ``{"access_key", "secret_key"}`` (the
  ``GET /login`` page does it) sets a random session cookie, HttpOnly, SameSite=Strict,
  ``Secure`` when the listener serves TLS, expiring after :data:`SESSION_TTL_S`. A
  browser asking for a page without a session is sent to ``/login?next=PATH``, which
  returns it there once logged in; ``POST /logout`` ends the session. A user logged in
  without ``admin cluster`` who asks for a page gets one (403) naming them, what they
  lack and what their grants are, instead of the JSON refusal. A request that changes
  something on a session must come from this site's own pages, by the one rule the
  console's forms also follow
  (:func:`metaq.common.http.same_site`), so another site cannot make a logged-in browser
  act (CSRF), on top of SameSite and the JSON-only rule.
- **Cluster members** (the nameservers' console calling a broker) sign each request
  with the cluster secret: header :data:`metaq.common.auth.HTTP_HEADER` made by
  :func:`metaq.common.auth.sign_http`, taken once, as a user's signature is.

Both kinds of signature cover the server the request is for (:data:`TARGET_HEADER`,
``host:port`` as the signer dialled it) and a random request id (:data:`REQUEST_ID_HEADER`)
besides the method, path, body and time; a server takes one only when it names this server
(:mod:`metaq.common.server_names`), so a signed request copied to another server, even within
the window, is refused. :func:`sign_headers` is the one signer.

Without auth, :func:`loopback_or_member` keeps the nameservers' console's changes to this
host and cluster members; with ``metrics_auth``, :func:`scrape_guard` keeps ``/metrics`` and
the detail of ``/health`` to those with the scrape credentials (:mod:`metaq.common.scrape_auth`).

Refusals are 401 (who are you) or 403 (not allowed), JSON ``{"error": ...}`` saying what
to do, counted by reason and logged without any key.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import html
import ipaddress
import logging
import math
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Final
from urllib.parse import quote

from aiohttp import web
from aiohttp.typedefs import Middleware

from metaq.common import acl
from metaq.common.acl import PermissionDenied, User
from metaq.common.acl_source import AclSource
from metaq.common.auth import HTTP_HEADER, AuthFailed, ClusterSecret, sign_http, verify_http
from metaq.common.http import json_object, same_site, takes_forms
from metaq.common.login_guard import LoginGuard
from metaq.common.names import shown
from metaq.common.scrape_auth import MetricsAuth, ScrapeCredentials
from metaq.common.server_names import ServerNames, signed_purpose
from metaq.common.users import (
    MAX_CLOCK_SKEW_S,
    USER_METADATA_KEY,
    Credentials,
    ProofError,
    Verifier,
    parse_proof,
    sign_request,
    verify_request,
)

log = logging.getLogger(__name__)

OPEN_PATHS: Final = frozenset({"/health", "/metrics", "/login"})
SCRAPE_PATHS: Final = frozenset({"/health", "/metrics"})
"""What ``metrics_auth`` guards (:func:`scrape_guard`)."""
HEADER: Final = "X-Metaq-User"
assert HEADER.lower() == USER_METADATA_KEY
TARGET_HEADER: Final = "X-Metaq-Target"
"""The server a signed request is for: ``host:port`` as the signer dialled it
(:func:`metaq.common.server_names.http_target`), under its proof."""
REQUEST_ID_HEADER: Final = "X-Metaq-Request-Id"
"""A random id of each signed request, under its proof: two requests alike in every other
way and signed within one millisecond have different proofs, so the second is not taken
for a replay of the first."""
REQUEST_ID_BYTES: Final = 8
_REQUEST_ID: Final = re.compile(rf"[0-9a-f]{{{2 * REQUEST_ID_BYTES}}}")
_DETAIL: Final = web.RequestKey("metaq_health_detail", bool)
LOGGED_IN: Final = web.RequestKey("metaq_logged_in", str)
"""The access key of the user whose session a request came with (pages name them)."""
MAY_CHANGE: Final = web.RequestKey("metaq_may_change", bool)
"""Whether whoever made a request may change things (False for a ``view cluster`` user's
session, which pages then show without their forms)."""
COOKIE: Final = "metaq_session"
SESSION_TTL_S: Final = 8 * 3600.0
MAX_SESSIONS: Final = 10_000
_SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
_LOGIN_SCRIPT: Final = r"""
document.getElementById("f").onsubmit = async (e) => {
  e.preventDefault();
  const d = Object.fromEntries(new FormData(e.target));
  const r = await fetch("/login", {method: "POST", headers: {"Content-Type":
    "application/json"}, body: JSON.stringify(d)});
  const a = await r.json();  // read to the end, so that leaving does not abort it
  if (!r.ok) { document.getElementById("m").textContent = a.error; return; }
  // Only a path of this site: "//host" or "/\host" would leave it.
  const next = new URLSearchParams(location.search).get("next") || "";
  if (/^\/(?![\/\\])/.test(next)) { location.assign(next); return; }
  document.getElementById("m").textContent = "logged in";
};
"""
_LOGIN_FORM: Final = """<form id="f"><fieldset><legend>Log in</legend>
<label>access key <input name="access_key" autocomplete="username"></label>
<label>secret key <input name="secret_key" type="password"
autocomplete="current-password"></label><button>log in</button></fieldset></form>
<p id="m" role="status"></p>"""
_LOGIN_SCRIPT_SHA256: Final = base64.b64encode(
    hashlib.sha256(_LOGIN_SCRIPT.encode()).digest()
).decode()
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_NOBODY: Final = Verifier(secrets.token_bytes(32), secrets.token_bytes(32))
"""The verifier an unknown user's login is checked against: no secret key matches it."""


_LOGOUT_FORM: Final = """<form method="post" action="/logout">
<button type="submit">Log out</button></form>"""


def _page(
    title: str, body: str, stylesheet: str, *, script: str = "", status: int = 200
) -> web.Response:
    """A page of this module (login, refusal) in the server's stylesheet when it has one."""
    style = f'<link rel="stylesheet" href="{html.escape(stylesheet)}">' if stylesheet else ""
    tail = f"<script>{script}</script>" if script else ""
    text = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)} · metaq</title>
<link rel="icon" href="data:,">{style}
</head><body><header><strong>metaq</strong></header>
<main><h1>{html.escape(title)}</h1>
{body}
</main>{tail}</body></html>"""
    return web.Response(text=text, content_type="text/html", status=status)


def _proves(access_key: str, secret_key: str, verifier: Verifier) -> bool:
    """Whether ``secret_key`` is the one ``verifier`` was made from."""
    try:
        made = Verifier.make(access_key, secret_key, verifier.iterations)
    except ValueError:  # malformed: no user can have it, known or not
        return False
    return hmac.compare_digest(made.stored_key, verifier.stored_key)


def _refusal(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _purpose(method: str, target: str, request_id: str, path_qs: str) -> str:
    """What both kinds of proof of an HTTP request cover, besides its body and time
    (:func:`~metaq.common.server_names.signed_purpose`): the method, the server it is for,
    its request id and the path with its query as sent (percent-encoded)."""
    return signed_purpose("http", method, target, request_id, path_qs)


def sign_headers(
    method: str,
    target: str,
    path_qs: str,
    body: bytes,
    *,
    secret: ClusterSecret | None = None,
    credentials: Credentials | None = None,
    now_s: float | None = None,
) -> dict[str, str]:
    """The headers that sign one HTTP request for server ``target`` (``http_target`` of
    the host and port it is sent to): with ``secret`` as a cluster member, else with a
    user's ``credentials``; none with neither."""
    if secret is None and credentials is None:
        return {}
    request_id = secrets.token_hex(REQUEST_ID_BYTES)
    purpose = _purpose(method, target, request_id, path_qs)
    now_s = time.time() if now_s is None else now_s
    headers = {TARGET_HEADER: target, REQUEST_ID_HEADER: request_id}
    if secret is not None:
        headers[HTTP_HEADER] = sign_http(secret, purpose, body, now_s)
    else:
        assert credentials is not None
        headers[HEADER] = sign_request(credentials, purpose, body, now_s)
    return headers


class SignedRequests:
    """Requests signed for this server: by a cluster member (the cluster secret) or, with
    users (``source``), by a user; each proof taken once within the clock window.

    A proof covers the server the request names (:data:`TARGET_HEADER`), which must be one
    of this server's own :class:`~metaq.common.server_names.ServerNames`: a request signed
    for another server (another nameserver, a master when this is its slave) is refused,
    saying so, before its proof is even checked."""

    def __init__(
        self, names: ServerNames, secret: ClusterSecret | None, source: AclSource | None = None
    ) -> None:
        self.names = names
        self.source = source
        self._secret = secret
        # proofs taken within the window -> when they stop mattering
        self._seen: dict[bytes, float] = {}

    async def admitted(self, request: web.Request) -> bool:
        """True for a request signed for this server by a cluster member, or by a user
        holding ``admin cluster``; False for one that carries no signature this server
        reads (a user's, without users); ProofError for a signature that does not hold,
        PermissionDenied for a user without the grant."""
        member = request.headers.get(HTTP_HEADER)
        if member is not None:
            await self._member(request, member)
            return True
        user = request.headers.get(HEADER)
        if user is None or self.source is None:
            return False
        acl.check(await self._user(request, user), "admin", "cluster", "")
        return True

    async def _member(self, request: web.Request, proof: str) -> None:
        if self._secret is None:
            raise ProofError(
                f"this server holds no cluster secret, so the {HTTP_HEADER} header proves "
                "nothing here; sign as a user (X-Metaq-User)",
                "bad_signature",
            )
        purpose = self._purpose(request)
        body = await request.read()
        try:
            verify_http(self._secret, purpose, body, proof, time.time())
        except AuthFailed as exc:
            raise ProofError(str(exc), "bad_signature") from None
        self._once(proof.encode())

    async def _user(self, request: web.Request, header: str) -> User:
        assert self.source is not None
        access_key, stamp, proof = parse_proof(header)
        purpose = self._purpose(request)
        user = self.source.acl.user(access_key)
        body = await request.read()
        verify_request(
            user.verifier if user else None, access_key, stamp, proof, purpose, body, time.time()
        )
        self._once(proof)
        assert user is not None
        return user

    def _purpose(self, request: web.Request) -> str:
        """What the request's proof must cover, once it is known to be for this server."""
        target = self.names.check(request.headers.get(TARGET_HEADER), TARGET_HEADER)
        request_id = request.headers.get(REQUEST_ID_HEADER, "")
        if not _REQUEST_ID.fullmatch(request_id):
            raise ProofError(
                f"a signed request carries a request id ({REQUEST_ID_HEADER}: "
                f"{2 * REQUEST_ID_BYTES} hex digits) under its proof; this one lacks it: sign "
                "it with a metaq client of this release",
                "unbound",
            )
        return _purpose(request.method, target, request_id, request.path_qs)

    def _once(self, proof: bytes) -> None:
        """Take a proof, or refuse it as a replay of one already taken."""
        now = time.monotonic()
        if len(self._seen) > 4 * MAX_SESSIONS:
            self._seen = {p: t for p, t in self._seen.items() if t > now}
        if self._seen.get(proof, 0.0) > now:
            raise ProofError("this signed request was already taken: a replay", "replay")
        self._seen[proof] = now + 2 * MAX_CLOCK_SKEW_S


def loopback_or_member(
    prefix: str, signed: SignedRequests, count: Callable[[str], None]
) -> Middleware:
    """Without auth: a middleware that lets a change under ``prefix`` (the console's
    buttons) through only from this host or signed for this server by a cluster member;
    what only reads stays open, as everything does without auth."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method in _SAFE_METHODS or not request.path.startswith(prefix):
            return await handler(request)
        if _is_loopback(request.remote):
            return await handler(request)
        try:
            if await signed.admitted(request):
                return await handler(request)
        except ProofError as exc:
            count(exc.reason)
            return _refusal(401, str(exc))
        count("not_local")
        log.warning("refused HTTP %s %s from %s: not from this host", request.method,
                    request.path, request.remote)  # fmt: skip
        return _refusal(
            403,
            f"{request.method} {request.path} changes the cluster: without auth it is taken "
            "only from this host (open the console through an SSH tunnel) or signed with "
            "the cluster secret; or enable auth (auth_enabled = true) and log in",
        )

    return guard


def shows_detail(request: web.Request) -> bool:
    """Whether ``/health`` may say more than ok / not-ok to this request: always, unless
    :func:`scrape_guard` found it without credentials."""
    return bool(request.get(_DETAIL, True))


def scrape_guard(
    credentials: ScrapeCredentials, signed: SignedRequests, count: Callable[[str], None]
) -> Middleware:
    """With ``metrics_auth`` (:mod:`metaq.common.scrape_auth`): ``/metrics`` only with the
    credentials, ``/health``'s detail (:func:`shows_detail`) likewise; a request signed as
    a cluster member or an admin user counts as credentials. Wrong credentials are 401 on
    both pages, so a scraper configured with a stale secret hears about it."""
    what = (
        "Authorization: Bearer TOKEN (Prometheus: authorization.credentials_file)"
        if credentials.scheme is MetricsAuth.BEARER
        else "Authorization: Basic (Prometheus: basic_auth with username and password_file)"
    )

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in SCRAPE_PATHS:
            return await handler(request)
        authorization = request.headers.get("Authorization")
        try:
            if authorization is not None:
                proved = credentials.admits(authorization)
                if not proved:
                    raise ProofError(
                        f"the Authorization header does not carry this server's metrics "
                        f"credentials (metrics_auth = {credentials.scheme.value}): check the "
                        "secret the scraper sends against metrics_auth_file",
                        "metrics_auth",
                    )
            else:
                proved = await signed.admitted(request)
        except ProofError as exc:
            return _scrape_refusal(request, 401, str(exc), exc.reason, credentials, count)
        except PermissionDenied as exc:
            return _scrape_refusal(request, 403, str(exc), exc.reason, credentials, count)
        if not proved and request.path == "/metrics":
            why = f"/metrics needs the credentials this server's metrics_auth sets: send {what}"
            return _scrape_refusal(request, 401, why, "metrics_auth", credentials, count)
        request[_DETAIL] = proved
        return await handler(request)

    return guard


def _scrape_refusal(
    request: web.Request,
    status: int,
    why: str,
    reason: str,
    credentials: ScrapeCredentials,
    count: Callable[[str], None],
) -> web.Response:
    count(reason)
    log.warning("refused HTTP %s %s from %s: %s", request.method, request.path,
                request.remote, why)  # fmt: skip
    response = _refusal(status, why)
    if status == 401:
        response.headers["WWW-Authenticate"] = credentials.challenge
    return response


def _is_loopback(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:  # a Unix socket's peer, say: not a network client
        return False


class HttpAuth:
    """The middleware and the ``/login`` handlers: requests signed for this server
    (``signed``, which holds the users' :class:`AclSource`) and people's sessions."""

    def __init__(
        self,
        signed: SignedRequests,
        count: Callable[[str], None] | None = None,
        stylesheet: str = "",
        viewable: tuple[str, ...] = (),
    ) -> None:
        """``stylesheet``: the path of the stylesheet its pages use (the console's), open
        to everyone as the login page is. ``viewable``: the paths a logged-in user holding
        ``view cluster`` may GET, without changing anything (the console's); one ending in
        ``/`` (but ``/`` itself) stands for every path under it."""
        if signed.source is None:
            raise ValueError("HttpAuth needs users: SignedRequests with an AclSource")
        self._source: AclSource = signed.source
        self._signed = signed
        self._count = count or (lambda _reason: None)
        # token -> (access key, expiry, monotonic)
        self._sessions: dict[str, tuple[str, float]] = {}
        self._guard = LoginGuard()
        self._stylesheet = stylesheet
        self._viewable = viewable
        self._open = OPEN_PATHS | {"/logout"} | ({stylesheet} if stylesheet else set())

    inline_script_hashes: Final = (_LOGIN_SCRIPT_SHA256,)
    """The inline scripts of the pages served here, for the pages' Content-Security-Policy."""

    def routes(self) -> list[web.RouteDef]:
        @takes_forms  # the logout button of a page: a form of this site
        async def logout(request: web.Request) -> web.StreamResponse:
            return self._logout(request)

        return [
            web.get("/login", self._login_page),
            web.post("/login", self._login),
            web.post("/logout", logout),
        ]

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in self._open:
            return await handler(request)
        try:
            if not await self._signed.admitted(request):
                user = self._session_user(request)
                request[LOGGED_IN] = user.access_key
                request[MAY_CHANGE] = user.is_admin
                if not (user.is_viewer and self._only_views(request)):
                    acl.check(user, "admin", "cluster", "")
        except ProofError as exc:
            if self._wants_page(request, exc):
                # A person at a browser: the login page, and back here afterwards.
                raise web.HTTPSeeOther(f"/login?next={quote(request.path_qs, safe='')}") from None
            return self._refuse(request, 401, str(exc), exc.reason)
        except PermissionDenied as exc:
            refused = self._refuse(request, 403, str(exc), exc.reason)
            who = request.get(LOGGED_IN)
            if who and request.method == "GET" and self._accepts_html(request):
                return self._forbidden_page(who, str(exc))
            return refused
        return await handler(request)

    def _only_views(self, request: web.Request) -> bool:
        path = request.path
        return request.method in ("GET", "HEAD") and any(
            path == v or (v != "/" and v.endswith("/") and path.startswith(v))
            for v in self._viewable
        )

    def _forbidden_page(self, access_key: str, why: str) -> web.Response:
        """What a logged-in user without ``admin cluster`` sees instead of a page: who
        they are, what they lack, what their grants let them do, and a way out."""
        user = self._source.acl.user(access_key)
        grants = sorted(f"{g.permission} {g.resource}" for g in (user.grants if user else ()))
        listed = "".join(f"<li><code>{html.escape(g)}</code></li>" for g in grants)
        body = (
            f'<div class="error" role="alert">{html.escape(why)}</div>'
            f"<p>You are logged in as <strong>{html.escape(access_key)}</strong>. The "
            "console and this server's admin API are for users holding "
            "<code>admin cluster</code> (the console's pages, read-only, also for "
            "<code>view cluster</code>).</p>"
            + (
                f"<p>Your grants, for metaq clients (producers, consumers) and the metaq CLI's "
                f"calls that they cover:</p><ul>{listed}</ul>"
                if listed
                else "<p>You hold no grants: ask an administrator for the ones you need.</p>"
            )
            + "<p>Ask an administrator to grant you <code>admin cluster</code>, or log out "
            "and log in as a user who holds it.</p>" + _LOGOUT_FORM
        )
        return _page("Not allowed", body, self._stylesheet, status=403)

    @staticmethod
    def _accepts_html(request: web.Request) -> bool:
        return HEADER not in request.headers and "text/html" in request.headers.get("Accept", "")

    @staticmethod
    def _wants_page(request: web.Request, refusal: ProofError) -> bool:
        return (
            refusal.reason == "unauthenticated"
            and request.method == "GET"
            and HttpAuth._accepts_html(request)
        )

    def _session_user(self, request: web.Request) -> User:
        token = request.cookies.get(COOKIE)
        session = self._sessions.get(token) if token else None
        if session is None or session[1] < time.monotonic():
            raise ProofError(
                f"{request.method} {request.path} needs a user with admin on the cluster: "
                "log in at /login, or sign the request (X-Metaq-User header; the metaq CLI "
                "does it with credentials)",
                "unauthenticated",
            )
        if request.method not in _SAFE_METHODS and not same_site(request):
            raise PermissionDenied(
                f"a {request.method} from another site's page is refused (CSRF): make "
                "changes from this site's own pages",
                "csrf",
            )
        user = self._source.acl.user(session[0])
        if user is None:
            raise ProofError(f"user {session[0]} was removed; log in again", "unauthenticated")
        return user

    def _refuse(self, request: web.Request, status: int, why: str, reason: str) -> web.Response:
        self._count(reason)
        log.warning("refused HTTP %s %s from %s: %s", request.method, request.path,
                    request.remote, why)  # fmt: skip
        return _refusal(status, why)

    # --- /login -------------------------------------------------------------------------

    async def _login_page(self, _request: web.Request) -> web.Response:
        return _page("metaq login", _LOGIN_FORM, self._stylesheet, script=_LOGIN_SCRIPT)

    def _logout(self, request: web.Request) -> web.Response:
        token = request.cookies.get(COOKIE)
        session = self._sessions.pop(token, None) if token else None
        if session is not None:
            log.info("user %s logged out over HTTP from %s", session[0], request.remote)
        response = web.Response(status=303, headers={"Location": "/login"})
        response.del_cookie(COOKIE, path="/")
        return response

    async def _login(self, request: web.Request) -> web.Response:
        body = await json_object(request)
        access_key, secret = body.get("access_key"), body.get("secret_key")
        if not isinstance(access_key, str) or not isinstance(secret, str):
            return _refusal(400, 'send {"access_key": "...", "secret_key": "..."} as JSON')
        address = request.remote or ""
        wait_s = self._guard.wait_s(access_key, address, time.monotonic())
        if wait_s > 0:
            self._count("throttled")
            log.warning("refused a login of %s from %s: too many failures", shown(access_key),
                        address)  # fmt: skip
            response = _refusal(
                429,
                f"too many failed logins for this user or from this address: try again in "
                f"{math.ceil(wait_s)} s",
            )
            response.headers["Retry-After"] = str(math.ceil(wait_s))
            return response
        user = self._source.acl.user(access_key)
        # An unknown user is checked against a verifier no secret matches, in the same
        # time as a known one, so the answer's timing does not say which users exist; off
        # the event loop, since the key derivation is slow on purpose.
        verifier = user.verifier if user is not None else _NOBODY
        proved = await asyncio.to_thread(_proves, access_key, secret, verifier)
        if not proved or user is None:
            self._guard.failed(access_key, address, time.monotonic())
            return self._refuse(request, 401, "unknown user or wrong secret key", "unauthenticated")
        self._guard.succeeded(access_key, address)
        now = time.monotonic()
        if len(self._sessions) >= MAX_SESSIONS:
            self._sessions = {t: s for t, s in self._sessions.items() if s[1] > now}
            while len(self._sessions) >= MAX_SESSIONS:
                self._sessions.pop(next(iter(self._sessions)))
        token = secrets.token_urlsafe(32)
        self._sessions[token] = (access_key, now + SESSION_TTL_S)
        log.info("user %s logged in over HTTP from %s", access_key, request.remote)
        response = web.json_response({"user": access_key, "expires_in_s": SESSION_TTL_S})
        response.set_cookie(
            COOKIE, token, max_age=int(SESSION_TTL_S), httponly=True, samesite="Strict",
            path="/", secure=request.secure,  # a TLS listener's cookie never goes out plain
        )  # fmt: skip
        return response
