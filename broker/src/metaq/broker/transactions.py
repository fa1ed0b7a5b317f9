"""Transactional messages (Notify / MetaQ 3.0): half messages, their end, and check-back.

A producer sends a **half message** (``FLAG_TRANSACTION``): the broker stores it, like any
message and under the same flush and replication guarantees, but in the system topic
``%SYS%HALF`` where no consumer reads. The producer then runs its local transaction and
ends the half message with END_TRANSACTION: COMMIT copies it to its real topic and
queue, ROLLBACK does not. Either way the broker appends an **op record** to
``%SYS%HALF_OP`` naming the half message and the outcome, in the same append as the
copy, so an end is applied exactly once — also by a new master, whose log holds the
ops it holds the copies of.

When no end arrives (the producer crashed, the reply was lost) the broker **checks
back**: after ``txn_check_after_ms`` it asks a connected producer of the same producer
group (CHECK_TRANSACTION, one-way) how the transaction ended, again every
``txn_check_interval_ms``, at most ``txn_max_checks`` times; then it discards the half
message (an op record says so). The producer answers with END_TRANSACTION.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from metaq.broker.connection import Responder
from metaq.broker.store import GetStatus, MessageStore
from metaq.common.errors import InvalidMessage
from metaq.common.framing import FLAG_ONE_WAY, Buffer, FrameType, encode_frame
from metaq.common.names import check_group
from metaq.common.record import (
    FIELDS,
    FLAG_TRANSACTION,
    PROP_REAL_QUEUE,
    PROP_REAL_TOPIC,
    Record,
    decode,
    encode,
    readdress,
)
from metaq.common.service import PeriodicService
from metaq.common.v1.data_pb2 import CheckTransactionRequest, EndTransactionRequest

log = logging.getLogger(__name__)
_FLAGS: Final = FIELDS["flags"]

HALF_TOPIC: Final = "%SYS%HALF"
OP_TOPIC: Final = "%SYS%HALF_OP"
PROP_GROUP: Final = "PRODUCER_GROUP"
_HALF_PROPS: Final = frozenset({PROP_REAL_TOPIC, PROP_REAL_QUEUE, PROP_GROUP})
COMMIT: Final = EndTransactionRequest.COMMIT
ROLLBACK: Final = EndTransactionRequest.ROLLBACK
DISCARD: Final = 3
"""An op's outcome when the checks ran out: like a rollback, but said apart."""


def _copy(record: Record, topic: str, queue_id: int, properties: dict[str, str]) -> bytearray:
    return readdress(record, topic, queue_id, properties, clear_flags=FLAG_TRANSACTION)


def to_half(records: Sequence[Buffer], producer_group: str) -> list[Buffer]:
    """The records of a send with each half message moved to ``%SYS%HALF``."""
    if not producer_group:
        raise InvalidMessage("a transactional send needs its producer_group (for checks)")
    out: list[Buffer] = []
    for raw in records:
        if not int(_FLAGS.read(raw)) & FLAG_TRANSACTION:
            out.append(raw)
            continue
        record = decode(raw, verify=False)
        props = {k: v for k, v in record.properties.items() if k not in _HALF_PROPS}
        props[PROP_REAL_TOPIC] = record.topic
        props[PROP_REAL_QUEUE] = str(record.queue_id)
        props[PROP_GROUP] = producer_group
        out.append(_copy(record, HALF_TOPIC, 0, props))
    return out


@dataclass(slots=True)
class _Pending:
    stored_ms: int
    checks: int = 0
    last_check: float = 0.0


