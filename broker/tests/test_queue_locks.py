"""The ordered consumers' queue locks on a master, against a fake clock: exclusive, and
across a takeover kept by their owners while no one else gets a queue."""

from __future__ import annotations

from metaq.broker.queue_locks import QueueLocks

Q = ("orders", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_locked_queue_goes_to_no_one_else_until_its_lock_lapses() -> None:
    clock = Clock()
    locks = QueueLocks(30.0, clock)
    assert locks.lock("g", "a", [Q]) == [Q]
    assert locks.lock("g", "b", [Q]) == []
    clock.now += 29.9
    assert locks.lock("g", "b", [Q], held=True) == []  # a claim takes nothing held
    clock.now += 0.2
    assert locks.lock("g", "b", [Q]) == [Q]


def test_after_a_takeover_only_a_member_renewing_its_lease_gets_its_queue() -> None:
    clock = Clock()
    locks = QueueLocks(30.0, clock)
    locks.hold_off()
    assert locks.lock("g", "newcomer", [Q]) == []  # it may be someone's under the old master
    assert locks.lock("g", "owner", [Q], held=True) == [Q]
    assert locks.lock("g", "other", [Q], held=True) == []  # the first claim wins
    assert locks.lock("g", "owner", [Q]) == [Q]  # its own: renewed as usual
    clock.now += 25.0
    assert locks.lock("g", "newcomer", [("orders", 1)]) == []  # still held off
    assert locks.lock("g", "owner", [Q], held=True) == [Q]
    clock.now += 5.1
    assert locks.lock("g", "newcomer", [("orders", 1)]) == [("orders", 1)]
    assert locks.lock("g", "newcomer", [Q]) == []  # the owner renewed within its lease


def test_an_unlocked_queue_is_free_at_once_outside_the_hold_off() -> None:
    clock = Clock()
    locks = QueueLocks(30.0, clock)
    locks.lock("g", "a", [Q])
    locks.unlock("g", "a", [Q])
    assert locks.lock("g", "b", [Q]) == [Q]
