"""Delayed delivery: messages held back until a delay level or a chosen time.

A record with ``FLAG_DELAYED`` says when in its properties: ``DELAY`` (a 1-based level of
``delay_levels``, "1s 5s 10s 30s 1m ..." as in RocketMQ) or ``DELIVER_AT`` (ms since the
Unix epoch, at most ``max_delay_ms`` ahead). On arrival it is stored, like any message,
in the commitlog, but in the system topic ``%SYS%DELAY``, with its real topic, queue and
due time in its properties; the send is answered then, under the usual flush and
replication guarantees.

Arbitrary times without a timer per message: queue *t* of ``%SYS%DELAY`` (a **tier**)
holds messages stored there at least 2^t seconds before they are due. Since every
message of a tier waits the same 2^t s, each tier is due in the order it was written, so
one cursor per tier says what has been handled. When a tier's head has waited its 2^t s
it moves down to the tier of its remaining time (a copy, in the log), or is delivered
to its real topic once due; a message goes through at most one tier per power of two of
its delay (20 tiers cover the 7-day maximum), and none of them needs a scan. Delivery is
accurate to the scheduler's tick (100 ms) plus the up-to-a-second head-of-line wait in
tier 0.

Exactly once, across restarts and failover: every round's deliveries and moves are
appended as one batch that *starts* with a cursor record (``%SYS%DELAY_CURSOR``) naming
the cursors after the round and the source of each copy that follows. Whatever part of
the batch reached the log (a crash or a failover can cut it) is found behind the newest
cursor record, so a new master (or a restarted one) redoes only the missing copies. Only
the master delivers; a slave's log receives the master's copies.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from metaq.broker.store import GetStatus, MessageStore
from metaq.common.errors import InvalidMessage
from metaq.common.framing import Buffer
from metaq.common.names import shown
from metaq.common.record import (
    FIELDS,
    FLAG_DELAYED,
    PROP_DELAY_LEVEL,
    PROP_DELIVER_AT,
    PROP_REAL_QUEUE,
    PROP_REAL_TOPIC,
    Record,
    decode,
    encode,
    readdress,
)
from metaq.common.service import PeriodicService

log = logging.getLogger(__name__)
_FLAGS: Final = FIELDS["flags"]

DELAY_TOPIC: Final = "%SYS%DELAY"
CURSOR_TOPIC: Final = "%SYS%DELAY_CURSOR"
TIERS: Final = 20
PROP_DUE: Final = "DUE_MS"
PROP_SINCE: Final = "TIER_SINCE"
"""When the message entered its tier (ms), by the clock of the broker that put it there."""
PROP_SOURCE: Final = "DELAY_SOURCE"
"""On every copy: the tier and queue offset it was made from ("3:1042")."""
_INTERNAL: Final = frozenset({PROP_DELAY_LEVEL, PROP_DELIVER_AT, PROP_REAL_TOPIC,
                              PROP_REAL_QUEUE, PROP_DUE, PROP_SINCE})  # fmt: skip
_BATCH: Final = 256
_MAX_DIGITS: Final = 19
"""Enough for any delay level and any ms-since-epoch time; longer is refused as it is."""
_UNITS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
DEFAULT_LEVELS: Final = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"


def parse_levels(text: str) -> tuple[int, ...]:
    """ "1s 5s 1m" → (1000, 5000, 60000); ValueError naming the bad item."""
    levels = []
    for item in text.split():
        match = re.fullmatch(r"(\d+)(ms|s|m|h|d)", item)
        if not match or int(match.group(1)) <= 0:
            raise ValueError(f"delay level {item!r} is not a positive duration like 5s, 1m, 2h")
        levels.append(int(match.group(1)) * _UNITS[match.group(2)])
    if not levels:
        raise ValueError("delay_levels needs at least one level")
    return tuple(levels)


def tier_for(remaining_ms: int) -> int:
    """The tier of a message due in ``remaining_ms``: the largest t with 2^t s ≤ it."""
    tier = 0
    while tier + 1 < TIERS and (1000 << (tier + 1)) <= remaining_ms:
        tier += 1
    return tier


@dataclass(frozen=True, slots=True)
class DelayPolicy:
    levels_ms: tuple[int, ...]
    max_delay_ms: int

    def due_ms(self, record: Record, now_ms: int) -> int:
        """When a FLAG_DELAYED record is due; InvalidMessage saying what is wrong."""
        props = record.properties
        if PROP_DELAY_LEVEL in props:
            raw = props[PROP_DELAY_LEVEL]
            level = _digits(raw)
            if level is None or not 1 <= level <= len(self.levels_ms):
                raise InvalidMessage(
                    f"delay level {shown(raw)} is not one of 1-{len(self.levels_ms)} (this "
                    "broker's delay_levels); use a level in range, or DELIVER_AT for another time"
                )
            return now_ms + self.levels_ms[level - 1]
        due = _digits(props.get(PROP_DELIVER_AT, ""))
        if due is None:
            raise InvalidMessage(
                f"a delayed message needs property {PROP_DELAY_LEVEL} (a level) or "
                f"{PROP_DELIVER_AT} (ms since the Unix epoch), not {shown(dict(props))}"
            )
        if due - now_ms > self.max_delay_ms:
            raise InvalidMessage(
                f"{PROP_DELIVER_AT} is {(due - now_ms) / 1000:.0f} s ahead; the limit is "
                f"{self.max_delay_ms / 1000:.0f} s (max_delay_ms)"
            )
        return due


def _digits(raw: str) -> int | None:
    """A property's decimal digits as an int, None for anything else. ASCII only, and
    short: int() refuses other Unicode digits and more than 4,300 digits with a
    ValueError, which would surface as an internal error instead of a refusal."""
    if not (raw.isascii() and raw.isdigit()) or len(raw) > _MAX_DIGITS:
        return None
    return int(raw)


def _copy(record: Record, topic: str, queue_id: int, properties: dict[str, str]) -> bytearray:
    return readdress(record, topic, queue_id, properties, clear_flags=FLAG_DELAYED)


def to_delay_tier(record: Record, due_ms: int, now_ms: int) -> bytearray:
    """A delayed message as stored on arrival: in the tier of its wait, saying where it
    goes and when."""
    props = {k: v for k, v in record.properties.items() if k not in _INTERNAL}
    props[PROP_REAL_TOPIC] = record.topic
    props[PROP_REAL_QUEUE] = str(record.queue_id)
    props[PROP_DUE] = str(due_ms)
    props[PROP_SINCE] = str(now_ms)
    return _copy(record, DELAY_TOPIC, tier_for(due_ms - now_ms), props)


def divert(records: Sequence[Buffer], policy: DelayPolicy) -> list[Buffer]:
    """The records of a send with every delayed one moved to its tier (others as they are).

    Called only for a send with a FLAG_DELAYED record in it: the flag is read while the
    batch is split, so other sends pay nothing here."""
    now_ms = time.time_ns() // 1_000_000
    out: list[Buffer] = []
    for raw in records:
        if not int(_FLAGS.read(raw)) & FLAG_DELAYED:
            out.append(raw)
            continue
        record = decode(raw, verify=False)
        due = policy.due_ms(record, now_ms)
        out.append(to_delay_tier(record, due, now_ms) if due > now_ms else raw)
    return out


@dataclass(frozen=True, slots=True)
class TierState:
    """One tier of the timer wheel: it holds messages due at least ``waits_s`` ahead."""

    tier: int
    waits_s: int
    pending: int
    next_due_ms: int | None
    """When its head next moves down a tier or is delivered."""


class DelayScheduler:
    """Moves and delivers what is due; ``is_master`` says whether this broker may write."""

    def __init__(
        self,
        store: MessageStore,
        is_master: Callable[[], bool],
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self._store = store
        self._is_master = is_master
        self._clock_ms = clock_ms
        self._cursors: list[int] | None = None
        self._redo: list[tuple[int, int]] = []
        # Per tier, when its head (the record at the cursor) can next be handled: 0 when
        # that is unknown. Lets an idle check skip a round without reading any record.
        self._head_ready_ms = [0] * TIERS
        self.delivered = 0
        self.last_round = 0
        """Copies the last round made (moves and deliveries)."""

    # --- state ----------------------------------------------------------------------------

    def _rebuild(self) -> None:
        """Cursors from the newest cursor record, and what of its batch never landed."""
        store = self._store
        cursors = [store.min_offset(DELAY_TOPIC, t) for t in range(TIERS)]
        self._redo = []
        newest = store.max_offset(CURSOR_TOPIC, 0) - 1
        if newest >= 0:
            result = store.get(CURSOR_TOPIC, 0, newest, max_messages=1)
            if result.status is GetStatus.FOUND:
                cursor = decode(result.records[0])
                body = json.loads(cursor.body)
                cursors = [max(c, m) for c, m in zip(body["cursors"], cursors, strict=True)]
                sources = [(int(t), int(o)) for t, o in body["sources"]]
                self._redo = self._missing(cursor, sources)
                result.release()
        self._cursors = cursors
        self._head_ready_ms = [0] * TIERS
        if self._redo:
            log.warning("redoing %d delayed-message copies a crash or failover cut off",
                        len(self._redo))  # fmt: skip

    def _missing(self, cursor: Record, sources: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The sources whose copies are not right behind the cursor record in the log."""
        commitlog = self._store.commitlog
        start = cursor.commitlog_offset + cursor.size
        found = 0
        for _, view in commitlog.records(start, commitlog.write_offset):
            if found == len(sources):
                break
            copy = decode(view, verify=False)
            origin = copy.properties.get(PROP_SOURCE, "")
            tier, offset = sources[found]
            if origin != f"{tier}:{offset}":
                break
            found += 1
        return sources[found:]

    def pending(self) -> int:
        """Delayed messages not delivered yet (0 on a slave: it does not track them)."""
        if self._cursors is None:
            return 0
        return sum(
            max(0, self._store.max_offset(DELAY_TOPIC, t) - c) for t, c in enumerate(self._cursors)
        )

    def next_due_ms(self) -> int | None:
        """When the earliest tier head is due to move or be delivered (None: nothing)."""
        if self._cursors is None:
            return None
        times = []
        for tier, offset in enumerate(self._cursors):
            record = self._read(tier, offset)
            if record is not None:
                due = int(record.properties[PROP_DUE])
                times.append(min(due, _waited_ms(record, tier)))
        return min(times, default=None)

    def tiers(self) -> list[TierState]:
        """Each tier (of the timer wheel) holding messages not delivered yet: how many,
        and when its head next moves down or is delivered (empty on a slave)."""
        if self._cursors is None:
            return []
        found = []
        for tier, offset in enumerate(self._cursors):
            waiting = self._store.max_offset(DELAY_TOPIC, tier) - offset
            if waiting <= 0:
                continue
            record = self._read(tier, offset)
            head = None
            if record is not None:
                head = min(int(record.properties[PROP_DUE]), _waited_ms(record, tier))
            found.append(TierState(tier, 1 << tier, waiting, head))
        return found

    def idle(self) -> bool:
        """True when a round now would do nothing: no copies to redo, and every tier is
        empty past its cursor or has a head not due yet. Reads no record, so a broker
        without delayed messages answers it with a few lookups and no thread."""
        cursors = self._cursors
        if not self._is_master():
            return cursors is None
        if cursors is None or self._redo:
            return False
        now = self._clock_ms()
        max_offset = self._store.max_offset
        ready = self._head_ready_ms
        return all(
            max_offset(DELAY_TOPIC, tier) <= cursor or now < ready[tier]
            for tier, cursor in enumerate(cursors)
        )

    # --- work -----------------------------------------------------------------------------

    def tick(self) -> int:
        """One round: returns how many messages were delivered to their real topics."""
        if not self._is_master():
            self._cursors = None  # rebuilt from the log when this broker is master again
            return 0
        if self._cursors is None:
            self._rebuild()
        cursors = self._cursors
        assert cursors is not None
        now = self._clock_ms()
        copies: list[bytearray] = []
        sources: list[tuple[int, int]] = []
        delivered = 0
        for tier, offset in self._redo:
            record = self._read(tier, offset)
            if record is not None:
                delivered += self._handle(record, tier, offset, now, copies, sources, force=True)
        self._redo = []
        for tier in range(TIERS):
            waiting = False
            while len(copies) < _BATCH and not waiting:
                result = self._store.get(
                    DELAY_TOPIC, tier, cursors[tier], max_messages=_BATCH - len(copies)
                )
                if result.status is not GetStatus.FOUND:
                    break
                for raw in result.records:
                    record = decode(raw, verify=False)
                    handled = self._handle(record, tier, cursors[tier], now, copies, sources)
                    if handled < 0:
                        waiting = True  # the head is not due: nothing behind it is either
                        self._head_ready_ms[tier] = _ready_ms(record, tier, now)
                        break
                    delivered += handled
                    cursors[tier] += 1
                    self._head_ready_ms[tier] = 0
                result.release()
        if sources:
            marker = encode(
                CURSOR_TOPIC,
                json.dumps({"cursors": cursors, "sources": sources}).encode(),
            )
            self._store.append([marker, *copies])
            self.delivered += delivered
        self.last_round = len(sources)
        return delivered

    def run(self, budget_s: float) -> None:
        """Rounds until one finds less than a full batch due, or ``budget_s`` is spent."""
        deadline = time.monotonic() + budget_s
        self.tick()
        while self.last_round >= _BATCH and time.monotonic() < deadline:
            self.tick()

    def _read(self, tier: int, offset: int) -> Record | None:
        result = self._store.get(DELAY_TOPIC, tier, offset, max_messages=1)
        if result.status is not GetStatus.FOUND:
            return None
        record = decode(result.records[0], verify=False)
        result.release()
        return record

    def _handle(
        self,
        record: Record,
        tier: int,
        offset: int,
        now: int,
        copies: list[bytearray],
        sources: list[tuple[int, int]],
        *,
        force: bool = False,
    ) -> int:
        """Move or deliver one tier head; -1 if it must wait, else how many delivered."""
        due = int(record.properties[PROP_DUE])
        waited = _waited_ms(record, tier)
        if not force and now < min(waited, due):
            return -1
        props = dict(record.properties)
        props[PROP_SOURCE] = f"{tier}:{offset}"
        remaining = due - now
        if remaining >= 1000 or (remaining > 0 and force):
            props[PROP_SINCE] = str(now)
            copies.append(_copy(record, DELAY_TOPIC, tier_for(remaining), props))
            sources.append((tier, offset))
            return 0
        if remaining > 0:
            return -1  # due within the second: wait for it here
        real = {k: v for k, v in props.items() if k not in _INTERNAL}
        copies.append(_copy(record, props[PROP_REAL_TOPIC], int(props[PROP_REAL_QUEUE]), real))
        sources.append((tier, offset))
        return 1


def _waited_ms(record: Record, tier: int) -> int:
    """When ``record`` has waited its tier's 2^tier seconds."""
    return int(record.properties[PROP_SINCE]) + (1000 << tier)


def _ready_ms(record: Record, tier: int, now: int) -> int:
    """When a tier head that cannot be handled at ``now`` can next be: once it has waited
    its tier's time (it moves on, or is delivered), or once due if it waits in place."""
    due = int(record.properties[PROP_DUE])
    waited = _waited_ms(record, tier)
    return min(waited, due) if now < min(waited, due) else due


class DelayService(PeriodicService):
    name = "delay"

    def __init__(self, scheduler: DelayScheduler, interval_s: float = 0.1) -> None:
        super().__init__(interval_s)
        self.scheduler = scheduler

    async def run_once(self) -> None:
        # Ten times a second a round with nothing to do would still hand the loop's GIL to
        # a worker thread and back, in the middle of whatever sends and pulls are in flight.
        if self.scheduler.idle():
            return
        # In a thread: a backlog of due messages takes rounds, and the event loop must
        # go on answering sends and pulls meanwhile (appends are thread-safe).
        await asyncio.to_thread(self.scheduler.run, 0.5)