class Transactions:
    """The master's view of half messages: ``is_master`` says when it may act."""

    def __init__(
        self,
        store: MessageStore,
        is_master: Callable[[], bool],
        *,
        check_after_ms: int,
        check_interval_ms: int,
        max_checks: int,
    ) -> None:
        self._store = store
        self._is_master = is_master
        self._check_after_ms = check_after_ms
        self._check_interval_s = check_interval_ms / 1000
        self._max_checks = max_checks
        self._ended: dict[int, int] | None = None
        """Half message offset → outcome, rebuilt from the op records when needed."""
        self._ops_read = 0
        self._halves_read = 0
        self._pending: dict[int, _Pending] = {}
        self._producers: dict[str, dict[int, Responder]] = {}
        self.discarded = 0

    # --- producers ------------------------------------------------------------------------

    def producer_seen(self, group: str, responder: Responder) -> None:
        """A producer of ``group`` sent on this connection: it can be asked back."""
        if group:
            connections = self._producers.get(group)
            if connections is None:
                check_group(group, "producer group")
                connections = self._producers[group] = {}
            if responder.connection_id not in connections:
                connections[responder.connection_id] = responder

    def connection_lost(self, connection_id: int) -> None:
        for connections in self._producers.values():
            connections.pop(connection_id, None)

    # --- state ----------------------------------------------------------------------------

    def _batches(self, topic: str, offset: int) -> Iterator[tuple[Sequence[Buffer], int]]:
        """The records of ``topic`` from ``offset`` on, a batch at a time with the offset
        after it (no records where the log no longer holds ``offset``); each batch is
        released when the caller takes the next."""
        while True:
            result = self._store.get(topic, 0, offset, max_messages=256)
            if result.status is GetStatus.OFFSET_TOO_SMALL:
                offset = result.next_offset
                yield (), offset
                continue
            if result.status is not GetStatus.FOUND:
                return
            yield result.records, result.next_offset
            offset = result.next_offset
            result.release()

    def _catch_up(self) -> dict[int, int]:
        """Read op records and half messages dispatched since the last call."""
        if self._ended is None:
            self._ended, self._ops_read, self._halves_read, self._pending = {}, 0, 0, {}
        ended = self._ended
        for records, next_offset in self._batches(OP_TOPIC, self._ops_read):
            for raw in records:
                op = json.loads(decode(raw, verify=False).body)
                ended[int(op["half"])] = int(op["action"])
                self._pending.pop(int(op["half"]), None)
            self._ops_read = next_offset
        for records, next_offset in self._batches(HALF_TOPIC, self._halves_read):
            for raw in records:
                half = decode(raw, verify=False)
                if half.commitlog_offset not in ended:
                    self._pending[half.commitlog_offset] = _Pending(half.store_timestamp_ms)
            self._halves_read = next_offset
        return ended

    def pending(self) -> int:
        return len(self._pending)

    def summary(self) -> dict[str, int | None]:
        """The half messages waiting for their producer's commit or rollback: how many,
        the oldest's store time, the most check-backs one has had, and how many were
        discarded after the last check (on a master; a slave tracks none)."""
        pending = list(self._pending.values())
        return {
            "pending": len(pending),
            "oldest_ms": min((p.stored_ms for p in pending), default=None),
            "most_checks": max((p.checks for p in pending), default=0),
            "max_checks": self._max_checks,
            "check_after_ms": self._check_after_ms,
            "discarded": self.discarded,
        }

    # --- ending ---------------------------------------------------------------------------

    def end(self, request: EndTransactionRequest) -> int:
        """Apply an END_TRANSACTION (exactly once); returns how the half message ended."""
        if request.action not in (COMMIT, ROLLBACK):
            raise InvalidMessage(
                f"END_TRANSACTION action must be COMMIT or ROLLBACK, not {request.action}"
            )
        half = self._half(request.commitlog_offset, request.msg_id)
        ended = self._catch_up()
        if request.commitlog_offset in ended:
            return ended[request.commitlog_offset]
        self._finish(half, request.action)
        return int(request.action)

    def _half(self, offset: int, msg_id: bytes) -> Record:
        self._store.catch_up_dispatch()  # the queues must see the half message too
        record = self._store.record_at(offset)
        if record is None or record.topic != HALF_TOPIC or record.msg_id != msg_id:
            raise InvalidMessage(
                f"no half message {msg_id.hex()} at commitlog offset {offset} on this broker "
                "group: end a transaction where its half message was sent"
            )
        return record

    def _finish(self, half: Record, action: int) -> None:
        op = encode(
            OP_TOPIC, json.dumps({"half": half.commitlog_offset, "action": action}).encode()
        )
        batch: list[bytes | bytearray] = [op]
        if action == COMMIT:
            props = {k: v for k, v in half.properties.items() if k not in _HALF_PROPS}
            topic = half.properties[PROP_REAL_TOPIC]
            batch.append(_copy(half, topic, int(half.properties[PROP_REAL_QUEUE]), props))
        self._store.append(batch)
        assert self._ended is not None
        self._ended[half.commitlog_offset] = action
        self._pending.pop(half.commitlog_offset, None)

    # --- checking back --------------------------------------------------------------------

    def tick(self) -> None:
        if not self._is_master():
            self._ended = None  # rebuilt from the log when this broker is master again
            return
        self._catch_up()
        now_ms = time.time_ns() // 1_000_000
        now = time.monotonic()
        for offset, pending in list(self._pending.items()):
            if now_ms - pending.stored_ms < self._check_after_ms:
                continue
            if now - pending.last_check < self._check_interval_s:
                continue
            if pending.checks >= self._max_checks:
                half = self._store.record_at(offset)
                if half is not None:
                    log.warning("half message %s was never ended; discarding it after %d checks",
                                half.msg_id.hex(), pending.checks)  # fmt: skip
                    self._finish(half, DISCARD)
                    self.discarded += 1
                continue
            half = self._store.record_at(offset)
            if half is None:
                self._pending.pop(offset, None)
                continue
            pending.last_check = now
            if self._ask(half, pending):
                pending.checks += 1

    def _ask(self, half: Record, pending: _Pending) -> bool:
        group = half.properties.get(PROP_GROUP, "")
        producers = [r for r in self._producers.get(group, {}).values() if not r.closed]
        if not producers:
            return False
        responder = producers[pending.checks % len(producers)]
        header = CheckTransactionRequest(
            producer_group=group,
            commitlog_offset=half.commitlog_offset,
            msg_id=half.msg_id,
            check_times=pending.checks + 1,
        ).SerializeToString()
        view = self._store.commitlog.slice(half.commitlog_offset, half.size)
        if view is None:
            return False
        # Request ids of one-way frames from the broker are only for logs: use the offset.
        request_id = (half.commitlog_offset % 0xFFFFFFFE) + 1
        responder.respond(
            encode_frame(FrameType.CHECK_TRANSACTION, request_id, header, bytes(view), FLAG_ONE_WAY)
        )
        return True


class TransactionService(PeriodicService):
    name = "transactions"

    def __init__(self, transactions: Transactions, interval_s: float = 1.0) -> None:
        super().__init__(interval_s)
        self.transactions = transactions

    async def run_once(self) -> None:
        self.transactions.tick()
