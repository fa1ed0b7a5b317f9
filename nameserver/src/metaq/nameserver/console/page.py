"""The console's page frame, its stylesheet and script, and small HTML helpers.

Everything is escaped on the way in (:func:`esc`); a page is a title, a body of HTML and
the navigation. Elements with ``data-live`` are refetched every few seconds by the script
(the whole page is fetched and that element swapped), except while the keyboard focus is
inside one, so nobody loses their place.
"""

from __future__ import annotations

import datetime
import html
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from typing import Any, Final

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from metaq.common.http_auth import LOGGED_IN, MAY_CHANGE

REFRESH_MS: Final = 5000
STYLESHEET: Final = "/console/static/console.css"
# Who the page being rendered is for: set around each console request by
# :func:`middleware`, so every page's header names them without each page passing it on.
_user: ContextVar[str] = ContextVar("console_user", default="")
# Whether it is for someone who may change things: a view cluster user's pages leave out
# their forms (the server refuses the changes anyway).
_may_change: ContextVar[bool] = ContextVar("console_may_change", default=True)
_NAV: Final = (
    ("/console/overview", "Overview"),
    ("/console/cluster", "Cluster"),
    ("/console/config", "Broker settings"),
    ("/console/topics", "Topics"),
    ("/console/groups", "Consumer groups"),
    ("/console/producers", "Producers"),
    ("/console/messages", "Messages"),
    ("/console/scheduled", "Delayed"),
    ("/console/users", "Users"),
)

CSS: Final = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 0; color: #1b1f24; }
header { background: #1f3a5f; color: #fff; padding: .5rem 1rem; display: flex; gap: 1.5rem;
  align-items: center; }
