"""The tests' deadline scale: one setting stretches every wall-clock bound and wait."""

from __future__ import annotations

import re
import time

import pytest

from metaq.testing.waiting import DEADLINE_SCALE_ENV, Pace, deadline, hold, wait_until


def test_a_deadline_is_as_given_when_the_scale_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEADLINE_SCALE_ENV, raising=False)

    assert deadline(2.5) == 2.5


def test_a_deadline_is_multiplied_by_the_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEADLINE_SCALE_ENV, "3")

    assert deadline(2.5) == 7.5


@pytest.mark.parametrize("raw", ["fast", "0", "-1"])
def test_a_scale_that_is_not_a_positive_number_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(DEADLINE_SCALE_ENV, raw)

    with pytest.raises(ValueError, match=DEADLINE_SCALE_ENV):
        deadline(1.0)


def test_a_wait_gives_up_at_its_scaled_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEADLINE_SCALE_ENV, "2")

    with pytest.raises(
        AssertionError, match=re.escape("timed out after 0.02 s waiting until never")
    ):
        wait_until(lambda: False, 0.01, "never")


def test_a_wait_gives_up_at_once_when_what_it_waits_on_has_failed() -> None:
    polls = []

    def never() -> bool:
        polls.append(1)
        return False

    with pytest.raises(AssertionError, match="gave up waiting until rows arrive: query died"):
        wait_until(never, 60.0, "rows arrive", failed=lambda: "query died" if polls else None)
    assert len(polls) == 1


def test_a_hold_is_not_stretched_by_the_deadline_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEADLINE_SCALE_ENV, "50")
    started = time.monotonic()
    hold(0.05)
    hold(-1.0)  # a moment already past: no hold at all
    assert 0.05 <= time.monotonic() - started < 1.0


def test_a_pace_keeps_its_slots_when_a_step_runs_late() -> None:
    pace = Pace(2.0)  # a slot every 0.5 s
    started = time.monotonic()
    hold(1.2)  # a slow step: the slots at 0.5 and 1 s have passed
    pace.wait()
    pace.wait()
    # Slots shifted by the late step would put the second at 1.7 s.
    assert time.monotonic() - started < 1.5, "slots behind the loop are not waited for"
    pace.wait()  # the slot at 1.5 s
    assert time.monotonic() - started >= 1.5
    with pytest.raises(ValueError, match="above 0"):
        Pace(0)
