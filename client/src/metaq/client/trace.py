"""Message trace (RocketMQ's msgTrace): where one message went, written as it goes.

A producer or push consumer made with ``trace=True`` reports, for every message it sends
or handles, a :class:`TraceEvent`: ``send`` (producer group, client, host, the broker
group, queue and offset that stored it, the store time and the send's latency),
``consume`` (consumer group, client, host, attempt, outcome, handler time) and, when a
handler failed, ``retry`` or ``dlq`` (the topic the message was sent back to). Events
go to the system topic :data:`~metaq.common.names.TRACE_TOPIC`, the events of up to
:data:`EVENTS_PER_RECORD` messages in a record (as RocketMQ packs its trace contexts),
keyed by their message ids (the original id for a retried copy), so the brokers' key
index finds every event of a message: :meth:`metaq.client.admin.Admin.message_trace`, ``metaq trace
MSG_ID`` and the console's message page read them back.

Off the send path: :class:`TraceDispatcher` only appends an event to a bounded queue;
a background service sends what piled up every ``interval_s`` (sooner once a batch is
full), as one SEND frame per broker, to the master of the broker group the message went
through. Tracing never fails nor slows a user's send: a full queue drops the oldest
events, and a trace write that fails is dropped; both are counted (``dropped``) and
logged.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import time
from collections.abc import Iterable, Sequence
from typing import Final

import msgspec

from metaq.client.connection import ConnectionPool
from metaq.client.handlers import ReconsumeLater
from metaq.client.message import Message
from metaq.client.observe import Observer
from metaq.client.results import SendResult
from metaq.client.retry import PROP_ORIGIN_MSG_ID, PROP_RETRY_TOPIC
from metaq.client.routes import RouteCache
from metaq.common import record
from metaq.common.framing import FrameType
from metaq.common.log_limit import Repeated
from metaq.common.names import DLQ_PREFIX, TRACE_TOPIC
from metaq.common.service import PeriodicService
from metaq.common.v1.data_pb2 import SendRequest, SendResponse

log = logging.getLogger(__name__)

SEND: Final = "send"
CONSUME: Final = "consume"
RETRY: Final = "retry"
DLQ: Final = "dlq"
KINDS: Final = (SEND, CONSUME, RETRY, DLQ)
"""Event kinds, also the trace records' tags, in the order a message meets them."""

HOST: Final = socket.gethostname()
EVENTS_PER_RECORD: Final = (record.MAX_KEYS_BYTES + 1) // 33
"""Messages whose events share one trace record: as many ids (32 hex digits and a
separator each) as a record's keys hold."""


class TraceEvent(msgspec.Struct, frozen=True, omit_defaults=True):
    """One step of one message; the body of one trace record (JSON).

    ``msg_id`` is always the id the producer's send returned, also for a retried copy
    (which has an id of its own). ``status`` is the send's status (``OK``, …) or the
    handler's outcome (``ok``, ``failed``, ``later``); ``attempt`` the handler call
    (1 for the first delivery, 2 for the first retry, …); ``via`` the topic the consumer
    pulled it from (the group's retry topic for a retry), or the topic a ``retry`` or
    ``dlq`` step sent it to.
    """

    kind: str
    msg_id: str
    topic: str
    group: str
    client_id: str
    host: str
    time_ms: int
    cost_ms: float = 0.0
    broker: str = ""
    queue_id: int = -1
    queue_offset: int = -1
    store_ms: int = 0
    status: str = ""
    attempt: int = 0
    via: str = ""
    error: str = ""


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(list[TraceEvent]).decode


def trace_records(events: Sequence[TraceEvent]) -> list[bytearray]:
    """The records of ``events`` in the trace topic: a JSON array of events per record,
    keyed by the ids of the messages it has events of (at most
    :data:`EVENTS_PER_RECORD`)."""
    records = []
    held: dict[str, None] = {}
    batch: list[TraceEvent] = []
    for event in events:
        if event.msg_id not in held and len(held) == EVENTS_PER_RECORD:
            records.append(record.encode(TRACE_TOPIC, _encode(batch), keys=tuple(held)))
            held, batch = {}, []
        held[event.msg_id] = None
        batch.append(event)
    if batch:
        records.append(record.encode(TRACE_TOPIC, _encode(batch), keys=tuple(held)))
    return records


def decode_events(msg_id: str, bodies: Iterable[bytes | str]) -> list[TraceEvent]:
    """The events of ``msg_id`` in trace record bodies, oldest first (bodies that are not
    trace records are skipped)."""
    events = []
    for body in bodies:
        try:
            events += [e for e in _decode(body) if e.msg_id == msg_id]
        except msgspec.DecodeError:
            continue
    order = {kind: n for n, kind in enumerate(KINDS)}
    events.sort(key=lambda e: (e.time_ms, order.get(e.kind, len(KINDS))))
    return events


def _outcome(error: BaseException | None) -> str:
    if error is None:
        return "ok"
    return "later" if isinstance(error, ReconsumeLater) else "failed"


