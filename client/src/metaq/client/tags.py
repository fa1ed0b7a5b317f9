"""Tag filters: which messages of a topic a subscription wants.

A subscription names tags as RocketMQ writes them, ``"a || b"`` (or a list), and ``"*"``,
``""`` or None for every message. The broker filters on 32-bit tag hash codes
(:func:`metaq.common.record.tag_code`) kept in its consume queue, so it never reads a
message body to filter; hashes collide, so the consumer checks each message's tag string
again and drops the ones the broker let through by accident.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from metaq.common.record import tag_code


@dataclass(frozen=True, slots=True)
class TagFilter:
    expression: str
    """As the broker shows it in admin views: ``"*"`` or ``"a || b"``."""
    tags: frozenset[str] | None
    """The wanted tags; None for every message."""
    codes: tuple[int, ...]
    """The tags' hash codes, sent in each pull (empty: no filtering)."""

    @classmethod
    def parse(cls, tags: str | Sequence[str] | None) -> TagFilter:
        """``None``, ``"*"`` or ``""`` → everything; ``"a || b"`` or ``["a", "b"]`` → those."""
        if tags is None:
            names: list[str] = []
        elif isinstance(tags, str):
            names = [t.strip() for t in tags.split("||")]
        else:
            names = [t.strip() for t in tags]
        wanted = frozenset(t for t in names if t)
        if not wanted or "*" in wanted:
            return cls("*", None, ())
        ordered = sorted(wanted)
        return cls(" || ".join(ordered), wanted, tuple(tag_code(t) for t in ordered))

    def matches(self, tags: str) -> bool:
        return self.tags is None or tags in self.tags
