"""What the brokers' and nameservers' HTTP endpoints share: how they take JSON.

- Every request that changes something (any method but GET, HEAD, OPTIONS) must say
  ``Content-Type: application/json``, else 415. A web page can make a browser send a
  cross-site POST without asking first only with a form's content types (a CORS "simple
  request"); insisting on JSON makes the browser ask first (a preflight), and no metaq
  endpoint answers a preflight or sends any ``Access-Control-Allow-*`` header, so such
  a page cannot reach the admin API through its visitors' browsers.
- Bodies are at most :data:`MAX_BODY_BYTES` (413 beyond) and must be a JSON object;
  malformed, non-UTF-8 or too deeply nested JSON gets 400 saying which, never a 500.
- Errors are JSON ``{"error": "..."}`` like every other answer of the admin APIs.
- A handler made with :func:`takes_forms` (the web console's buttons) takes an HTML form
  instead, but only from a page of the same site: a browser says where a request comes
  from (``Sec-Fetch-Site``, ``Origin``), and a form posted from anywhere else gets 403.
  :func:`same_site` is the one rule: the auth middleware (``metaq.common.http_auth``)
  holds every change made on a login session to it too.
- Every HTML page (the console, the login page) goes with headers that keep it out of
  other sites' frames (clickjacking), run only this server's own scripts and styles,
  send no referrer, and forbid content sniffing (:func:`_page_headers`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from metaq.common.names import shown

if TYPE_CHECKING:
    from metaq.common.http_auth import HttpAuth

MAX_BODY_BYTES: Final = 64 * 1024
"""Admin bodies are a few small fields; nothing legitimate comes near this."""
JSON_TYPE: Final = "application/json"
_SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
_JSON_KINDS: Final[dict[type, str]] = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def application(auth: HttpAuth | None = None) -> web.Application:
    """An aiohttp application with the body limit, the JSON-only rule for changes and
    the pages' security headers; with ``auth``, every route but /health, /metrics and
    /login, including those added later, needs a user (``metaq.common.http_auth``)."""
    if auth is None:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_require_json])
        app.on_response_prepare.append(_page_headers(()))
        return app
    app = web.Application(
        client_max_size=MAX_BODY_BYTES, middlewares=[auth.middleware, _require_json]
    )
    app.add_routes(auth.routes())
    app.on_response_prepare.append(_page_headers(auth.inline_script_hashes))
    return app


def _page_headers(
    script_hashes: Sequence[str],
) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """The response hook that adds the security headers; ``script_hashes`` (base64
    SHA-256) allow the inline scripts of pages served here (the login page)."""
    scripts = " ".join(["'self'", *(f"'sha256-{h}'" for h in script_hashes)])
    policy = (
        "default-src 'none'; "
        f"script-src {scripts}; "
        "style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )

    async def add(_request: web.Request, response: web.StreamResponse) -> None:
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        if response.content_type == "text/html":
            response.headers["Content-Security-Policy"] = policy
            response.headers["X-Frame-Options"] = "DENY"
            response.headers["Referrer-Policy"] = "no-referrer"

    return add


def json_for(method: str, body: Any) -> Any:
    """What a client passes as aiohttp's ``json=``: a change is sent as JSON even when it
    carries nothing, since the admin APIs refuse any other content type for it."""
    return {} if body is None and method not in _SAFE_METHODS else body


def _error_response(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


_FORMS_ATTRIBUTE: Final = "_metaq_takes_forms"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def takes_forms(handler: Handler) -> Handler:
    """Mark a handler that takes HTML form posts (see the module docstring)."""
    setattr(handler, _FORMS_ATTRIBUTE, True)
    return handler


def same_site(request: web.Request) -> bool:
    """Whether the browser says the request comes from a page of this site. Browsers
    send ``Sec-Fetch-Site``; older ones only ``Origin``; a request with neither is not
    from a browser page at all (curl, a script), which a cross-site page cannot make."""
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if fetch_site is not None:
        return fetch_site in ("same-origin", "none")
    origin = request.headers.get("Origin")
    if origin is None or origin == "null":
        return origin is None
    return origin.partition("://")[2] == request.host


@web.middleware
async def _require_json(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    if request.method in _SAFE_METHODS:
        return await handler(request)
    # The route's own handler: ``handler`` may be another middleware wrapping it.
    if getattr(request.match_info.handler, _FORMS_ATTRIBUTE, False):
        if not same_site(request):
            return _error_response(
                403,
                f"{request.method} {shown(request.path)} is taken only from this site's own "
                "pages; open the console here and use its form",
            )
        return await handler(request)
    if request.content_type != JSON_TYPE:
        sent = request.headers.get("Content-Type")
        return _error_response(
            415,
            f"{request.method} {shown(request.path)} takes a JSON body: send it with "
            f"Content-Type: {JSON_TYPE} (this request had "
            f"{shown(sent) if sent else 'no Content-Type'})",
        )
    return await handler(request)


async def json_object(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, ``{}`` when there is none.

    Raises an HTTP error carrying a JSON ``{"error": ...}`` body (aiohttp answers with
    it): 413 when the body exceeds :data:`MAX_BODY_BYTES`, 400 when it is not UTF-8, not
    JSON, nested too deeply to parse, or not an object.
    """
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise web.HTTPRequestEntityTooLarge(
            MAX_BODY_BYTES,
            request.content_length or 0,
            text=_error(
                f"the body is larger than {MAX_BODY_BYTES} bytes, the limit for admin "
                "requests; send only the documented fields"
            ),
            content_type=JSON_TYPE,
        ) from None
    if not raw:
        return {}
    try:
        body = json.loads(raw.decode())
    except UnicodeDecodeError as exc:
        raise _bad_request(f"the body is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise _bad_request(f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise _bad_request("the body's JSON is nested too deeply to parse") from None
    if not isinstance(body, dict):
        kind = _JSON_KINDS.get(type(body), type(body).__name__)
        raise _bad_request(f"the body must be a JSON object, not {kind}")
    return body


def _error(message: str) -> str:
    return json.dumps({"error": message})


def _bad_request(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=_error(message), content_type=JSON_TYPE)