class TraceDispatcher(Observer):
    """Queues trace events and writes them in batches in the background (module doc)."""

    def __init__(
        self,
        routes: RouteCache,
        client_id: str,
        *,
        connections: ConnectionPool | None = None,
        max_pending: int = 20_000,
        batch_records: int = 256,
        interval_s: float = 0.1,
        timeout_s: float = 3.0,
        close_timeout_s: float = 3.0,
    ) -> None:
        self.client_id = client_id
        self.dropped = 0
        """Events lost: the queue was full, or their write failed."""
        self.written = 0
        self._routes = routes
        self._connections = connections or ConnectionPool(
            credentials=routes.credentials, tls=routes.tls
        )
        self._pending: collections.deque[tuple[TraceEvent, str, str]] = collections.deque(
            maxlen=max_pending
        )
        self._batch = batch_records
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._close_timeout_s = close_timeout_s
        self._service: _Flusher | None = None
        self._closed = False
        self._losses = Repeated(log, "message trace events lost")

    # --- observing (synchronous, cheap) -----------------------------------------------

    def sent(
        self, group: str, topic: str, results: Sequence[SendResult], started_ms: int, seconds: float
    ) -> None:
        if topic == TRACE_TOPIC:
            return
        cost = round(seconds * 1000, 3)
        for r in results:
            event = TraceEvent(
                SEND, r.msg_id, topic, group, self.client_id, HOST, started_ms, cost,
                r.broker, r.queue_id, r.queue_offset, r.store_timestamp_ms, r.status.value,
            )  # fmt: skip
            self._add(event, topic, r.broker)

    def consumed(
        self,
        group: str,
        broker: str,
        message: Message,
        error: BaseException | None,
        started_ms: int,
        seconds: float,
    ) -> None:
        if message.topic == TRACE_TOPIC:
            return
        props = message.properties
        event = TraceEvent(
            CONSUME,
            props.get(PROP_ORIGIN_MSG_ID) or message.msg_id,
            props.get(PROP_RETRY_TOPIC) or message.topic,
            group, self.client_id, HOST, started_ms, round(seconds * 1000, 3), broker,
            message.queue_id, message.queue_offset, message.store_timestamp_ms,
            _outcome(error), message.reconsume_times + 1, message.topic,
            "" if error is None else repr(error)[:200],
        )  # fmt: skip
        self._add(event, message.topic, broker)

    def sent_back(self, group: str, broker: str, message: Message, target: str) -> None:
        props = message.properties
        event = TraceEvent(
            DLQ if target.startswith(DLQ_PREFIX) else RETRY,
            props.get(PROP_ORIGIN_MSG_ID) or message.msg_id,
            props.get(PROP_RETRY_TOPIC) or message.topic,
            group, self.client_id, HOST, int(time.time() * 1000), broker=broker,
            attempt=message.reconsume_times + 1, via=target,
        )  # fmt: skip
        self._add(event, message.topic, broker)

    def _add(self, event: TraceEvent, topic: str, broker: str) -> None:
        if self._closed:
            return
        pending = self._pending
        if len(pending) == pending.maxlen:
            self._lost(1, "the queue of events to write is full")  # the deque drops the oldest
        pending.append((event, topic, broker))
        if self._service is None:
            self._service = _Flusher(self._interval_s, self)
            self._service.start()
        elif len(pending) >= self._batch:
            self._service.wakeup()

    # --- writing (background) ---------------------------------------------------------

    async def flush(self) -> None:
        """Write every queued event now."""
        while self._pending:
            count = min(self._batch, len(self._pending))
            batch = [self._pending.popleft() for _ in range(count)]
            by_address: dict[str, list[TraceEvent]] = collections.defaultdict(list)
            addresses: dict[tuple[str, str], str] = {}
            for event, topic, broker in batch:
                address = addresses.get((topic, broker))
                if address is None:
                    address = addresses[(topic, broker)] = await self._address(topic, broker)
                if address:
                    by_address[address].append(event)
                else:
                    self._lost(1, f"no master to write the trace of {topic} to")
            await asyncio.gather(*(self._write(a, events) for a, events in by_address.items()))

    async def _address(self, topic: str, broker: str) -> str:
        """The master of ``broker`` (else of any group of ``topic``): where the trace of a
        message of ``topic`` stored by ``broker`` goes."""
        route = self._routes.cached(topic)
        if route is None:
            try:
                route = await self._routes.route(topic)
            except Exception:
                return ""
        group = route.group(broker)
        if group is not None and group.master_address:
            return group.master_address
        return next((g.master_address for g in route.groups if g.master_address), "")

    async def _write(self, address: str, events: list[TraceEvent]) -> None:
        records = trace_records(events)
        header = SendRequest(
            topic=TRACE_TOPIC, queue_id=0, record_count=len(records)
        ).SerializeToString()
        try:
            connection = await self._connections.get(address)
            reply = await connection.request(
                FrameType.SEND, header, records, timeout_s=self._timeout_s
            )
            SendResponse.FromString(reply.header)  # any status means stored
        except Exception as exc:
            self._lost(len(events), f"writing to {address} failed: {exc}")
            return
        self.written += len(events)
        self._losses.ended()

    def _lost(self, count: int, why: str) -> None:
        self.dropped += count
        self._losses.happened(f"{count} events: {why}")

    async def close(self) -> None:
        """Write what is queued (for at most ``close_timeout_s``), then stop."""
        self._closed = True
        service, self._service = self._service, None
        if service is not None:
            await service.stop()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._close_timeout_s):
                await self.flush()
        if self._pending:
            self._lost(len(self._pending), "the client closed first")
            self._pending.clear()
        await self._connections.close()


class _Flusher(PeriodicService):
    name = "metaq-trace-dispatcher"

    def __init__(self, interval_s: float, dispatcher: TraceDispatcher) -> None:
        super().__init__(interval_s)
        self._dispatcher = dispatcher

    async def run_once(self) -> None:
        await self._dispatcher.flush()
