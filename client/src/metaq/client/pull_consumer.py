"""The pull consumer: the data-plane consumer operations, with the application in charge.

:class:`PullConsumer` pulls from the queue and offset the caller names, and commits and
looks up the group's offsets on the broker that holds the queue; it keeps no position of
its own and runs no loops, so it is also the building block of the push consumer and the
admin commands. Every broker answer is a typed result; wrong offsets are statuses, not
errors (``docs/protocol.md``). Failures raise the connection's errors unchanged:
:class:`~metaq.client.errors.BrokerError` (with the broker's ``retriable`` flag),
``ConnectionLost`` and ``RequestTimeout`` (both retriable).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType

from metaq.client.connection import ConnectionPool
from metaq.client.malloc import keep_freed_memory
from metaq.client.message import Message, decode_messages
from metaq.client.routes import RouteCache
from metaq.client.tags import TagFilter
from metaq.common.errors import ErrorCode, MetaqError
from metaq.common.framing import FrameType
from metaq.common.model import QueueRoute
from metaq.common.names import check_group
from metaq.common.tls import TlsConfig
from metaq.common.users import Credentials, load_credentials
from metaq.common.v1.data_pb2 import (
    CommitOffsetRequest,
    LockQueuesRequest,
    LockQueuesResponse,
    PullRequest,
    PullResponse,
    QueryOffsetRequest,
    QueryOffsetResponse,
    QueueOffset,
    QueueRef,
)


class PullStatus(enum.Enum):
    """What a pull found; mirrors ``PullResponse.Status``."""

    FOUND = PullResponse.FOUND
    NO_MATCHED_MESSAGE = PullResponse.NO_MATCHED_MESSAGE
    """Entries were scanned but none matched the tags: continue at ``next_offset``."""
    NO_MESSAGE_IN_QUEUE = PullResponse.NO_MESSAGE_IN_QUEUE
    """The queue is empty (or does not exist yet)."""
    OFFSET_TOO_SMALL = PullResponse.OFFSET_TOO_SMALL
    """Below the queue's minimum (retention removed it): restart at ``next_offset``."""
    OFFSET_OVERFLOW_ONE = PullResponse.OFFSET_OVERFLOW_ONE
    """Exactly the queue's end: nothing new yet."""
    OFFSET_OVERFLOW_BADLY = PullResponse.OFFSET_OVERFLOW_BADLY
    """Past the queue's end: the offset is wrong; reset to ``next_offset`` (the end)."""
    OFFSET_MOVED = PullResponse.OFFSET_MOVED
    """The entry's bytes were deleted: restart at ``next_offset``."""
    OFFSET_RESET = PullResponse.OFFSET_RESET
    """An operator reset the group's offsets on the topic since the pull's
    ``reset_generation``: drop what is in flight, go on from ``next_offset`` under the
    result's ``reset_generation``."""


@dataclass(frozen=True, slots=True)
class PullResult:
    """One pull's answer: the messages found and where the next pull starts.

    ``messages`` are in queue order and already filtered by the pull's tags on the client
    too (tag hashes collide at the broker). ``next_offset`` covers every entry the broker
    scanned, filtered-out ones included. ``min_offset``/``max_offset`` are the queue's
    bounds ``[min, max)`` at the time of the answer.
    """

    status: PullStatus
    messages: list[Message]
    next_offset: int
    min_offset: int
    max_offset: int
    filtered: int = field(default=0)
    """Messages the broker returned that the client's tag check dropped."""
    reset_generation: int = field(default=0)
    """With OFFSET_RESET: the generation of the group's offsets now."""


@dataclass(frozen=True, slots=True)
class RawPullResult:
    """One pull's answer with its records undecoded: ``payload`` holds ``record_count``
    commitlog records back to back, exactly as stored (see :class:`PullResult`)."""

    status: PullStatus
    payload: memoryview
    record_count: int
    next_offset: int
    min_offset: int
    max_offset: int
    reset_generation: int = 0


@dataclass(frozen=True, slots=True)
class QueueOffsets:
    """A queue's bounds and, when asked, the group's position and a timestamp's offset."""

    min_offset: int
    max_offset: int
    committed: int | None
    """The group's next offset to consume; None when the group never committed here."""
    timestamp_offset: int | None = None
    reset_generation: int = 0
    """The generation of the group's offsets on the topic (moved on by each operator
    reset): a consumer starting from ``committed`` carries it on its pulls and commits,
    so a reset after that reaches it (OFFSET_RESET) instead of being undone."""

    @property
    def lag(self) -> int | None:
        """Messages the group has still to consume, when it committed an offset."""
        return None if self.committed is None else max(self.max_offset - self.committed, 0)


