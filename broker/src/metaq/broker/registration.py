"""Registration with the nameservers: one heartbeat session per nameserver, each on its own.

A broker registers with every nameserver (they never talk to each other). For each one,
:class:`NameServerRegistrar` holds a ``NameServer.Session`` stream open and sends a
heartbeat every ``interval_s``, or as seldom as that nameserver's answers ask
(``heartbeat_interval_ms``: the controller's leader wants a master's beat at full rate,
the others a slower standby beat), and at once whenever the broker's state changes: the
broker's state, plus its topic table first, then whenever the table changed since the
last heartbeat the session acknowledged, only what changed (to a nameserver that says it
takes changes; the whole table to one that does not), so a create costs the same however
many topics the broker serves. The nameserver answers each heartbeat; its answer
advertises the broker expiry, and the registrar heartbeats at least three times within
it whatever ``interval_s`` and the nameserver say.

Because the broker is registered through an open stream, a broker process that dies
leaves the routes at once: its connections drop and each nameserver ends its session.
A heartbeat not answered within ``ack_timeout_s`` (a stopped or partitioned nameserver)
ends the session from this side. A nameserver that fails or cannot be reached is retried
with exponential back-off and jitter (``tenacity``), each on its own task and channel, so
one failing nameserver never holds up the others. :meth:`NameServerRegistrar.stop` ends
the sessions and unregisters from every nameserver that answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type
from tenacity.wait import wait_random_exponential

from metaq.common.auth import ClusterSecret, call_metadata, session_identity, session_metadata
from metaq.common.model import BrokerState, TopicChanges, TopicConfig
from metaq.common.server_names import target_of
from metaq.common.service import cancel_and_wait
from metaq.common.tls import TlsConfig, grpc_channel
from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1 import control_pb2_grpc

log = logging.getLogger(__name__)


class TopicSource(Protocol):
    """A topic table as the registrar reads it: whole, or what changed since a version."""

    @property
    def version(self) -> int:
        """Grows with every change."""
        ...

    def all(self) -> list[TopicConfig]: ...

    def changes_since(self, version: int) -> TopicChanges | None:
        """What changed after ``version``; None when unknown (the whole table is sent)."""
        ...


@dataclass(frozen=True, slots=True)
class FixedTopics:
    """A topic table that never changes (tools and tests that register a broker)."""

    topics: tuple[TopicConfig, ...] = ()
    version: int = 0

    def all(self) -> list[TopicConfig]:
        return list(self.topics)

    def changes_since(self, version: int) -> TopicChanges | None:
        return TopicChanges() if version == self.version else None


@dataclass(frozen=True, slots=True)
class BrokerDescription:
    """What the broker tells the nameservers, asked for at every heartbeat: its state and
    its topic table.

    Return the same ``topics`` source while it describes the same table: another source
    is sent whole.
    """

    state: BrokerState
    topics: TopicSource = FixedTopics()
    acl_version: int | None = None
    """The version of the ACL the broker enforces; None when it enforces none."""


def heartbeat(
    description: BrokerDescription,
    *,
    with_topics: bool,
    changes: TopicChanges | None = None,
) -> pb.BrokerHeartbeat:
    """The heartbeat for ``description``: with the whole topic table (``with_topics``),
    or with ``changes`` to the table the nameserver holds, or with neither."""
    message = pb.BrokerHeartbeat(broker=description.state.to_proto())
    if description.acl_version is not None:
        message.acl_version = description.acl_version
    if with_topics:
        message.topic_table.SetInParent()  # present even when empty: "no topics"
        message.topic_table.topics.extend(t.to_proto() for t in description.topics.all())
    elif changes:
        message.topic_changes.CopyFrom(changes.to_proto())
    return message


def beat_interval_s(own_s: float, registered: pb.RegisterBrokerResponse) -> float:
    """How long to wait between heartbeats to the nameserver that sent ``registered``:
    as long as it asks (never less than ``own_s``, the broker's interval), and at most a
    third of the broker expiry it advertises, whatever either says."""
    expiry_s = registered.broker_expiry_ms / 1000
    ceiling = expiry_s / 3 if expiry_s > 0 else own_s
    return min(max(own_s, registered.heartbeat_interval_ms / 1000), ceiling)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return str(exc) or type(exc).__name__


class SessionEnded(Exception):
    """The nameserver closed the session stream without an error status."""


class _Link:
    """The session with one nameserver: one task, one channel at a time, retried forever."""

    def __init__(self, address: str, registrar: NameServerRegistrar) -> None:
        self.address = address
        self.connected = False
        self.takes_changes = False
        """The nameserver said it applies topic changes (else it gets whole tables)."""
        self._registrar = registrar
        self._wake = asyncio.Event()
        self._interval_s = registrar.interval_s
        self._task: asyncio.Task[None] | None = None
        self._sequences = itertools.count(1)

    def _sequence(self) -> int:
        return next(self._sequences)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"nameserver-session {self.address}"
        )
        self._task.add_done_callback(self._report_death)

    def _report_death(self, task: asyncio.Task[None]) -> None:
        # _run only ends by cancellation; anything else is a bug that stop() re-raises.
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "session task for nameserver %s died; this broker no longer registers there",
                self.address,
                exc_info=task.exception(),
            )

    def wakeup(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def unregister(self, broker_name: str, broker_id: int, timeout_s: float) -> None:
        request = pb.UnregisterBrokerRequest(broker_name=broker_name, broker_id=broker_id)
        body = request.SerializeToString(deterministic=True)
        metadata = call_metadata(
            self._registrar.secret, "UnregisterBroker", target_of(self.address), body, time.time()
        )
        try:
            async with grpc_channel(self.address, self._registrar.tls) as channel:
                stub = control_pb2_grpc.NameServerStub(channel)
                await stub.UnregisterBroker(request, timeout=timeout_s, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            log.info("could not unregister from nameserver %s: %s", self.address, _reason(exc))

    async def _run(self) -> None:
        registrar = self._registrar
        while True:
            # A fresh back-off after every session that was up, so a nameserver that comes
            # back is found again within the first steps.
            retrying = AsyncRetrying(
                retry=retry_if_exception_type(Exception),
                # Full jitter: brokers that lost the same nameserver do not come back in step.
                wait=wait_random_exponential(
                    multiplier=registrar.initial_backoff_s, max=registrar.max_backoff_s
                ),
                before_sleep=self._log_retry,
            )
            async for attempt in retrying:
                with attempt:
                    await self._session()

    def _log_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        sleep = state.next_action.sleep if state.next_action else 0.0
        log.warning(
            "nameserver %s: %s; retrying in %.2f s",
            self.address,
            _reason(exc) if exc else "failed",
            sleep,
        )

    async def _session(self) -> None:
        """One session; raises if it never came up, returns once an established one is lost.

        Events are read by a task of their own: besides the answer to each heartbeat, the
        nameserver sends news unasked (the controller moved the group's master), and
        those must reach the broker at once, not at its next heartbeat.
        """
        registrar = self._registrar
        established = False
        answered = asyncio.Event()
        try:
            async with grpc_channel(self.address, registrar.tls) as channel:
                # The proof names this broker: the stream can register no other.
                me = registrar.describe().state
                identity = session_identity(
                    me.cluster, me.broker_name, me.broker_id, me.data_address
                )
                metadata = session_metadata(
                    registrar.secret, target_of(self.address), identity, time.time()
                )
                call = control_pb2_grpc.NameServerStub(channel).Session(metadata=metadata)

                # When each unanswered heartbeat was sent (monotonic), by sequence.
                sent_at: dict[int, float] = {}

                async def read_events() -> None:
                    while True:
                        event = await call.read()
                        if not isinstance(event, pb.SessionEvent):  # grpc.aio.EOF
                            raise SessionEnded(f"nameserver {self.address} ended the session")
                        answered.set()
                        self._follow(event.registered)
                        if event.answers:
                            self.takes_changes = event.registered.takes_topic_changes
                        asked = sent_at.pop(event.answers, None) if event.answers else None
                        registrar.on_answer(event.registered, asked)

                reader = asyncio.get_running_loop().create_task(read_events())
                # The table the nameserver holds for this session: its source and version.
                sent: TopicSource | None = None
                sent_version = -1
                try:
                    while True:
                        description = registrar.describe()
                        topics, version = description.topics, description.topics.version
                        whole, changes = topics is not sent, None
                        if not whole and version != sent_version:
                            if self.takes_changes:
                                changes = topics.changes_since(sent_version)
                            whole = changes is None
                        answered.clear()
                        message = heartbeat(description, with_topics=whole, changes=changes)
                        message.sequence = sequence = self._sequence()
                        sent_at[sequence] = time.monotonic()
                        async with asyncio.timeout(registrar.ack_timeout_s):
                            await call.write(message)
                            await _first(answered.wait(), reader)
                        sent, sent_version = topics, version
                        if not established:
                            established = self.connected = True
                            log.info("registered with nameserver %s", self.address)
                        await self._pause(reader)
                finally:
                    self.connected = False
                    reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await reader
                    call.cancel()
        except Exception as exc:
            if not established:
                raise
            log.warning("session with nameserver %s lost (%s)", self.address, _reason(exc))

    def _follow(self, registered: pb.RegisterBrokerResponse) -> None:
        interval_s = beat_interval_s(self._registrar.interval_s, registered)
        if interval_s < self._interval_s:
            self._wake.set()  # asked for more (a new controller leader): beat now
        self._interval_s = interval_s

    async def _pause(self, reader: asyncio.Task[None]) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._interval_s):
                await _first(self._wake.wait(), reader)
        self._wake.clear()


async def _first(wait: Coroutine[Any, Any, object], reader: asyncio.Task[None]) -> None:
    """Await ``wait``, but raise at once if the event reader failed (the session broke)."""
    waiter = asyncio.ensure_future(wait)
    try:
        await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if reader.done():
        reader.result()
        raise SessionEnded("the session's event stream ended")


class NameServerRegistrar:
    """Keeps this broker registered with every nameserver in ``addresses`` (host:port).

    ``describe`` is called for every heartbeat, on the event loop, so it must be quick and
    must not block; ``on_answer`` gets every event each nameserver sends, on the event
    loop too, with the monotonic time the heartbeat it answers was sent (None for news
    sent unasked). :meth:`start` returns at once; registration proceeds in
    the background and ``connected`` tells which nameservers acknowledged it. With
    ``secret``, every session and unregistration proves the cluster secret.
    :meth:`refresh` sends a heartbeat now (e.g. right after a topic was created) instead
    of at the next interval.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        describe: Callable[[], BrokerDescription],
        interval_s: float = 2.0,
        *,
        on_answer: Callable[[pb.RegisterBrokerResponse, float | None], None] | None = None,
        ack_timeout_s: float | None = None,
        initial_backoff_s: float = 0.1,
        # At most this long between attempts: a nameserver that returns has its brokers
        # back, and routes whole, within a few seconds (the chaos suite promises 5).
        max_backoff_s: float = 2.0,
        unregister_timeout_s: float = 1.0,
        secret: ClusterSecret | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("need at least one nameserver address")
        if len(set(addresses)) != len(addresses):
            raise ValueError(f"nameserver addresses listed twice: {list(addresses)}")
        if interval_s <= 0 or max_backoff_s <= 0 or initial_backoff_s <= 0:
            raise ValueError("interval_s and the back-off times must be positive")
        self.addresses = tuple(addresses)
        self.describe = describe
        self.on_answer = on_answer or (lambda _registered, _sent_at: None)
        self.interval_s = interval_s
        self.ack_timeout_s = ack_timeout_s if ack_timeout_s is not None else 3 * interval_s
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.unregister_timeout_s = unregister_timeout_s
        self.secret = secret
        """Proven on every session and unregistration (nameservers with one require it)."""
        self.tls = tls
        """How the nameservers are dialled (None: plain gRPC)."""
        self._links: list[_Link] = []

    @property
    def connected(self) -> frozenset[str]:
        """The nameservers whose session acknowledged this broker and is still up."""
        return frozenset(link.address for link in self._links if link.connected)

    async def start(self) -> None:
        if self._links:
            raise RuntimeError("the registrar is already started")
        self._links = [_Link(address, self) for address in self.addresses]
        for link in self._links:
            link.start()

    def refresh(self) -> None:
        for link in self._links:
            link.wakeup()

    async def stop(self) -> None:
        """End every session, then unregister from each nameserver that answers in time."""
        links, self._links = self._links, []
        await asyncio.gather(*(link.stop() for link in links))
        if not links:
            return
        me = self.describe().state
        await asyncio.gather(
            *(
                link.unregister(me.broker_name, me.broker_id, self.unregister_timeout_s)
                for link in links
            )
        )