header a { color: #fff; }
header a[aria-current=page] { font-weight: bold; text-decoration-thickness: 3px; }
main { padding: 1rem; max-width: 80rem; }
table { border-collapse: collapse; margin: .5rem 0 1rem; }
th, td { border: 1px solid #c8ced6; padding: .25rem .5rem; text-align: left;
  vertical-align: top; }
th { background: #eef2f6; }
.error { background: #fdecea; border: 1px solid #d93025; padding: .5rem; margin: .5rem 0; }
.notice { background: #e6f4ea; border: 1px solid #188038; padding: .5rem; margin: .5rem 0; }
.muted { color: #5f6b7a; }
pre { background: #f6f8fa; padding: .5rem; overflow: auto; max-width: 70rem; }
form.inline { display: inline; }
.whoami { margin-left: auto; }
.whoami button { margin-left: .5rem; }
td.num, th.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
.scroll { overflow-x: auto; max-width: 100%; }
.status { display: inline-block; border-radius: .6rem; padding: 0 .5rem; font-weight: 600;
  white-space: nowrap; }
.status.ok { background: #e6f4ea; color: #0d652d; border: 1px solid #188038; }
.status.warn { background: #fef7e0; color: #8a4b00; border: 1px solid #f9ab00; }
.status.down { background: #fdecea; color: #a50e0e; border: 1px solid #d93025; }
svg.spark { vertical-align: middle; }
.kind { font-size: .8em; border-radius: .4rem; padding: 0 .35rem; margin-left: .25rem;
  background: #eef2f6; color: #3c4858; border: 1px solid #c8ced6; white-space: nowrap; }
.kind.dlq { background: #fdecea; color: #a50e0e; border-color: #d93025; }
.kind.retry { background: #fef7e0; color: #8a4b00; border-color: #f9ab00; }
th a { color: inherit; }
form.filter { margin: .5rem 0; display: flex; flex-wrap: wrap; gap: .25rem .5rem;
  align-items: center; }
svg.spark polyline { fill: none; stroke: #1f3a5f; stroke-width: 1.5; }
@media (max-width: 40rem) {
  body { font-size: 14px; }
  header { flex-wrap: wrap; gap: .5rem 1rem; }
  main { padding: .5rem; }
  th, td { padding: .2rem .35rem; white-space: nowrap; }
}
fieldset { margin: .5rem 0 1rem; border: 1px solid #c8ced6; }
label { margin-right: .5rem; }
a:focus-visible, button:focus-visible, input:focus-visible, select:focus-visible,
textarea:focus-visible { outline: 3px solid #f9ab00; outline-offset: 2px; }
"""

SCRIPT: Final = """
(function () {
  const live = document.querySelectorAll('[data-live]');
  if (!live.length) return;
  async function refresh() {
    for (const el of live) {
      if (el.contains(document.activeElement)) return;
    }
    try {
      const answer = await fetch(location.href, {headers: {'X-Console-Refresh': '1'}});
      if (!answer.ok) return;
      const page = new DOMParser().parseFromString(await answer.text(), 'text/html');
      for (const el of live) {
        const fresh = page.getElementById(el.id);
        if (fresh) el.innerHTML = fresh.innerHTML;
      }
    } catch (e) { /* the next tick tries again */ }
  }
  setInterval(refresh, Number(document.body.dataset.refreshMs || 5000));
})();
"""


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def static_routes() -> list[web.RouteDef]:
    async def css(_request: web.Request) -> web.Response:
        return web.Response(text=CSS, content_type="text/css")

    async def script(_request: web.Request) -> web.Response:
        return web.Response(text=SCRIPT, content_type="text/javascript")

    return [
        web.get(STYLESHEET, css),
        web.get("/console/static/console.js", script),
    ]


def render(title: str, body: str, *, current: str = "", status: int = 200) -> web.Response:
    nav = " ".join(
        f'<a href="{href}"{" aria-current=page" if href == current else ""}>{esc(label)}</a>'
        for href, label in _NAV
    )
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)} · metaq console</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{STYLESHEET}">
</head><body data-refresh-ms="{REFRESH_MS}">
<header><strong>metaq</strong><nav aria-label="Console">{nav}</nav>{_whoami()}</header>
<main><h1>{esc(title)}</h1>
{body}
</main>
<script src="/console/static/console.js"></script>
</body></html>"""
    return web.Response(text=page, content_type="text/html", status=status)


def may_change() -> bool:
    """Whether the page being rendered is for someone who may change things."""
    return _may_change.get()


def changes(form: str) -> str:
    """``form`` (markup that changes something), left out of a read-only user's page."""
    return form if may_change() else ""


def _whoami() -> str:
    user = _user.get()
    if not user:
        return ""
    role = "" if may_change() else " (read-only)"
    return (
        f'<span class="whoami">logged in as <strong>{esc(user)}</strong>{esc(role)} '
        '<form class="inline" method="post" action="/logout">'
        '<button type="submit">Log out</button></form></span>'
    )


def middleware() -> Middleware:
    """Around every console request: the logged-in user for the page header, and a page
    not found answered in the console's layout, saying so, rather than aiohttp's bare 404."""

    @web.middleware
    async def console_pages(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/console"):
            return await handler(request)
        token = _user.set(request.get(LOGGED_IN, ""))
        may = _may_change.set(request.get(MAY_CHANGE, True))
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return not_found(
                f"There is no console page at {request.path}: pick a page from the "
                "navigation above."
            )
        finally:
            _may_change.reset(may)
            _user.reset(token)

    return console_pages


def not_found(message: str, body: str = "") -> web.Response:
    """The layout's 404 page: what was not found and what to do instead."""
    return render("Not found", errors([message]) + body, status=404)


def errors(messages: Iterable[str]) -> str:
    """A list of what could not be gathered, in plain words."""
    items = "".join(f"<li>{esc(m)}</li>" for m in messages if m)
    return f'<div class="error" role="alert"><ul>{items}</ul></div>' if items else ""


def notice(message: str) -> str:
    return f'<div class="notice" role="status">{esc(message)}</div>' if message else ""


def table(headers: Sequence[str | Html], rows: Iterable[Sequence[Any]], caption: str = "") -> str:
    """Cells are escaped unless they are :class:`Html`; numbers (and :class:`Num`) are
    right-aligned. The table scrolls sideways inside its box when it is wider than the
    screen, rather than widening the page."""
    head = "".join(f'<th scope="col">{cell(h)}</th>' for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td{_align(c)}>{cell(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    if not body:
        body = f'<tr><td colspan="{len(headers)}" class="muted">none</td></tr>'
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return (
        f'<div class="scroll"><table>{cap}<thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


class Html(str):
    """Markup already built (escaped where it had to be)."""


class Num(str):
    """A figure written with its unit (``12.5 msg/s``), right-aligned like a number."""


def _align(value: object) -> str:
    numeric = isinstance(value, int | float | Num) and not isinstance(value, bool)
    return ' class="num"' if numeric else ""


def cell(value: object) -> str:
    if isinstance(value, Html):
        return str(value)
    if value is None:
        return "—"
    return esc(value)


def link(href: str, text: object) -> Html:
    return Html(f'<a href="{esc(href)}">{esc(text)}</a>')


def field(
    name: str, label: str, value: object = "", *, kind: str = "text", form: str = "", **attrs: str
) -> str:
    """A labelled input; ``form`` keeps ids unique when several forms ask for one name."""
    extra = "".join(f' {k.replace("_", "-")}="{esc(v)}"' for k, v in attrs.items())
    ident = f"f-{form}{name}"
    return (
        f'<label for="{esc(ident)}">{esc(label)}</label>'
        f'<input id="{esc(ident)}" name="{esc(name)}" type="{kind}" value="{esc(value)}"{extra}> '
    )


def ratio(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


def when(ms: int | None) -> str:
    """A stored timestamp for people: UTC to the second."""
    if ms is None:
        return "—"
    stamp = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return stamp.strftime("%Y-%m-%d %H:%M:%S UTC")


def parse_time_ms(text: str) -> int:
    """What people type for a time: ISO 8601 (UTC when it names no zone) or milliseconds
    since the epoch. ValueError for anything else."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    stamp = datetime.datetime.fromisoformat(text)
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.UTC)
    return int(stamp.timestamp() * 1000)
