"""Repeated: a recurring condition logged on entry, once an interval, and on exit."""

from __future__ import annotations

import logging

import pytest

from metaq.common.log_limit import Repeated


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_condition_recurring_every_tick_is_logged_once_a_minute_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    repeated = Repeated(logging.getLogger("t"), "journaling failed", clock=clock)
    with caplog.at_level(logging.INFO, "t"):
        for _ in range(480):  # eight a second for a minute
            repeated.happened("disk full")
            clock.now += 0.125
        repeated.happened("disk full")
        repeated.ended()
        repeated.ended()

    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "journaling failed: disk full"
    assert lines[1].startswith("journaling failed, 480 more times in the last 60 s")
    assert lines[2].startswith("journaling failed no longer: it lasted 60.")
    assert len(lines) == 3 and repeated.total == 481 and not repeated.active


def test_after_it_ended_the_next_occurrence_is_logged_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    repeated = Repeated(logging.getLogger("t"), "x failed", clock=clock)
    with caplog.at_level(logging.WARNING, "t"):
        repeated.happened("first")
        repeated.ended()
        clock.now += 1
        repeated.happened("second")
    assert [r.getMessage() for r in caplog.records] == ["x failed: first", "x failed: second"]