class PullConsumer:
    """Pull, commit and look up offsets for consumer group ``group``.

    Offsets are always **the next offset to consume** (one past the last message
    processed), as the broker stores them. With ``group`` empty the consumer belongs to
    no group: it pulls and looks up bounds only (RocketMQ's ``printMsg``), the brokers
    keep no trace of it, and a commit or a committed-offset lookup is refused. Use inside
    one event loop, as an async context manager or between :meth:`start` and
    :meth:`close`. ``routes`` and
    ``connections`` may be shared with other clients; the consumer closes only what it
    created itself.
    """

    def __init__(
        self,
        nameservers: Sequence[str],
        group: str,
        *,
        routes: RouteCache | None = None,
        connections: ConnectionPool | None = None,
        request_timeout_s: float = 5.0,
        access_key: str = "",
        secret_key: str = "",
        credentials: Credentials | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        if group:
            check_group(group)
        self.group = group
        self.request_timeout_s = request_timeout_s
        self._own_routes = routes is None
        self._own_connections = connections is None
        # Else METAQ_ACCESS_KEY / METAQ_SECRET_KEY or METAQ_CREDENTIALS_FILE.
        credentials = credentials or load_credentials(access_key, secret_key)
        if routes is None:
            routes = RouteCache(nameservers, credentials=credentials, tls=tls)
        self.routes = routes
        if connections is None:
            connections = ConnectionPool(credentials=credentials, tls=tls)
        self.connections = connections

    async def start(self) -> None:
        keep_freed_memory()
        if self._own_routes:
            await self.routes.start()

    async def close(self) -> None:
        if self._own_connections:
            await self.connections.close()
        if self._own_routes:
            await self.routes.stop()

    async def __aenter__(self) -> PullConsumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def queues(self, topic: str, *, refresh: bool = False) -> tuple[QueueRoute, ...]:
        """The topic's readable queues, sorted by (broker group, queue id)."""
        return (await self.routes.route(topic, refresh=refresh)).read_queues

    async def pull(
        self,
        topic: str,
        queue: QueueRoute,
        offset: int,
        max_messages: int = 32,
        timeout_s: float = 0.0,
        *,
        tags: TagFilter | str | Sequence[str] | None = None,
        max_bytes: int = 0,
        commit_offset: int | None = None,
        reset_generation: int | None = None,
    ) -> PullResult:
        """Read up to ``max_messages`` messages of ``queue`` from ``offset`` on.

        ``timeout_s`` > 0 is a long poll: when nothing is there yet, the broker holds the
        request until a message arrives or the time is up (capped by the broker's
        ``long_poll_max_ms``), and the answer comes within milliseconds of the send.
        ``commit_offset`` stores the group's offset for the queue in the same round trip.
        ``reset_generation`` (:attr:`QueueOffsets.reset_generation`) says where the
        position comes from: after a reset of the group's offsets since, the commit is
        not stored and the answer is OFFSET_RESET.
        """
        tag_filter = tags if isinstance(tags, TagFilter) else TagFilter.parse(tags)
        raw = await self.pull_records(
            topic, queue, offset, max_messages, timeout_s,
            tags=tag_filter, max_bytes=max_bytes, commit_offset=commit_offset,
            reset_generation=reset_generation,
        )  # fmt: skip
        status = raw.status
        messages: list[Message] = []
        filtered = 0
        if raw.record_count:
            messages = decode_messages(raw.payload)
            if tag_filter.tags is not None:
                decoded = len(messages)
                messages = [m for m in messages if tag_filter.matches(m.tags)]
                filtered = decoded - len(messages)
            if not messages and status is PullStatus.FOUND:
                status = PullStatus.NO_MATCHED_MESSAGE
        return PullResult(
            status,
            messages,
            raw.next_offset,
            raw.min_offset,
            raw.max_offset,
            filtered,
            raw.reset_generation,
        )

    async def pull_records(
        self,
        topic: str,
        queue: QueueRoute,
        offset: int,
        max_messages: int = 32,
        timeout_s: float = 0.0,
        *,
        tags: TagFilter | str | Sequence[str] | None = None,
        max_bytes: int = 0,
        commit_offset: int | None = None,
        reset_generation: int | None = None,
    ) -> RawPullResult:
        """:meth:`pull`, with the records left as the broker sent them: for readers that
        decode a whole payload at once (the Spark source builds Arrow columns from it).
        The caller checks CRCs and the tags itself (hashes collide at the broker)."""
        tag_filter = tags if isinstance(tags, TagFilter) else TagFilter.parse(tags)
        request = PullRequest(
            consumer_group=self.group,
            topic=topic,
            queue_id=queue.queue_id,
            offset=offset,
            max_messages=max_messages,
            max_bytes=max_bytes,
            tag_codes=tag_filter.codes,
            tag_expression=tag_filter.expression,
            long_poll_timeout_ms=round(timeout_s * 1000),
        )
        if commit_offset is not None:
            request.commit_offset = commit_offset
        if reset_generation is not None:
            request.reset_generation = reset_generation
        connection = await self.connections.get(await self._address(topic, queue))
        frame = await connection.request(
            FrameType.PULL,
            request.SerializeToString(),
            timeout_s=timeout_s + self.request_timeout_s,
        )
        header = PullResponse.FromString(frame.header)
        return RawPullResult(
            PullStatus(header.status),
            frame.payload,
            header.record_count,
            header.next_offset,
            header.min_offset,
            header.max_offset,
            header.reset_generation,
        )

    async def commit(self, topic: str, queue: QueueRoute, offset: int) -> None:
        """Store ``offset`` (the next to consume) as the group's position in the queue."""
        await self.commit_many(await self._address(topic, queue), [(topic, queue.queue_id, offset)])

    async def commit_many(
        self,
        address: str,
        offsets: Iterable[tuple[str, int, int]],
        *,
        reset_generations: Mapping[tuple[str, int], int] | None = None,
    ) -> None:
        """Store several (topic, queue id, offset) of queues held by the broker at
        ``address`` in one request; all or none are checked and taken. A queue with a
        ``reset_generations`` entry ((topic, queue id) -> :attr:`QueueOffsets.
        reset_generation`) is left as it is when the group's offsets on its topic were
        reset since: the commit would undo the reset."""
        generations = reset_generations or {}
        request = CommitOffsetRequest(
            consumer_group=self.group,
            offsets=[
                QueueOffset(topic=t, queue_id=q, offset=o, reset_generation=generations.get((t, q)))
                for t, q, o in offsets
            ],
        )
        connection = await self.connections.get(address)
        await connection.request(
            FrameType.COMMIT_OFFSET, request.SerializeToString(), timeout_s=self.request_timeout_s
        )

    async def lock(
        self,
        address: str,
        client_id: str,
        queues: Iterable[tuple[str, int]],
        *,
        unlock: bool = False,
        held: bool = False,
    ) -> tuple[set[tuple[str, int]], float]:
        """Lock (or renew, or release) queues of the broker at ``address`` for ordered
        consumption; returns the (topic, queue id) pairs held and the lock's time to live.
        ``held``: this client holds them under a lease it still counts valid, which a
        master that just took over renews (see LockQueuesRequest)."""
        request = LockQueuesRequest(
            consumer_group=self.group,
            client_id=client_id,
            queues=[QueueRef(topic=t, queue_id=q) for t, q in queues],
            unlock=unlock,
            held=held,
        )
        connection = await self.connections.get(address)
        reply = await connection.request(
            FrameType.LOCK_QUEUES, request.SerializeToString(), timeout_s=self.request_timeout_s
        )
        answer = LockQueuesResponse.FromString(reply.header)
        return {(q.topic, q.queue_id) for q in answer.locked}, answer.lock_ttl_ms / 1000

    async def query(
        self,
        topic: str,
        queue: QueueRoute,
        *,
        timestamp_ms: int | None = None,
        with_committed: bool = True,
    ) -> QueueOffsets:
        """The queue's bounds, the group's committed offset (unless ``with_committed``
        is off) and, with ``timestamp_ms``, the first offset stored at or after it."""
        request = QueryOffsetRequest(
            consumer_group=self.group if with_committed else "",
            topic=topic,
            queue_id=queue.queue_id,
        )
        if timestamp_ms is not None:
            request.timestamp_ms = timestamp_ms
        connection = await self.connections.get(await self._address(topic, queue))
        frame = await connection.request(
            FrameType.QUERY_OFFSET, request.SerializeToString(), timeout_s=self.request_timeout_s
        )
        answer = QueryOffsetResponse.FromString(frame.header)
        return QueueOffsets(
            min_offset=answer.min_offset,
            max_offset=answer.max_offset,
            committed=answer.committed_offset if answer.HasField("committed_offset") else None,
            timestamp_offset=(
                answer.timestamp_offset if answer.HasField("timestamp_offset") else None
            ),
            reset_generation=answer.reset_generation,
        )

    async def committed(self, topic: str, queue: QueueRoute) -> int | None:
        """The group's committed offset for the queue, None when it never committed."""
        return (await self.query(topic, queue)).committed

    async def offset_for_timestamp(self, topic: str, queue: QueueRoute, timestamp_ms: int) -> int:
        """The first offset of a message stored at or after ``timestamp_ms`` (ms since the
        epoch); the queue's end when every message is older."""
        answer = await self.query(topic, queue, timestamp_ms=timestamp_ms, with_committed=False)
        assert answer.timestamp_offset is not None, "the broker ignored timestamp_ms"
        return answer.timestamp_offset

    async def _address(self, topic: str, queue: QueueRoute) -> str:
        """The queue's broker address; looked up again when the route had none."""
        if queue.address:
            return queue.address
        route = await self.routes.route(topic, refresh=True)
        for known in route.read_queues:
            if (known.broker_name, known.queue_id) == (queue.broker_name, queue.queue_id):
                return known.address
        raise QueueNotRouted(topic, queue)


class QueueNotRouted(MetaqError):
    """A queue the caller named is not (or no longer) in its topic's route.

    Retriable: a broker group that just restarted or took the topic is routed again
    within a heartbeat, and a rebalance stops consuming queues that are gone for good.
    """

    retriable = True
    code = ErrorCode.UNKNOWN_TOPIC

    def __init__(self, topic: str, queue: QueueRoute) -> None:
        super().__init__(f"queue {queue} of topic {topic!r} is not in the topic's route")
        self.topic = topic
        self.queue = queue
