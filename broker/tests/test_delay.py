"""Delayed delivery against a real store: tiers, exactly-once rounds, redo after a cut."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from metaq.broker.delay import (
    CURSOR_TOPIC,
    DELAY_TOPIC,
    TIERS,
    DelayPolicy,
    DelayScheduler,
    divert,
    parse_levels,
    tier_for,
)
from metaq.broker.store import GetStatus, MessageStore
from metaq.common.errors import InvalidMessage
from metaq.common.record import FLAG_DELAYED, decode, encode, iter_records

POLICY = DelayPolicy(parse_levels("1s 5s 2m"), max_delay_ms=7 * 86_400_000)


class Clock:
    def __init__(self) -> None:
        self.ms = time.time_ns() // 1_000_000

    def __call__(self) -> int:
        return self.ms


def delayed(body: bytes, **props: str) -> bytearray:
    return encode("orders", body, queue_id=1, properties=props, flags=FLAG_DELAYED)


def bodies(store: MessageStore, topic: str = "orders", queue_id: int = 1) -> list[bytes]:
    result = store.get(topic, queue_id, 0, max_messages=1000)
    if result.status is not GetStatus.FOUND:
        return []
    return [decode(r).body for r in result.records]


def test_levels_and_tiers() -> None:
    assert parse_levels("1s 500ms 2m 1h 1d") == (1000, 500, 120_000, 3_600_000, 86_400_000)
    with pytest.raises(ValueError, match="'5x'"):
        parse_levels("1s 5x")
    assert [tier_for(ms) for ms in (0, 999, 1000, 1999, 2000, 7 * 86_400_000)] == [
        0, 0, 0, 0, 1, TIERS - 1,
    ]  # fmt: skip


def test_bad_delays_are_refused_with_what_is_allowed() -> None:
    now = time.time_ns() // 1_000_000
    with pytest.raises(InvalidMessage, match="not one of 1-3"):
        divert([memoryview(delayed(b"x", DELAY="4"))], POLICY)
    with pytest.raises(InvalidMessage, match="max_delay_ms"):
        divert([memoryview(delayed(b"x", DELIVER_AT=str(now + 8 * 86_400_000)))], POLICY)
    with pytest.raises(InvalidMessage, match="needs property"):
        divert([memoryview(delayed(b"x"))], POLICY)


def test_a_refused_delay_is_a_refusal_quoting_the_property_short() -> None:
    """Numbers int() cannot take (20,000 digits, a Unicode superscript) are refusals,
    not internal errors, and no refusal repeats a property whole."""
    with pytest.raises(InvalidMessage, match="not one of 1-3") as level:
        divert([memoryview(delayed(b"x", DELAY="9" * 20_000))], POLICY)
    with pytest.raises(InvalidMessage, match="not one of 1-3"):
        divert([memoryview(delayed(b"x", DELAY="\u00b2"))], POLICY)
    with pytest.raises(InvalidMessage, match="needs property") as at:
        divert([memoryview(delayed(b"x", DELIVER_AT="1" * 20_000))], POLICY)
    with pytest.raises(InvalidMessage, match="needs property") as missing:
        divert([memoryview(delayed(b"x", OTHER="y" * 20_000))], POLICY)

    for caught in (level, at, missing):
        assert len(str(caught.value)) < 400, len(str(caught.value))


def test_a_past_delivery_time_is_stored_at_once_and_others_go_to_their_tier() -> None:
    now = time.time_ns() // 1_000_000
    records = [
        memoryview(encode("orders", b"plain")),
        memoryview(delayed(b"past", DELIVER_AT=str(now - 10))),
        memoryview(delayed(b"level 2", DELAY="2")),
    ]

    out = divert(records, POLICY)

    assert out[0] is records[0] and out[1] is records[1]
    moved = decode(out[2], verify=False)
    assert (moved.topic, moved.queue_id) == (DELAY_TOPIC, tier_for(5000))
    assert moved.properties["REAL_TOPIC"] == "orders"
    assert moved.msg_id == decode(records[2], verify=False).msg_id


def scheduler(store: MessageStore, clock: Clock) -> DelayScheduler:
    return DelayScheduler(store, lambda: True, clock)


def test_messages_are_delivered_once_when_due_through_the_tiers(
    open_store: Callable[..., MessageStore],
) -> None:
    store = open_store()
    clock = Clock()
    sched = scheduler(store, clock)
    due = {b"in 1s": 1000, b"in 5s": 5000, b"in 100s": 100_000, b"in 3h": 3 * 3_600_000}
    start = clock.ms
    arriving = [memoryview(delayed(b, DELIVER_AT=str(start + ms))) for b, ms in due.items()]
    store.append(divert(arriving, POLICY))
    store.dispatcher.catch_up()
    delivered_at: dict[bytes, int] = {}
    # Tick as the service does, but skip the clock ahead to the next head's time when
    # nothing is due (the store's own timestamps are real time: waits count from start).
    for _ in range(1000):
        if not sched.idle():  # as the service does: no round when none would do anything
            sched.tick()
        store.dispatcher.catch_up()
        for body in bodies(store):
            delivered_at.setdefault(body, clock.ms - start)
        next_due = sched.next_due_ms()
        if next_due is None:
            break
        clock.ms = max(clock.ms + 100, next_due)

    assert sorted(bodies(store)) == sorted(due)  # each exactly once
    for body, ms in due.items():
        assert ms <= delivered_at[body] <= ms + 1100, body
    assert sched.pending() == 0


def test_idle_only_while_no_tier_head_can_be_handled(
    open_store: Callable[..., MessageStore],
) -> None:
    store = open_store()
    clock = Clock()
    sched = scheduler(store, clock)
    assert not sched.idle()  # a new master must read its cursors from the log first
    sched.tick()
    assert sched.idle()  # nothing delayed at all

    # The tier's second counts from the store's real clock: read it right before.
    clock.ms = start = time.time_ns() // 1_000_000
    due = start + 1500
    store.append(divert([memoryview(delayed(b"x", DELIVER_AT=str(due)))], POLICY))
    store.dispatcher.catch_up()
    assert not sched.idle()  # a new tier head, not read yet
    assert sched.tick() == 0
    assert sched.idle()  # read: tier 0 holds it for a second
    clock.ms = start + 900
    assert sched.idle()
    clock.ms = due - 1  # past its second in the tier: a round would look at it again
    assert not sched.idle()
    assert sched.tick() == 0  # due within the second: it waits in place
    assert sched.idle()
    clock.ms = due
    assert not sched.idle()
    assert sched.tick() == 1
    store.dispatcher.catch_up()
    assert sched.idle()
    assert bodies(store) == [b"x"]


def test_a_slave_is_idle_once_it_dropped_its_cursors(
    open_store: Callable[..., MessageStore],
) -> None:
    store = open_store()
    master = [True]
    sched = DelayScheduler(store, lambda: master[0], Clock())
    sched.tick()
    master[0] = False
    assert not sched.idle()  # the cursors it kept as master go at the next round
    sched.tick()
    assert sched.idle()


def test_a_round_cut_off_after_its_cursor_record_is_redone_exactly_once(
    open_store: Callable[..., MessageStore],
) -> None:
    store = open_store()
    clock = Clock()
    start = clock.ms
    arriving = [memoryview(delayed(b"m%d" % i, DELIVER_AT=str(start + 1000))) for i in range(5)]
    store.append(divert(arriving, POLICY))
    store.dispatcher.catch_up()
    sched = scheduler(store, clock)
    clock.ms = start + 1500
    cut_at = store.commitlog.write_offset
    assert sched.tick() == 5
    store.dispatcher.catch_up()
    # Keep the cursor record and the first two deliveries: what a torn tail or a
    # failover to a slave that had copied only part of the batch leaves.
    records = list(store.commitlog.records(cut_at, store.commitlog.write_offset))
    assert decode(records[0][1]).topic == CURSOR_TOPIC
    store.truncate(records[3][0])
    assert bodies(store) == [b"m0", b"m1"]

    again = scheduler(store, clock)  # a new master rebuilds from the log
    assert again.tick() == 3
    store.dispatcher.catch_up()

    assert bodies(store) == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert again.tick() == 0
    assert again.pending() == 0


def test_only_the_master_delivers(open_store: Callable[..., MessageStore]) -> None:
    store = open_store()
    clock = Clock()
    store.append(divert([memoryview(delayed(b"x", DELAY="1"))], POLICY))
    store.dispatcher.catch_up()
    master = [False]
    sched = DelayScheduler(store, lambda: master[0], clock)
    clock.ms += 5000

    assert sched.tick() == 0
    assert bodies(store) == []
    master[0] = True
    assert sched.tick() == 1
    store.dispatcher.catch_up()
    assert [r.body for r in iter_records(b"".join(store.get("orders", 1, 0).records))] == [b"x"]
