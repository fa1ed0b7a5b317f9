"""Sorting and filtering a console table on the server, from the page's query: ``sort``
(a column's key), ``order`` (``asc`` or ``desc``), ``q`` (text the row's name must hold)
and, for topics, ``kind``. Column headings are links that sort by them (again: the other
way), so it works without a script and a sorted view is a link to share."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar
from urllib.parse import urlencode

from metaq.nameserver.console.page import Html, esc

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TableQuery:
    sort: str
    descending: bool
    text: str
    kind: str = ""

    @classmethod
    def of(cls, query: Mapping[str, str], keys: Sequence[str], default: str) -> TableQuery:
        """The query's choices; a ``sort`` key not among ``keys`` falls back to
        ``default``, ascending."""
        sort = query.get("sort", default)
        if sort not in keys:
            sort = default
        return cls(sort, query.get("order") == "desc", query.get("q", "").strip(),
                   query.get("kind", ""))  # fmt: skip

    def href(self, path: str, **changed: Any) -> str:
        chosen = replace(self, **changed)
        params = {"sort": chosen.sort, "order": "desc" if chosen.descending else "asc"}
        params |= {k: v for k, v in (("q", chosen.text), ("kind", chosen.kind)) if v}
        return f"{path}?{urlencode(params)}"

    def heading(self, path: str, key: str, label: str) -> Html:
        """A column heading that sorts by ``key`` (the other way when it already does)."""
        current = key == self.sort
        descending = not self.descending if current else False
        arrow = (" ▼" if self.descending else " ▲") if current else ""
        return Html(
            f'<a href="{esc(self.href(path, sort=key, descending=descending))}">'
            f"{esc(label)}{arrow}</a>"
        )

    def rows(self, rows: list[T], name: Callable[[T], str], value: Callable[[T], Any]) -> list[T]:
        """``rows`` whose name holds the filter text, sorted by ``value`` (unknown values,
        None, last whichever the order)."""
        wanted = self.text.lower()
        kept = [r for r in rows if wanted in name(r).lower()]
        known = [r for r in kept if value(r) is not None]
        unknown = [r for r in kept if value(r) is None]
        known.sort(key=lambda r: (value(r), name(r)), reverse=self.descending)
        return known + unknown

    def filter_form(self, path: str, label: str, extra: str = "") -> str:
        """A GET form for the filter text (and ``extra`` fields), keeping the sort."""
        return (
            f'<form method="get" action="{esc(path)}" class="filter" role="search">'
            f'<input type="hidden" name="sort" value="{esc(self.sort)}">'
            f'<input type="hidden" name="order" value="{"desc" if self.descending else "asc"}">'
            f'<label for="f-q">{esc(label)}</label>'
            f'<input id="f-q" name="q" type="search" value="{esc(self.text)}"> {extra}'
            '<button type="submit">Filter</button></form>'
        )
