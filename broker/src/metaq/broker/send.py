"""The SEND handler: split a batch of producer-built records, append it, answer.

The payload is records back to back; splitting reads only each record's size, queue id
and topic (which must match the request: permissions are checked on the header's topic
and queue). The batch is appended as one unit — every record is checked before any is
written — so a refused send leaves nothing behind, not even an auto-created topic. Under
SYNC flush the answer waits for the fsync that covers the batch (group commit), with the
store's flush timeout turning into status FLUSH_DISK_TIMEOUT.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Final

from metaq.broker.config import BrokerConfig
from metaq.broker.connection import Responder
from metaq.broker.delay import DelayPolicy, divert, parse_levels
from metaq.broker.metrics import BrokerMetrics
from metaq.broker.role import GroupRole
from metaq.broker.store import FlushMode, MessageStore
from metaq.broker.store.commitlog import Appended, RecordBatch
from metaq.broker.store.flush import AsyncDurability
from metaq.broker.topics import TopicTable
from metaq.broker.transactions import Transactions, to_half
from metaq.common.errors import InvalidMessage, MetaqError, StoreUnavailable
from metaq.common.framing import FLAG_RESPONSE, Buffer, Frame, FrameType, encode_frame
from metaq.common.model import TopicConfig
from metaq.common.record import (
    FIELDS,
    FLAG_DELAYED,
    FLAG_SEQUENCED,
    FLAG_TRANSACTION,
    HEADER_SIZE,
    UNPLACED,
    Record,
    header_view,
    id_sequence,
    topic_of,
)
from metaq.common.v1.data_pb2 import SendRequest, SendResponse

log = logging.getLogger(__name__)

# All splitting needs of a record.
_FIELDS: Final = header_view("size", "flags", "queue_id", "topic_len")
_MSG_ID_AT: Final = FIELDS["msg_id"].offset
_MSG_ID_END: Final = FIELDS["msg_id"].end
_FLAGS_AT: Final = FIELDS["flags"].offset
_KNOWN_FLAGS: Final = SendRequest.FLAG_NO_WAIT_STORE | SendRequest.FLAG_RETRY
# Record flags that need the record-by-record path (the records are rewritten).
_SPECIAL_FLAGS: Final = FLAG_DELAYED | FLAG_TRANSACTION


def split_records(
    payload: memoryview, topic: bytes, queue_id: int, expected: int
) -> tuple[list[memoryview], int]:
    """Cut a SEND payload into record views, and OR their flags (does any ask for
    delayed delivery, or is a half message?); raise InvalidMessage on any disagreement."""
    records: list[memoryview] = []
    flags_seen = 0
    n = len(payload)
    pos = 0
    unpack = _FIELDS.unpack_from
    topic_len = len(topic)
    while pos < n:
        if n - pos < HEADER_SIZE:
            raise InvalidMessage(
                f"record {len(records)} of the batch is cut short: {n - pos} bytes left, "
                f"a record header alone is {HEADER_SIZE}"
            )
        size, flags, record_queue, record_topic_len = unpack(payload, pos)
        flags_seen |= flags
        if size < HEADER_SIZE or size > n - pos:
            raise InvalidMessage(
                f"record {len(records)} of the batch claims {size} bytes but {n - pos} remain"
            )
        if record_queue != queue_id:
            raise InvalidMessage(
                f"record {len(records)} is for queue {record_queue}, the request for "
                f"queue {queue_id}; a batch goes to one queue"
            )
        start = pos + HEADER_SIZE
        if record_topic_len != topic_len or payload[start : start + topic_len] != topic:
            raise InvalidMessage(
                f"record {len(records)} names another topic than the request's "
                f"{topic.decode(errors='replace')!r}; a batch goes to one topic"
            )
        records.append(payload[pos : pos + size])
        pos += size
    if len(records) != expected:
        raise InvalidMessage(
            f"the payload holds {len(records)} records but record_count says {expected}"
        )
    if not records:
        raise InvalidMessage("a SEND needs at least one record")
    return records, flags_seen


class SendHandler:
    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicTable,
        metrics: BrokerMetrics,
        durability: AsyncDurability,
        role: GroupRole,
        transactions: Transactions,
    ) -> None:
        self._config = config
        self._role = role
        self._transactions = transactions
        self._delay_policy = DelayPolicy(parse_levels(config.delay_levels), config.max_delay_ms)
        self._store = store
        self._topics = topics
        self._metrics = metrics
        self._durability = durability
        self._sync = config.store.flush_mode is FlushMode.SYNC
        self._flush_timeout_s = config.store.flush_timeout_ms / 1e3
        self._loop = asyncio.get_running_loop()
        self.inflight: set[asyncio.Future[None]] = set()
        """Sends waiting for durability or their slaves' copies; shutdown waits for them
        (bounded)."""
        self.draining = False
        self._dispatch_scheduled = False
        # Refilled for every answer rather than built anew: filling a new message's
        # repeated fields costs more than encoding it (docs/benchmarks.md).
        # One per handler, used only on its loop's thread, serialized before it returns.
        self._answer = SendResponse()

    def handle(self, responder: Responder, frame: Frame) -> None:
        try:
            self._handle(responder, frame)
        except MetaqError as exc:
            self._metrics.write_rejected(exc, self._store)
            raise

    def _handle(self, responder: Responder, frame: Frame) -> None:
        self._role.check_writable()
        if self.draining:
            raise StoreUnavailable("the broker is shutting down; send to another broker")
        request = SendRequest.FromString(frame.header)
        if request.flags & ~_KNOWN_FLAGS:
            raise InvalidMessage(f"unknown SendRequest flags {request.flags:#x}")
        topic = self._topics.resolve_send(request.topic, request.queue_id)
        topic_bytes = request.topic.encode()
        batch = self._store.commitlog.check_batch(frame.payload, topic_bytes, request.queue_id)
        if (
            batch is not None
            and len(batch.sizes) == request.record_count
            and batch.flags & FLAG_SEQUENCED
            and not batch.flags & _SPECIAL_FLAGS
        ):
            # An idempotent producer's batch: its sequences, not its ids, say what is new.
            self._transactions.producer_seen(request.producer_group, responder)
            ends = batch.ends
            records = [batch.data[a:b] for a, b in zip([0, *ends], ends, strict=False)]
            appended = self._append_sequenced(records, batch.msg_ids, batch, topic_bytes, request)
            self._role.appended()
            self._dispatch_soon()
            msg_ids = batch.msg_ids
        elif (
            batch is not None
            and len(batch.sizes) == request.record_count
            and not batch.flags & _SPECIAL_FLAGS
            and not (request.flags & SendRequest.FLAG_RETRY and self._any_stored(batch, topic))
        ):
            # The common send, and a retry none of whose ids is stored (every Spark write
            # sends so): checked in one pass, appended with one copy.
            self._transactions.producer_seen(request.producer_group, responder)
            appended = self._store.append(batch, wake_dispatcher=False)
            # The slaves' parked fetches are answered first, so the bytes a sync send
            # waits for are written out ahead of the indexing.
            self._role.appended()
            self._dispatch_soon()
            msg_ids = batch.msg_ids
        else:
            appended, msg_ids = self._append_records(responder, frame.payload, topic_bytes, request)
            self._role.appended()
        if self._topics.get(topic.name) is None:
            self._create_topic(topic)
        self._metrics.appended(topic.name, len(msg_ids), frame.payload.nbytes)
        if frame.is_one_way:
            return
        if request.flags & SendRequest.FLAG_NO_WAIT_STORE or not (self._sync or self._role.sync):
            responder.respond(self._response(frame.request_id, SendResponse.OK, appended, msg_ids))
        elif not self._sync:
            self._answer_when_replicated(responder, frame.request_id, appended, msg_ids)
        else:
            task = self._loop.create_task(
                self._answer_when_stored(responder, frame.request_id, appended, msg_ids)
            )
            self.inflight.add(task)
            task.add_done_callback(self.inflight.discard)

    def _answer_when_replicated(
        self, responder: Responder, request_id: int, appended: Appended, msg_ids: list[bytes]
    ) -> None:
        """Answer an ASYNC-flush send once its slaves hold it: called back by the
        replica set as the acknowledging fetch is handled, not by a task a turn later."""
        pending: asyncio.Future[None] = self._loop.create_future()

        def done(replicated: bool) -> None:
            if pending.done():
                return  # given up on at shutdown
            pending.set_result(None)
            self.inflight.discard(pending)
            status = SendResponse.OK
            if not replicated:
                self._metrics.replication_timeouts.inc()
                status = SendResponse.FLUSH_SLAVE_TIMEOUT
            responder.respond(self._response(request_id, status, appended, msg_ids))

        self.inflight.add(pending)
        self._role.when_replicated(appended.end, done)

    def _dispatch_soon(self) -> None:
        """Dispatch this loop turn's appends once their answers are written."""
        if not self._dispatch_scheduled:
            self._dispatch_scheduled = True
            self._loop.call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_scheduled = False
        self._store.dispatch_appended()

    def _append_records(
        self, responder: Responder, payload: memoryview, topic: bytes, request: SendRequest
    ) -> tuple[Appended, list[bytes]]:
        """The record-by-record send: delayed and half messages, retries that find an id
        stored, a first send to a topic, and any batch the one-pass check refused (the
        checks here say why)."""
        records: Sequence[Buffer]
        records, flags = split_records(payload, topic, request.queue_id, request.record_count)
        # Any process of a producer group may be asked how a half message of it ended.
        self._transactions.producer_seen(request.producer_group, responder)
        if flags & FLAG_TRANSACTION:
            records = to_half(records, request.producer_group)
        if flags & FLAG_DELAYED:
            records = divert(records, self._delay_policy)
        msg_ids = [bytes(r[_MSG_ID_AT:_MSG_ID_END]) for r in records]
        if flags & FLAG_SEQUENCED:
            if flags & _SPECIAL_FLAGS:
                raise InvalidMessage(
                    "a sequenced (idempotent) record cannot be delayed or a half message: "
                    "send those without a producer sequence"
                )
            return self._append_sequenced(records, msg_ids, None, topic, request), msg_ids
        if request.flags & SendRequest.FLAG_RETRY:
            return self._append_missing(records), msg_ids
        return self._store.append(records), msg_ids

    def _append_sequenced(
        self,
        records: Sequence[Buffer],
        msg_ids: list[bytes],
        batch: RecordBatch | None,
        topic: bytes,
        request: SendRequest,
    ) -> Appended:
        """Append what of an idempotent producer's batch is new; answer a re-sent part
        with where it was stored (the producer table remembers the last few runs of each
        producer and queue; older ones are answered :data:`UNPLACED`). A gap in the
        sequences is refused (SequenceGap, retriable)."""
        n = len(msg_ids)
        producer, epoch, first_seq = id_sequence(msg_ids[0])
        _, _, last_seq = id_sequence(msg_ids[-1])
        head = msg_ids[0][:8]
        if (
            last_seq != first_seq + n - 1
            or (batch is not None and not batch.flags_all & FLAG_SEQUENCED)
            or (batch is None and not all(r[_FLAGS_AT] & FLAG_SEQUENCED for r in records))
            or any(m[:8] != head for m in msg_ids)
        ):
            raise InvalidMessage(
                "a batch of sequenced records must be one producer's consecutive sequences "
                f"(first {first_seq}, last {last_seq}, {n} records), every record flagged "
                "sequenced"
            )
        store = self._store
        store.catch_up_dispatch()  # the table is fed by the dispatcher
        key = (producer, topic, request.queue_id)
        with store.dispatcher.lock:
            verdict = store.producers.check(key, epoch, first_seq, n)
        dup = verdict.duplicates
        if not dup:
            return store.append(batch if batch is not None else records, wake_dispatcher=False)
        self._metrics.deduplicated.inc(dup)
        fresh = store.append(records[dup:], wake_dispatcher=False) if dup < n else None
        queue = store.queues.get(topic, request.queue_id)
        cl_offsets: list[int] = []
        q_offsets: list[int] = []
        end = fresh.end if fresh is not None else 0
        for place in verdict.places:
            size = 0
            if place is not None and queue is not None and place >= queue.min_offset:
                cl, size, _ = queue.entry(place)
            if size:
                cl_offsets.append(cl)
                q_offsets.append(place)  # type: ignore[arg-type]
                end = max(end, cl + size)
            else:
                cl_offsets.append(UNPLACED)
                q_offsets.append(UNPLACED)
        if fresh is not None:
            cl_offsets += fresh.commitlog_offsets
            q_offsets += fresh.queue_offsets
        timestamp = fresh.store_timestamp_ms if fresh is not None else time.time_ns() // 1_000_000
        start = min((c for c in cl_offsets if c != UNPLACED), default=end)
        return Appended(start, end, cl_offsets, q_offsets, timestamp)

    def _any_stored(self, batch: RecordBatch, topic: TopicConfig) -> bool:
        """Does the store hold, within the de-dup window, any id of ``batch`` in its topic?

        The first try of a write sent with the retry flag finds none, and so keeps the
        one-pass append; a batch that finds one goes record by record
        (:meth:`_append_missing`), which looks each id up again. The index's hashes
        rule out most ids of the batch in one pass; only the few whose hash has an entry
        are looked up, reading records to tell a stored id from a hash collision.
        """
        store = self._store
        store.catch_up_dispatch()  # the id index is built by the dispatcher
        oldest = time.time_ns() // 1_000_000 - self._config.dedup_window_ms
        name = topic.name
        for position in store.index.maybe_stored(batch.msg_ids, oldest):
            stored = store.lookup_id(batch.msg_ids[position], name)
            if stored is not None and stored.store_timestamp_ms >= oldest:
                return True
        return False

    def _append_missing(self, records: Sequence[Buffer]) -> Appended:
        """A retried batch: append only the records not stored already; the answer lists
        every record where it is (the stored ones where they were put the first time).

        The message-id index is built by the dispatcher, so it is caught up first; the
        retry this serves is rare, the wait short. Records stored longer ago than
        ``dedup_window_ms`` count as not stored, and so do ids stored in another topic
        (a copy of messages into a new topic keeps their ids).
        """
        store = self._store
        store.catch_up_dispatch()
        oldest = time.time_ns() // 1_000_000 - self._config.dedup_window_ms
        found: list[Record | None] = []
        for raw in records:
            # Its topic as it will be stored (a delayed message's is the delay topic).
            topic = topic_of(raw)
            stored = store.lookup_id(bytes(raw[_MSG_ID_AT:_MSG_ID_END]), topic)
            found.append(stored if stored and stored.store_timestamp_ms >= oldest else None)
        missing = [raw for raw, stored in zip(records, found, strict=True) if stored is None]
        fresh = store.append(missing) if missing else None
        if fresh is not None and len(missing) == len(records):
            return fresh
        self._metrics.deduplicated.inc(len(records) - len(missing))
        cl_offsets: list[int] = []
        q_offsets: list[int] = []
        end = fresh.end if fresh is not None else 0
        placed = zip(fresh.commitlog_offsets, fresh.queue_offsets, strict=True) if fresh else ()
        new = iter(placed)
        for stored in found:
            if stored is None:
                cl, q = next(new)
            else:
                cl, q = stored.commitlog_offset, stored.queue_offset
                end = max(end, cl + stored.size)
            cl_offsets.append(cl)
            q_offsets.append(q)
        timestamp = fresh.store_timestamp_ms if fresh is not None else time.time_ns() // 1_000_000
        return Appended(cl_offsets[0], end, cl_offsets, q_offsets, timestamp)

    def _create_topic(self, topic: TopicConfig) -> None:
        try:
            self._topics.put(topic)
        except OSError:
            # The messages are stored; failing the send now would only make the producer
            # store them twice. The next send retries the creation.
            log.exception("auto-creating topic %s failed", topic.name)

    async def _answer_when_stored(
        self, responder: Responder, request_id: int, appended: Appended, msg_ids: list[bytes]
    ) -> None:
        """Answer once the flush mode and the replication mode are both satisfied."""
        status = SendResponse.OK
        if self._sync and not await self._durability.wait(appended.end, self._flush_timeout_s):
            self._metrics.flush_timeouts.inc()
            status = SendResponse.FLUSH_DISK_TIMEOUT
        if self._role.sync and not await self._role.wait_replicated(appended.end):
            self._metrics.replication_timeouts.inc()
            status = SendResponse.FLUSH_SLAVE_TIMEOUT
        responder.respond(self._response(request_id, status, appended, msg_ids))

    def _response(
        self,
        request_id: int,
        status: SendResponse.Status.ValueType,
        appended: Appended,
        msg_ids: list[bytes],
    ) -> list[Buffer]:
        answer = self._answer
        # Every field is assigned: nothing of the previous answer is left over.
        answer.status = status
        answer.queue_offsets[:] = appended.queue_offsets
        answer.commitlog_offsets[:] = appended.commitlog_offsets
        answer.msg_ids[:] = msg_ids
        answer.store_timestamp_ms = appended.store_timestamp_ms
        header = answer.SerializeToString()
        return encode_frame(FrameType.SEND, request_id, header, b"", FLAG_RESPONSE)
