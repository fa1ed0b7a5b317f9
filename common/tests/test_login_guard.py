"""LoginGuard: a few failed logins are free, then each waits twice as long as the last."""

from __future__ import annotations

from metaq.common.login_guard import FORGET_AFTER_S, FREE_FAILURES, MAX_WAIT_S, LoginGuard


def test_after_the_free_failures_the_wait_doubles_up_to_the_limit() -> None:
    guard, now = LoginGuard(), 1000.0
    for _ in range(FREE_FAILURES):
        assert guard.wait_s("admin", "10.0.0.1", now) == 0
        guard.failed("admin", "10.0.0.1", now)
    waits = []
    for _ in range(9):
        guard.failed("admin", "10.0.0.1", now)
        waits.append(guard.wait_s("admin", "10.0.0.1", now))
    assert waits == [1, 2, 4, 8, 16, 32, MAX_WAIT_S, MAX_WAIT_S, MAX_WAIT_S]


def test_the_user_is_held_from_any_address_and_the_address_for_any_user() -> None:
    guard, now = LoginGuard(), 0.0
    for n in range(FREE_FAILURES + 1):
        guard.failed("admin", f"10.0.0.{n}", now)  # one user, many addresses
    assert guard.wait_s("admin", "10.9.9.9", now) > 0
    for n in range(FREE_FAILURES + 1):
        guard.failed(f"user{n}", "10.1.1.1", now)  # one address, many users
    assert guard.wait_s("someone-else", "10.1.1.1", now) > 0
    assert guard.wait_s("someone-else", "10.2.2.2", now) == 0


def test_a_success_clears_the_count_and_an_old_count_is_forgotten() -> None:
    guard = LoginGuard()
    for _ in range(FREE_FAILURES + 2):
        guard.failed("admin", "a", 0.0)
    assert guard.wait_s("admin", "a", 0.0) > 0
    assert guard.wait_s("admin", "a", FORGET_AFTER_S + 1) == 0
    guard.succeeded("admin", "a")
    guard.failed("admin", "a", 10.0)
    assert guard.wait_s("admin", "a", 10.0) == 0
