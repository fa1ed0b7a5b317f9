"""Filters Spark pushes into a batch read, turned into what the brokers can do instead.

- ``tags = 'x'`` / ``tags IN (...)``: the broker's tag filter (its consume queue holds tag
  hashes, so unwanted messages are never read from the commitlog nor sent);
- ``store_timestamp >=, >, <=, <, =``: the offset range, narrowed with the broker's
  offset-by-time lookup, and each row's store time checked as its header is read (the
  lookup finds the range only to the millisecond a queue's store times rise by);
- ``topic``, ``broker``, ``queue`` ``=`` / ``IN``: whole queues pruned;
- ``IS NOT NULL`` on any column: true of every row (no column of the source is null).

All of them are exact, so Spark takes none back to check again, and lists every one
under ``PushedFilters`` in ``explain("formatted")``: what a plan shows of the push-down,
since a Python source cannot describe its scan otherwise (docs/spark.md).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)

from metaq.client.tags import TagFilter
from metaq.spark.schema import COLUMNS


@dataclass(frozen=True)
class Pushed:
    """What the pushed filters allow; None means "no restriction"."""

    tags: frozenset[str] | None = None
    topics: frozenset[str] | None = None
    brokers: frozenset[str] | None = None
    queues: frozenset[int] | None = None
    from_ms: int | None = None
    """Smallest store timestamp wanted (inclusive)."""
    until_ms: int | None = None
    """First store timestamp no longer wanted (exclusive)."""

    def tag_expression(self, option_tags: str) -> str | None:
        """The tag filter to send: the option's, narrowed by pushed tags; None when the
        two exclude each other (nothing can match)."""
        wanted = TagFilter.parse(option_tags).tags
        if self.tags is None:
            return option_tags
        chosen = self.tags if wanted is None else self.tags & wanted
        return TagFilter.parse(sorted(chosen)).expression if chosen else None

    def allows_queue(self, topic: str, broker: str, queue_id: int) -> bool:
        return (
            (self.topics is None or topic in self.topics)
            and (self.brokers is None or broker in self.brokers)
            and (self.queues is None or queue_id in self.queues)
        )


def push(filters: Iterable[Filter], pushed: Pushed) -> tuple[Pushed, list[Filter]]:
    """Take the filters the brokers can apply; return the new state and the filters Spark
    must still evaluate (each one of the input objects, as Spark requires)."""
    rest: list[Filter] = []
    for f in filters:
        taken = _take(f, pushed)
        if taken is None:
            rest.append(f)
        else:
            pushed = taken
    return pushed, rest


def _take(f: Filter, p: Pushed) -> Pushed | None:
    column: tuple[str, ...] = tuple(getattr(f, "attribute", ()))
    if len(column) != 1:
        return None
    name = column[0].lower()  # as a user schema spells it; Spark's names are case-blind
    if isinstance(f, IsNotNull) and name in COLUMNS:
        return p
    if name in ("tags", "topic", "broker", "queue") and isinstance(f, EqualTo | In):
        values = (f.value,) if isinstance(f, EqualTo) else tuple(f.value)
        if name == "queue":
            if not all(isinstance(v, int) for v in values):
                return None
            return replace(p, queues=_meet(p.queues, frozenset(values)))
        if not all(isinstance(v, str) for v in values):
            return None
        wanted = frozenset(values)
        if name == "tags":
            return replace(p, tags=_meet(p.tags, wanted))
        if name == "topic":
            return replace(p, topics=_meet(p.topics, wanted))
        return replace(p, brokers=_meet(p.brokers, wanted))
    if name == "store_timestamp":
        value = getattr(f, "value", None)
        if not isinstance(value, dt.datetime):
            return None
        us = _epoch_us(value)
        if isinstance(f, GreaterThanOrEqual):
            return _from(p, -(-us // 1000))
        if isinstance(f, GreaterThan):
            return _from(p, us // 1000 + 1 if us % 1000 == 0 else -(-us // 1000))
        if isinstance(f, LessThanOrEqual):
            return _until(p, us // 1000 + 1)
        if isinstance(f, LessThan):
            return _until(p, -(-us // 1000))
        if isinstance(f, EqualTo):
            return _until(_from(p, -(-us // 1000)), us // 1000 + 1)
    return None


def _meet(old: frozenset[Any] | None, new: frozenset[Any]) -> frozenset[Any]:
    return new if old is None else old & new


def _from(p: Pushed, ms: int) -> Pushed:
    return replace(p, from_ms=ms if p.from_ms is None else max(p.from_ms, ms))


def _until(p: Pushed, ms: int) -> Pushed:
    return replace(p, until_ms=ms if p.until_ms is None else min(p.until_ms, ms))


def _epoch_us(value: dt.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    delta = value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
