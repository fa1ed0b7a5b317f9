"""Tag expressions: which tags a subscription wants and the hash codes a pull carries."""

from __future__ import annotations

from metaq.client.tags import TagFilter
from metaq.common.record import tag_code


def test_tag_expressions_parse_to_tags_and_their_codes() -> None:
    every = TagFilter.parse("*")
    assert (every.tags, every.codes, every.expression) == (None, (), "*")
    assert TagFilter.parse(None).matches("anything")
    assert TagFilter.parse("").tags is None

    some = TagFilter.parse(" paid ||shipped|| paid")
    assert some.tags == frozenset({"paid", "shipped"})
    assert some.codes == (tag_code("paid"), tag_code("shipped"))
    assert some.expression == "paid || shipped"
    assert some.matches("paid") and not some.matches("created")
    assert TagFilter.parse(["a", "b"]).tags == frozenset({"a", "b"})
    assert TagFilter.parse("a || *").tags is None
