"""ReadBudget: the turn each cold read gets under cold_read_bytes_per_s."""

from __future__ import annotations

import itertools

import pytest

from metaq.broker.cold_reads import BURST_S, MAX_WAIT_S, ReadBudget

MIB = 1024 * 1024


def test_reads_after_a_quiet_spell_go_at_once_up_to_the_burst() -> None:
    budget = ReadBudget(10 * MIB)
    # The burst's tenth of a second (1 MiB here) was earned while nothing was read: the
    # read after it starts now too, and the one after that waits for it to be through.
    assert budget.wait(MIB, now=100.0) == 0.0
    assert budget.wait(MIB, now=100.0) == 0.0
    assert budget.wait(MIB, now=100.0) == pytest.approx(0.1)
    assert budget.wait(MIB, now=100.0) == pytest.approx(0.2)


def test_reads_are_spaced_to_the_rate() -> None:
    budget = ReadBudget(MIB)
    now = 50.0
    waits = [budget.wait(MIB // 4, now) for _ in range(8)]
    # 2 MiB at 1 MiB/s: each quarter MiB a quarter second after the one before, less the
    # burst the first ones had.
    assert waits[0] == 0.0
    assert waits[-1] == pytest.approx(7 * 0.25 - BURST_S)
    assert all(b - a == pytest.approx(0.25) for a, b in itertools.pairwise(waits[1:]))


def test_a_read_later_than_its_turn_does_not_wait() -> None:
    budget = ReadBudget(MIB)
    budget.wait(MIB, now=0.0)
    assert budget.wait(MIB, now=5.0) == 0.0


def test_no_read_waits_longer_than_the_cap_however_many_queue() -> None:
    budget = ReadBudget(MIB)
    waits = [budget.wait(4 * MIB, now=0.0) for _ in range(10)]
    assert max(waits) == pytest.approx(MAX_WAIT_S)
    assert waits[1] == pytest.approx(MAX_WAIT_S)  # 3.9 s of bytes ahead of it, capped
