"""The producer: sends messages to a topic's queues, discovered through the nameservers.

Guarantees first. A send that returns a :class:`~metaq.client.results.SendResult` was
stored by the master of the broker group it names, at the queue offset it names; its
``status`` says how durable it is (OK, or stored but FLUSH_DISK_TIMEOUT /
FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE). A send that raises may or may not have been
stored: a connection that drops or a request that times out after the broker took the
batch leaves that unknown, and the retry that follows can store the message twice.
Delivery is therefore at least once; the message id lets consumers deduplicate. An
``idempotent`` producer (Kafka's idempotent producer) numbers the records of each queue
and retries with the same numbers on the same queue: the broker stores a re-sent record
once, even on the slave promoted after its master died, and answers where it was stored.

Three parts, as in aiokafka:

- :class:`Producer` (this module) encodes records, picks queues, and owns the retry
  policy;
- :class:`~metaq.client.accumulator.Accumulator` coalesces concurrent sends to the same
  queue into one SEND frame — a lone send goes at once, sends that pile up while a batch
  is in flight wait at most ``linger_ms``;
- :class:`~metaq.client.sender.Sender` owns the connections (one per broker, pipelined)
  and resolves one future per batch.

Queue selection: round robin over the topic's writable queues, passing over broker
groups that failed or answered slowly a moment ago; or, with ``sharding_key``, a stable
hash of the key, so every message with that key lands in one queue, in send order. The
round robin is sticky (Kafka's KIP-480): a send joins the queue the previous one went to
while that queue's batch is still open (sent in the same loop turn, or held behind a
batch in flight), and moves on once the batch has gone, so a burst travels as one SEND
frame and one pull answer instead of one per queue.

Retries: a retriable failure (connection lost, timeout, NOT_MASTER, STORE_UNAVAILABLE,
BUSY, …) is retried up to ``retries`` times with jittered exponential back-off
(``tenacity``); the first retry goes at once, to another broker group, after refreshing
the route. Errors that are not retriable (unknown topic, invalid message, …) surface at
once with the broker's message. **A sharded send is never moved to another queue** —
that would break the order of its key — it is retried on the same queue only, and fails
if that queue's broker stays down. Retrying may reorder messages of one key relative to
sends made meanwhile; callers that need strict order send one message of a key at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_random_exponential

from metaq.client.accumulator import Accumulator, Batch
from metaq.client.connection import ConnectionPool
from metaq.client.errors import ConnectionLost, ProducerClosed, RequestTimeout
from metaq.client.identity import CLIENT_VERSION, LANGUAGE, new_client_id
from metaq.client.message import OutgoingMessage
from metaq.client.observe import Observer
from metaq.client.results import SendResult
from metaq.client.routes import RouteCache
from metaq.client.selection import BrokerHealth, QueueSelector, RoundRobinSelector, shard_queue
from metaq.client.sender import Sender
from metaq.client.trace import TraceDispatcher
from metaq.common import record
from metaq.common.errors import InvalidMessage, MetaqError
from metaq.common.framing import Buffer
from metaq.common.model import QueueRoute, TopicRoute
from metaq.common.names import check_group
from metaq.common.record import RecordEncoder, with_queue_id
from metaq.common.tls import TlsConfig
from metaq.common.users import Credentials, load_credentials
from metaq.common.v1.data_pb2 import ClientHello

log = logging.getLogger(__name__)

MIB: Final = 1024 * 1024
_T = TypeVar("_T")

_FLAGS: Final = record.FIELDS["flags"]
_ROUTE_REFRESH_SHARE_S: Final = 0.05
"""Failures within this long of a route fetch share it rather than fetch again."""


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """Producer settings; units in the names."""

    group: str = "DEFAULT_PRODUCER"
    compress_over_bytes: int = 4096
    """Bodies larger than this are zlib-compressed (FLAG_COMPRESSED) when that shrinks them."""
    compress_level: int = 5
    linger_ms: float = 2.0
    max_batch_records: int = 256
    max_batch_bytes: int = MIB
    max_in_flight_per_queue: int = 5
    max_message_bytes: int = 4 * MIB
    """Largest body (after compression) accepted; the broker's own limit may be lower."""
    send_timeout_s: float = 3.0
    retries: int = 2
    retry_backoff_s: float = 0.01
    retry_backoff_max_s: float = 1.0
    failure_isolation_s: float = 10.0
    route_refresh_interval_s: float = 30.0
    connect_timeout_s: float = 3.0
    close_timeout_s: float = 10.0
    wait_store: bool = True
    """False: the broker answers once appended, without waiting for a sync flush."""
    client_id: str = ""
    """Unique per producer instance, shown in admin views (``metaq connections``);
    generated (host@pid@random) when empty."""
    computer_room: str = ""
    """Where the producer runs, shown in admin views."""
    idempotent: bool = False
    """Send with a producer id and a sequence per queue (``record.FLAG_SEQUENCED``): a
    retry is stored once. Retries then stay on their queue, as a sharded send's do;
    delayed and half messages go without sequences."""
    answer_poll_us: int = 1000
    """How long the event loop polls for an answer instead of sleeping, while answers
    come back that quickly (:mod:`metaq.client.answer_poll`); 0 turns it off."""
    trace: bool = False
    """Write the trace of every message sent (:mod:`metaq.client.trace`): where it was
    stored, by whom, when; ``metaq trace MSG_ID`` shows it."""

    def validate(self) -> None:
        problems = []
        for name in ("max_batch_records", "max_batch_bytes", "max_in_flight_per_queue"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1")
        for name in ("linger_ms", "compress_over_bytes", "retries", "retry_backoff_s"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must not be negative")
        for name in ("send_timeout_s", "connect_timeout_s", "route_refresh_interval_s"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be positive")
        if not 0 <= self.compress_level <= 9:
            problems.append("compress_level must be 0-9")
        if not 0 <= self.answer_poll_us <= 10_000:
            problems.append("answer_poll_us must be 0-10000 (0 turns answer polling off)")
        try:
            check_group(self.group, "producer group")
        except InvalidMessage as exc:
            problems.append(str(exc))
        if problems:
            raise ValueError("invalid producer settings: " + "; ".join(problems))


def with_delay(
    properties: Mapping[str, str] | None, delay_level: int | None, deliver_at_ms: int | None
) -> dict[str, str]:
    """The properties that ask the broker for delayed delivery."""
    if delay_level is not None and deliver_at_ms is not None:
        raise InvalidMessage("give delay_level or deliver_at_ms, not both")
    out = dict(properties or {})
    if delay_level is not None:
        out[record.PROP_DELAY_LEVEL] = str(delay_level)
    else:
        out[record.PROP_DELIVER_AT] = str(deliver_at_ms)
    return out


def _retriable(exc: BaseException) -> bool:
    return isinstance(exc, MetaqError) and exc.retriable


class Producer:
    """Sends messages; see the module docstring for guarantees, batching and retries.

    ::

        async with Producer(["127.0.0.1:9876"]) as producer:
            result = await producer.send("orders", b"...", keys=("order-17",))

    Not thread-safe: use it from the event loop it was started on.
    """

    def __init__(
        self,
        nameservers: Sequence[str] | str,
        *,
        group: str = "DEFAULT_PRODUCER",
        compress_over_bytes: int = 4096,
        linger_ms: float = 2.0,
        max_batch_records: int = 256,
        max_batch_bytes: int = MIB,
        send_timeout_s: float = 3.0,
        retries: int = 2,
        client_id: str = "",
        computer_room: str = "",
        trace: bool = False,
        observers: Sequence[Observer] = (),
        queue_selector: QueueSelector | None = None,
        config: ProducerConfig | None = None,
        routes: RouteCache | None = None,
        access_key: str = "",
        secret_key: str = "",
        credentials: Credentials | None = None,
        tls: TlsConfig | None = None,
        idempotent: bool = False,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if config is None:
            config = ProducerConfig(
                group=group,
                compress_over_bytes=compress_over_bytes,
                linger_ms=linger_ms,
                max_batch_records=max_batch_records,
                max_batch_bytes=max_batch_bytes,
                send_timeout_s=send_timeout_s,
                retries=retries,
                client_id=client_id,
                computer_room=computer_room,
                trace=trace,
                idempotent=idempotent,
            )
        config.validate()
        self.config = config
        self.credentials = credentials or load_credentials(access_key, secret_key)
        """The user proved to brokers (else METAQ_ACCESS_KEY / METAQ_SECRET_KEY or
        METAQ_CREDENTIALS_FILE); None on a cluster without auth."""
        self.tls = tls
        """Set: nameservers and brokers are dialled over TLS (``metaq.common.tls``)."""
        self._owns_routes = routes is None
        self.routes = routes or RouteCache(
            [nameservers] if isinstance(nameservers, str) else nameservers,
            refresh_interval_s=config.route_refresh_interval_s,
            credentials=self.credentials,
            tls=tls,
        )
        self.selector: QueueSelector = queue_selector or RoundRobinSelector()
        self._sticky = queue_selector is None
        self._last: dict[str, tuple[TopicRoute, QueueRoute]] = {}
        """Per topic, the route and queue the last unkeyed send went to."""
        self.health = BrokerHealth(failure_isolation_s=config.failure_isolation_s, clock=clock)
        self._sleep = sleep
        self._encoder = RecordEncoder(
            compress_over_bytes=config.compress_over_bytes,
            compress_level=config.compress_level,
            max_message_bytes=config.max_message_bytes,
        )
        self.sequences = Sequences() if config.idempotent else None
        self._sender: Sender | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.client_id = config.client_id or new_client_id()
        self.trace: TraceDispatcher | None = (
            TraceDispatcher(self.routes, self.client_id) if config.trace else None
        )
        """Writes the trace of each message sent, with ``trace`` on."""
        self._observers: tuple[Observer, ...] = (
            (*observers, self.trace) if self.trace is not None else tuple(observers)
        )
        """Told of every send (their cost is theirs: none given, none paid)."""

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Start the route refresh and the sender. Routes are fetched on first use."""
        if self._sender is not None:
            return
        if self._closed:
            raise ProducerClosed("a closed producer cannot be started again")
        c = self.config
        accumulator = Accumulator(
            max_records=c.max_batch_records,
            max_bytes=c.max_batch_bytes,
            linger_s=c.linger_ms / 1000,
            max_in_flight=c.max_in_flight_per_queue,
        )
        pool = ConnectionPool(
            connect_timeout_s=c.connect_timeout_s, credentials=self.credentials, tls=self.tls
        )
        pool.hello = ClientHello(
            client_id=self.client_id,
            producer_group=c.group,
            computer_room=c.computer_room,
            client_version=CLIENT_VERSION,
            language=LANGUAGE,
        ).SerializeToString()
        self._sender = Sender(
            accumulator,
            pool,
            self.health,
            producer_group=c.group,
            timeout_s=c.send_timeout_s,
            wait_store=c.wait_store,
            answer_poll_us=c.answer_poll_us,
        )
        if self._owns_routes:
            await self.routes.start()

    async def flush(self) -> None:
        """Send what is held back by the linger now and wait for every answer."""
        if self._sender is not None:
            await self._sender.flush()

    async def close(self) -> None:
        """Send what is pending (for at most ``close_timeout_s``), then close everything.

        Sends still unanswered after that fail with ProducerClosed.
        """
        if self._closed:
            return
        self._closed = True
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.close_timeout_s):
                    await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._sender is not None:
            await self._sender.close(self.config.close_timeout_s)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.trace is not None:
            await self.trace.close()
        if self._owns_routes:
            await self.routes.stop()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    @property
    def sender(self) -> Sender:
        if self._sender is None or self._closed:
            raise ProducerClosed(
                "the producer is closed" if self._closed else "call start() before sending"
            )
        return self._sender

    # --- sending ----------------------------------------------------------------------

    async def send(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str = "",
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | bytes | None = None,
        delay_level: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> SendResult:
        """Send one message and wait for the broker's answer (retrying as configured).

        ``delay_level`` (1 for the broker's first delay level, "1s" by default) or
        ``deliver_at_ms`` (ms since the Unix epoch, at most 7 days ahead by default)
        holds the message back until then; the result then names its place in the
        broker's delay topic, not yet in ``topic``.

        Raises InvalidMessage for a message that cannot be sent as it is, UnknownTopic,
        and after the retries the last retriable error (BrokerError, ConnectionLost,
        RequestTimeout, NoNameServer, NoWritableQueue).
        """
        sending = self._send(
            topic, body, tags, keys, properties, sharding_key, delay_level, deliver_at_ms
        )
        if not self._observers:
            return await sending
        return (await self._watched(topic, self._listed(sending)))[0]

    async def _send(
        self,
        topic: str,
        body: bytes,
        tags: str,
        keys: Sequence[str],
        properties: Mapping[str, str] | None,
        sharding_key: str | bytes | None,
        delay_level: int | None,
        deliver_at_ms: int | None,
    ) -> SendResult:
        if delay_level is not None or deliver_at_ms is not None:
            properties = with_delay(properties, delay_level, deliver_at_ms)
        # The cached route without a coroutine of its own: this runs once per message.
        route = self._cached_writable(topic) or await self.writable_route(topic)
        queue, rec, waiter = self._append(route, body, tags, keys, properties, sharding_key)
        assert waiter is not None
        try:
            return await waiter
        except MetaqError as exc:
            if not exc.retriable or not self.config.retries:
                self._after_failure(topic, queue, exc)
                raise
            error = exc
        results = await self._retry(topic, [rec], queue, sharding_key is not None, error)
        return results[0]

    def send_async(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str = "",
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | bytes | None = None,
    ) -> asyncio.Future[SendResult]:
        """Queue one message; the future resolves as :meth:`send` would return or raise.

        The common case (route cached, no failure) costs one callback per message and no
        task; a retry runs as a task the producer owns and awaits on close.
        """
        out = self._send_async(topic, body, tags, keys, properties, sharding_key)
        if self._observers:
            self._watch(topic, out)
        return out

    def _send_async(
        self,
        topic: str,
        body: bytes,
        tags: str,
        keys: Sequence[str],
        properties: Mapping[str, str] | None,
        sharding_key: str | bytes | None,
    ) -> asyncio.Future[SendResult]:
        loop = asyncio.get_running_loop()
        out: asyncio.Future[SendResult] = loop.create_future()
        try:
            route = self._cached_writable(topic)
            if route is None:
                coro = self._send(topic, body, tags, keys, properties, sharding_key, None, None)
                self._spawn(self._into(out, coro))
                return out
            queue, rec, waiter = self._append(route, body, tags, keys, properties, sharding_key)
        except MetaqError as exc:
            out.set_exception(exc)
            return out
        assert waiter is not None
        sharded = sharding_key is not None

        def answered(done: asyncio.Future[SendResult]) -> None:
            if out.done():
                return
            exc = done.exception()
            if exc is None:
                out.set_result(done.result())
            elif not _retriable(exc) or not self.config.retries or self._closed:
                self._after_failure(topic, queue, exc)
                out.set_exception(exc)
            else:
                retry = self._retry(topic, [rec], queue, sharded, exc)
                self._spawn(self._into(out, self._first(retry)))

        waiter.add_done_callback(answered)
        return out

    async def send_oneway(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str = "",
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | bytes | None = None,
    ) -> None:
        """Queue one message without asking for an answer (not even an error).

        Returns once the message is queued; it may be lost without a trace (broker down,
        refused). No retries. For logs and metrics, where losing a few is acceptable.
        """
        route = await self.writable_route(topic)
        self._append(route, body, tags, keys, properties, sharding_key, one_way=True)

    async def send_batch(
        self,
        topic: str,
        messages: Sequence[OutgoingMessage | bytes],
        *,
        sharding_key: str | bytes | None = None,
    ) -> list[SendResult]:
        """Send many messages to one queue, as few SEND frames as the batch limits allow.

        The results are in the order of ``messages``. A retriable failure of one frame
        retries that frame on another queue (on the same queue with ``sharding_key``); if
        it still fails, the error is raised and earlier frames may have been stored.
        """
        if not self._observers:
            return await self._send_batch(topic, messages, sharding_key)
        return await self._watched(topic, self._send_batch(topic, messages, sharding_key))

    async def _send_batch(
        self,
        topic: str,
        messages: Sequence[OutgoingMessage | bytes],
        sharding_key: str | bytes | None,
    ) -> list[SendResult]:
        sender = self.sender
        if not messages:
            return []
        route = await self.writable_route(topic)
        queue = self._choose(route, sharding_key)
        c = self.config
        now = asyncio.get_running_loop().time()
        sequenced = None
        if self.sequences is not None and not any(
            not isinstance(m, (bytes, bytearray, memoryview))
            and record.property_flags(m.properties)
            for m in messages
        ):
            sequenced = (self.sequences.producer_id, self.sequences.take(queue, len(messages)))
        batches = [
            Batch.whole(topic, queue, [buf], count, now, first_id=first_id)
            for buf, count, first_id in self._encoder.encode_batch(
                topic,
                messages,
                queue.queue_id,
                max_records=c.max_batch_records,
                max_bytes=c.max_batch_bytes,
                sequenced=sequenced,
            )
        ]
        futures = [sender.submit(batch) for batch in batches]
        results: list[SendResult] = []
        sharded = sharding_key is not None or sequenced is not None
        try:
            for batch, future in zip(batches, futures, strict=True):
                results += await self._answer(batch, future, sharded)
        except BaseException:
            for future in futures:  # the caller hears of the first failure only
                future.add_done_callback(_retrieve)
            raise
        return results

    def send_encoded(
        self, topic: str, queue: QueueRoute, records: Buffer, count: int
    ) -> asyncio.Future[list[SendResult]]:
        """Send ``count`` records encoded by the caller (back to back in ``records``, each
        aimed at ``queue``, which comes from :meth:`writable_route`) as one SEND frame.

        For writers that encode in bulk and choose queues themselves (the Spark sink).
        The frame goes flagged as a retry, so the broker stores only the message ids it
        does not hold yet: sending the same records again, even from another process,
        stores nothing twice. A retriable failure is retried on the same queue, as a
        sharded send is; the future resolves with every record's result, in order.
        """
        loop = asyncio.get_running_loop()
        batch = Batch.whole(topic, queue, [records], count, loop.time(), retry=True)
        sent = self.sender.submit(batch)
        out: asyncio.Future[list[SendResult]] = loop.create_future()
        self._spawn(self._into(out, self._answer(batch, sent, sharded=True)))
        if self._observers:
            self._watch(topic, out)
        return out

    async def writable_route(self, topic: str) -> TopicRoute:
        """The route every send starts from: the cached one, fetched again (shared with
        concurrent sends) when it has no writable queue, as when it was cached while the
        topic's only group had no master and the new master may be routed by now.

        Raises UnknownTopic, InvalidMessage (a topic name that cannot be), NoNameServer.
        """
        route = self._cached_writable(topic)
        if route is None:
            record.check_topic(topic)
            route = await self.routes.route(topic, max_age_s=_ROUTE_REFRESH_SHARE_S)
        return route

    # --- internals --------------------------------------------------------------------

    async def _watched(self, topic: str, sending: Awaitable[list[SendResult]]) -> list[SendResult]:
        """``sending``'s results, each observer told of them (or of its failure)."""
        started_ms = int(time.time() * 1000)
        began = time.perf_counter()
        group = self.config.group
        try:
            results = await sending
        except Exception as exc:  # a cancelled send is the caller's doing, not a failure
            for observer in self._observers:
                observer.send_failed(group, topic, exc, time.perf_counter() - began)
            raise
        seconds = time.perf_counter() - began
        for observer in self._observers:
            observer.sent(group, topic, results, started_ms, seconds)
        return results

    def _watch(
        self, topic: str, sending: asyncio.Future[SendResult] | asyncio.Future[list[SendResult]]
    ) -> None:
        """:meth:`_watched` for a future the caller holds."""
        started_ms = int(time.time() * 1000)
        began = time.perf_counter()
        group = self.config.group

        def done(future: asyncio.Future[Any]) -> None:
            seconds = time.perf_counter() - began
            if future.cancelled():
                return
            exc = future.exception()
            for observer in self._observers:
                if exc is not None:
                    observer.send_failed(group, topic, exc, seconds)
                else:
                    result = future.result()
                    results = result if isinstance(result, list) else [result]
                    observer.sent(group, topic, results, started_ms, seconds)

        sending.add_done_callback(done)

    async def _listed(self, sending: Awaitable[SendResult]) -> list[SendResult]:
        return [await sending]

    def _cached_writable(self, topic: str) -> TopicRoute | None:
        """The cached route when it has a writable queue: the one place a send looks at
        the cache, so every kind of send refreshes a route the same way."""
        route = self.routes.cached(topic)
        return route if route is not None and route.write_queues else None

    def _append(
        self,
        route: TopicRoute,
        body: bytes,
        tags: str,
        keys: Sequence[str],
        properties: Mapping[str, str] | None,
        sharding_key: str | bytes | None,
        *,
        one_way: bool = False,
    ) -> tuple[QueueRoute, bytes, asyncio.Future[SendResult] | None]:
        """Choose a queue, encode one record for it and hand it to the sender."""
        sender = self.sender
        queue = self._choose(route, sharding_key)
        topic = route.topic
        sequences = self.sequences
        if sequences is None or one_way or record.property_flags(properties):
            rec = self._encoder.encode(topic, body, queue.queue_id, tags, keys, properties)
        else:
            msg_id = record.sequenced_id(
                sequences.producer_id, 0, queue.queue_id, sequences.take(queue, 1)
            )
            rec = self._encoder.encode(
                topic, body, queue.queue_id, tags, keys, properties,
                msg_id=msg_id, flags=record.FLAG_SEQUENCED,
            )  # fmt: skip
        return queue, rec, sender.append(topic, queue, rec, one_way=one_way)

    async def _answer(
        self, batch: Batch, sent: Awaitable[list[SendResult]], sharded: bool
    ) -> list[SendResult]:
        """The results of a batch the caller built, retried as configured."""
        try:
            return await sent
        except MetaqError as exc:
            if not exc.retriable or not self.config.retries:
                self._after_failure(batch.topic, batch.queue, exc)
                raise
            return await self._retry(
                batch.topic,
                batch.records,
                batch.queue,
                sharded,
                exc,
                count=batch.count,
                flagged=batch.retry,
            )

    def _after_failure(self, topic: str, queue: QueueRoute, exc: BaseException) -> None:
        """A retriable failure not retried here (``retries=0``) still means the route may
        be stale (a master died): the next send fetches it again."""
        self._sequence_lost()
        if _retriable(exc):
            self.routes.expect_change(topic, queue.broker_name, queue.address)
            self.routes.invalidate(topic)

    def _sequence_lost(self) -> None:
        """A sequenced send failed for good: its sequences may never be stored, and the
        broker would refuse every later one of the queue as a gap; a new producer id
        starts every queue's sequences afresh."""
        if self.sequences is not None:
            self.sequences.restart()

    def _choose(self, route: TopicRoute, sharding_key: str | bytes | None) -> QueueRoute:
        if sharding_key is not None:
            return shard_queue(route, sharding_key)
        if not self._sticky:
            return self.selector.select(route, self.health.isolated(route))
        last = self._last.get(route.topic)
        if (
            last is not None
            and last[0] is route
            and self.sender.accumulator.filling(route.topic, last[1])
        ):
            return last[1]
        queue = self.selector.select(route, self.health.isolated(route))
        self._last[route.topic] = (route, queue)
        return queue

    async def _retry(
        self,
        topic: str,
        records: Sequence[Buffer],
        failed: QueueRoute,
        sharded: bool,
        first_error: BaseException,
        *,
        count: int = 1,
        flagged: bool = False,
    ) -> list[SendResult]:
        """Retry a failed send: at once on another broker group, then with jittered
        exponential back-off, refreshing the route.

        A sharded send stays on its queue. A send whose first try may have been stored
        (a timeout, a lost connection) goes again flagged as a retry, so the broker
        answers for records it already has rather than storing them twice
        (de-duplication by message id); it stays on its broker group when that group is
        replicated (a failover brings it back, with the records its slaves copied), and
        moves on when the group is a lone broker (then a duplicate is possible).
        ``flagged`` records went flagged as a retry the first time and go so again.
        """
        unknown = isinstance(first_error, RequestTimeout) or (
            isinstance(first_error, ConnectionLost) and not first_error.never_sent
        )
        log.info("send to %s %s failed, retrying: %s", topic, failed, first_error)
        # A sequenced record's sequence belongs to its queue: it is retried there, and in
        # a batch of its own (the accumulator could put it behind later sequences).
        sequenced = bool(_flags_of(records[0]) & record.FLAG_SEQUENCED)
        sharded = sharded or sequenced
        flagged = flagged or sequenced
        try:
            return await self._retry_attempts(
                topic, records, failed, sharded, unknown, first_error, count=count,
                flagged=flagged,
            )  # fmt: skip
        except BaseException:
            self._sequence_lost()
            raise

    async def _retry_attempts(
        self,
        topic: str,
        records: Sequence[Buffer],
        failed: QueueRoute,
        sharded: bool,
        unknown: bool,
        first_error: BaseException,
        *,
        count: int,
        flagged: bool,
    ) -> list[SendResult]:
        c = self.config
        self.routes.expect_change(topic, failed.broker_name, failed.address)
        previous = failed
        observers = self._observers

        def retrying(state: RetryCallState) -> None:
            outcome = state.outcome
            error = outcome.exception() if outcome is not None else None
            for observer in observers:
                observer.send_retried(c.group, topic, error or first_error)

        policy = AsyncRetrying(
            before=retrying if observers else lambda _state: None,
            stop=stop_after_attempt(c.retries),
            wait=wait_random_exponential(multiplier=c.retry_backoff_s, max=c.retry_backoff_max_s),
            retry=retry_if_exception(_retriable),
            sleep=self._sleep,
            reraise=True,
        )
        async for attempt in policy:
            with attempt:
                route = await self.routes.route(topic, max_age_s=_ROUTE_REFRESH_SHARE_S)
                group = route.group(failed.broker_name)
                # Only a replicated group can take the retry after losing its master.
                stay = unknown and group is not None and len(group.addresses) > 1
                if sharded or stay:
                    # A group that is still routed (a slave, say, while a new master is
                    # elected) gets the retry; one that is gone entirely does not.
                    queue = _same_queue(route, failed)
                else:
                    avoid = self.health.isolated(route) | {previous.broker_name}
                    queue = self.selector.select(route, avoid)
                previous = queue
                # Copies: the failed request may still sit in a transport buffer.
                fresh = [with_queue_id(r, queue.queue_id) for r in records]
                if count == 1 and not (unknown or flagged):
                    waiter = self.sender.append(topic, queue, fresh[0])
                    assert waiter is not None
                    return [await waiter]
                now = asyncio.get_running_loop().time()
                return await self.sender.submit(
                    Batch.whole(topic, queue, fresh, count, now, retry=unknown or flagged)
                )
        raise AssertionError("unreachable: tenacity re-raises the last error")

    async def _first(self, retry: Awaitable[list[SendResult]]) -> SendResult:
        return (await retry)[0]

    async def _into(self, out: asyncio.Future[_T], coro: Awaitable[_T]) -> None:
        try:
            result = await coro
        except BaseException as exc:
            if not out.done():
                if isinstance(exc, asyncio.CancelledError):
                    out.set_exception(ProducerClosed("the producer closed during the send"))
                else:
                    out.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            if not out.done():
                out.set_result(result)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class Sequences:
    """An idempotent producer's id (random, 48 bits) and next sequence per queue."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self.producer_id = secrets.randbits(48)
        self._next: dict[tuple[str, int], int] = {}

    def take(self, queue: QueueRoute, count: int) -> int:
        """Take ``count`` sequences of ``queue``; return the first."""
        key = (queue.broker_name, queue.queue_id)
        first = self._next.get(key, 0)
        self._next[key] = first + count
        return first


def _flags_of(rec: Buffer) -> int:
    flags: int = _FLAGS.packer.unpack_from(rec, _FLAGS.offset)[0]
    return flags


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _same_queue(route: TopicRoute, queue: QueueRoute) -> QueueRoute:
    """The queue of ``route`` with the same broker group and id (its master may have
    moved); the old one when the route no longer has it writable."""
    for candidate in route.write_queues:
        if candidate.broker_name == queue.broker_name and candidate.queue_id == queue.queue_id:
            return candidate
    return queue
