"""The data plane's resource limits as pure logic (the descriptor budget shared by the
store and the connections, the broker-wide budget of incomplete request frames) and the
CPU priority a broker takes."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from metaq.broker.limits import (
    STALL_WINDOWS,
    DescriptorBudget,
    RequestBudget,
    open_fds,
    too_slow,
)

MIB = 1024 * 1024


class Peer:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    def granted(self) -> None:
        self.log.append(self.name)


def test_connections_get_what_the_broker_files_and_the_reserve_leave() -> None:
    account = DescriptorBudget(nofile=0, fd_reserve=1024)
    account.recount_now(connections=0)
    held = account.held
    assert held >= 3  # stdin, stdout, stderr at least
    assert account.nofile == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert account.connection_slots() == account.nofile - held - 1024
    # Connections open at the count are theirs, not the broker's.
    account.recount_now(connections=2)
    assert account.held == max(held - 2, 0)


def test_open_fds_counts_this_process() -> None:
    count = open_fds()
    assert count is not None and count >= 3


def test_a_frame_that_does_not_fit_waits_and_is_granted_when_room_frees() -> None:
    log: list[str] = []
    budget = RequestBudget(64 * MIB)
    a, b = Peer("a", log), Peer("b", log)

    assert budget.reserve(a, 63 * MIB)
    assert not budget.reserve(b, 63 * MIB)
    assert (budget.used, budget.waiting) == (63 * MIB, 1)

    budget.release(63 * MIB)

    assert log == ["b"]
    assert (budget.used, budget.waiting) == (63 * MIB, 0)


def test_small_frames_pass_a_large_one_that_waits() -> None:
    log: list[str] = []
    budget = RequestBudget(64 * MIB)
    stalled, large, small = Peer("stalled", log), Peer("large", log), Peer("small", log)
    assert budget.reserve(stalled, 60 * MIB)
    assert not budget.reserve(large, 10 * MIB)

    assert budget.reserve(small, 1 * MIB)
    assert budget.used == 61 * MIB


def test_waiters_are_served_in_arrival_order_as_far_as_room_allows() -> None:
    log: list[str] = []
    budget = RequestBudget(10 * MIB)
    holder = Peer("holder", log)
    first, second, third = Peer("first", log), Peer("second", log), Peer("third", log)
    assert budget.reserve(holder, 10 * MIB)
    for peer, size in ((first, 6), (second, 6), (third, 4)):
        assert not budget.reserve(peer, size * MIB)

    budget.release(10 * MIB)

    assert log == ["first", "third"]
    assert (budget.used, budget.waiting) == (10 * MIB, 1)


def test_a_waiter_that_left_is_never_granted() -> None:
    log: list[str] = []
    budget = RequestBudget(10 * MIB)
    holder, gone = Peer("holder", log), Peer("gone", log)
    assert budget.reserve(holder, 10 * MIB)
    assert not budget.reserve(gone, 5 * MIB)

    budget.forget(gone)
    budget.release(10 * MIB)

    assert log == []
    assert (budget.used, budget.waiting) == (0, 0)


def test_large_frames_leave_the_small_reserve_to_small_ones() -> None:
    log: list[str] = []
    budget = RequestBudget(10 * MIB, small_reserve_bytes=2 * MIB, small_max_bytes=MIB)
    stalled, large, small, medium = (Peer(n, log) for n in ("stalled", "large", "small", "medium"))
    assert budget.reserve(stalled, 8 * MIB)
    assert not budget.reserve(large, 2 * MIB)  # would eat into the reserve
    assert not budget.reserve(medium, MIB + 1)  # larger than a small frame: waits too

    assert budget.reserve(small, MIB)
    assert budget.reserve(small, MIB)
    assert budget.used == 10 * MIB
    assert not budget.reserve(small, 1)  # the reserve is full too

    budget.release(8 * MIB)

    assert log == ["large", "medium", "small"]


def test_while_others_wait_a_frame_is_too_slow_after_a_whole_window_below_the_rate() -> None:
    kib = 1024

    def slow(arrived: int, window_s: float, rate: int = 64 * kib) -> bool:
        return too_slow(arrived, window_s, rate, 5.0, wanted=True, stalled_s=0.0)

    # Nothing at all, but the window is not over yet.
    assert not slow(0, 4.9)
    assert slow(0, 5.0)
    assert slow(64 * kib * 5 - 1, 5.0)
    assert not slow(64 * kib * 5, 5.0)
    # A late sweep judges the longer window it saw.
    assert slow(64 * kib * 5, 6.0)
    # 0 turns the check off.
    assert not slow(0, 100.0, 0)


def test_while_nobody_waits_only_a_frame_stalled_for_four_windows_is_too_slow() -> None:
    def slow(arrived: int, window_s: float, stalled_s: float, rate: int = 64 * 1024) -> bool:
        return too_slow(arrived, window_s, rate, 5.0, wanted=False, stalled_s=stalled_s)

    # A sender descheduled for seconds, or steady far below the rate, holds memory
    # nobody asks for: it may go on.
    assert not slow(0, 5.0, 5.0)
    assert not slow(0, 19.0, 19.0)
    assert not slow(1, 100.0, 0.1)
    # One that sends nothing for four windows is gone.
    assert slow(0, 5.0, 20.5)
    assert slow(0, 20.5, 20.5)
    assert STALL_WINDOWS == 4
    assert not slow(0, 100.0, 100.0, 0)


_NICE_CHILD = """
import json, logging, os, sys, threading
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
from metaq.broker.limits import set_nice
if len(sys.argv) > 2:
    os.setuid(int(sys.argv[2]))  # and with root's user id, its capabilities
got = set_nice(int(sys.argv[1]))
seen = []
thread = threading.Thread(target=lambda: seen.append(os.getpriority(os.PRIO_PROCESS, 0)))
thread.start()
thread.join()
print(json.dumps({"got": got, "thread": seen[0]}))
"""


def _nice_child(nice: int, user: int | None = None) -> tuple[dict[str, int], str]:
    done = subprocess.run(
        [sys.executable, "-c", _NICE_CHILD, str(nice), *([] if user is None else [str(user)])],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    *logged, last = done.stdout.strip().splitlines()
    return json.loads(last), "\n".join(logged)


@pytest.mark.skipif(os.geteuid() != 0, reason="a higher CPU priority needs root")
def test_set_nice_raises_the_priority_for_the_threads_started_after() -> None:
    figures, logged = _nice_child(-3)
    assert figures == {"got": -3, "thread": -3}
    assert logged == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="the child gives up root to lose the right")
def test_set_nice_without_the_right_keeps_the_priority_and_says_how_to_get_it() -> None:
    started_at = os.nice(0)  # the suite may itself run under nice
    figures, logged = _nice_child(-3, user=65534)
    assert figures == {"got": started_at, "thread": started_at}
    assert f"running at nice {started_at}, not the configured -3" in logged
    assert "LimitNICE=-3" in logged
