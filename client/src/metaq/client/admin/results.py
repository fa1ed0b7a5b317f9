"""What :class:`~metaq.client.admin.Admin` returns: typed views of the brokers' admin
answers and of the operations it composes.

The brokers' JSON is decoded with msgspec into these structs (unknown keys are ignored, so
a newer broker's extra fields do not break an older client); ``to_json`` gives back the
broker's own shape, key for key, for tools that print it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import msgspec

from metaq.client.pull_consumer import QueueOffsets
from metaq.client.trace import TraceEvent
from metaq.common.model import GroupControl, QueueRoute

MIN_QUEUES: Final = 1
MAX_QUEUES: Final = 1024
"""The queue counts a topic may have (per broker group)."""

MetricSamples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""Every sample of a broker's /metrics: {(name, sorted (label, value) pairs): value}."""


class TopicSettings(msgspec.Struct, frozen=True):
    """A topic's settings on one broker group, as its broker keeps them.

    ``perm`` is the broker's spelling: read-write, read, write, write-wipe.
    """

    read_queues: int = 8
    write_queues: int = 8
    perm: str = "read-write"
    ordered: bool = False

    def to_json(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)


class TopicListing(msgspec.Struct, frozen=True):
    """One topic on one broker group (``Admin.list_topics``)."""

    topic: str
    group: str
    settings: TopicSettings


class StoredMessage(msgspec.Struct, frozen=True):
    """A stored message as a broker's message lookups answer it: body inflated, as text
    when it is UTF-8 (``body_encoding`` "text"), else base64 ("base64")."""

    broker_name: str
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    msg_id: str
    born_timestamp_ms: int
    store_timestamp_ms: int
    tags: str
    keys: list[str]
    properties: dict[str, str]
    flags: int
    compressed: bool
    size: int
    body: str
    body_encoding: str

    def to_json(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)


class MessageTrace(msgspec.Struct, frozen=True):
    """Where one message went (:meth:`Admin.message_trace
    <metaq.client.admin.Admin.message_trace>`): the message as stored (None when no
    broker holds it any more), and the trace events clients with tracing on wrote for it,
    oldest first."""

    msg_id: str
    message: StoredMessage | None
    events: list[TraceEvent]
    problems: list[str] = msgspec.field(default_factory=list)
    """What could not be asked (the message itself, or the trace topic)."""

    def to_json(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


class TopicRate(msgspec.Struct, frozen=True):
    """A topic's messages in (sent) and out (pulled): so far, and per second over the
    stats window."""

    topic: str
    in_total: int = 0
    out_total: int = 0
    in_tps: float = 0.0
    out_tps: float = 0.0


class GroupRate(msgspec.Struct, frozen=True):
    """A consumer group's messages pulled and acknowledged (its commits' advance) on one
    topic: so far, and per second over the stats window."""

    group: str
    topic: str
    pulled_total: int = 0
    acked_total: int = 0
    pulled_tps: float = 0.0
    acked_tps: float = 0.0


class TrafficStats(msgspec.Struct, frozen=True):
    """In and out traffic per topic and per consumer group (RocketMQ's ``statsAll``), of
    one broker or summed over a cluster's brokers. Totals count since each broker
    started; rates are over the last ``window_s`` seconds (a minute, less for a broker
    started since). ``unreachable`` names brokers whose figures are missing."""

    window_s: float
    topics: list[TopicRate]
    groups: list[GroupRate]
    unreachable: list[str] = msgspec.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


class CommittedOffset(msgspec.Struct, frozen=True):
    """A consumer group's committed offset in one queue of a broker, with its lag."""

    group: str
    topic: str
    queue_id: int
    offset: int
    lag: int


class BrokerHealth(msgspec.Struct, frozen=True):
    """A broker's ``/health``: whether its store takes writes, and its replication state.

    ``writable`` answers "does it take sends now"; ``reason`` says why not (disk full, I/O
    errors, shutting down).
    """

    status: str
    broker_name: str
    role: str
    epoch: int
    reason: str | None = None
    version: str = ""
    master_address: str = ""
    in_sync_ids: list[int] = msgspec.field(default_factory=list)
    electable_ids: list[int] = msgspec.field(default_factory=list)
    replica_lag_bytes: dict[str, int] = msgspec.field(default_factory=dict)
    """Per slave id: how many commitlog bytes it is behind (on a master)."""
    replica_lag_s: dict[str, float] = msgspec.field(default_factory=dict)
    held_offsets: int = 0
    verified: bool = True
    uptime_s: float = 0.0
    commitlog_write_offset: int = 0
    commitlog_durable_offset: int = 0
    disk_used_ratio: float = 0.0
    """As df counts it: used / (used + available)."""
    disk_used_bytes: int | None = None
    disk_available_bytes: int | None = None
    disk_clean_ratio: float = 0.0
    disk_full_ratio: float = 0.0
    disk_reserve_bytes: int = 0
    """Writes stop when the available bytes fall under it, whatever the ratio."""
    flush_mode: str = ""
    replication_mode: str = ""
    retention_hours: float = 0.0

    @property
    def writable(self) -> bool:
        return self.status == "ok"


class BrokerSettings(msgspec.Struct, frozen=True):
    """The settings a broker may change while it runs (``Admin.broker_config``), with
    their values now, and those changed live (kept across its restarts)."""

    broker_name: str
    settings: dict[str, Any]
    changed_live: dict[str, Any] = msgspec.field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SwitchoverResult:
    """A planned change of master done: who is master now, at which epoch, the old
    master's log end the new one held when it took over, and how long it took."""

    group: str
    master_id: int
    epoch: int
    log_end: int
    elapsed_ms: float


@dataclass(frozen=True, slots=True)
class QueueProgress:
    """A consumer group's position in one queue (``Admin.progress``)."""

    queue: QueueRoute
    offsets: QueueOffsets

    @property
    def lag(self) -> int:
        """Messages still to consume; all the queue holds where the group never committed."""
        lag = self.offsets.lag
        return lag if lag is not None else self.offsets.max_offset - self.offsets.min_offset


@dataclass(frozen=True, slots=True)
class QueueReset:
    """One queue of ``Admin.reset_offsets``: the group's offset before and after."""

    queue: QueueRoute
    before: int | None
    """The group's committed offset before the reset; None when it had none."""
    after: int


@dataclass(frozen=True, slots=True)
class TopicReset:
    """``Admin.reset_offsets``: every readable queue's offset before and after, the
    group's members that were consuming the topic (they go on from the new offsets at
    their next pull; none: the group starts there when it next runs), and the broker
    groups where no slave confirmed the new offsets in time (a failover there now could
    lose them)."""

    queues: list[QueueReset]
    live_members: list[str]
    unreplicated: list[str]


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A readable queue's bounds ``[min_offset, max_offset)``."""

    queue: QueueRoute
    min_offset: int
    max_offset: int

    @property
    def messages(self) -> int:
        return self.max_offset - self.min_offset


class StoredQueue(msgspec.Struct, frozen=True):
    """One queue of a topic on a broker (``Admin.broker_queues``): its offsets
    ``[min_offset, max_offset)`` and when its last message was stored (None: empty)."""

    queue_id: int
    min_offset: int
    max_offset: int
    last_stored_ms: int | None = None


class ConsumerMember(msgspec.Struct, frozen=True):
    """A live member of a consumer group as one broker knows it (``Admin.consumers``):
    ``mode`` is push or pull; ``subscriptions`` are (topic, expression) pairs."""

    client_id: str
    computer_room: str
    mode: str
    subscriptions: list[tuple[str, str]]
    host: str = ""
    client_version: str = ""
    language: str = ""
    """What the client library says it is; empty for a client too old to say."""


class DelayTier(msgspec.Struct, frozen=True):
    """One tier of a broker's timer wheel: messages due at least ``waits_s`` ahead."""

    tier: int
    waits_s: int
    pending: int
    next_due_ms: int | None = None
    """When its head next moves down a tier or is delivered."""


class DelayedWaiting(msgspec.Struct, frozen=True):
    pending: int
    next_due_ms: int | None = None
    tiers: list[DelayTier] = msgspec.field(default_factory=list)


class TransactionsWaiting(msgspec.Struct, frozen=True):
    """Half messages waiting for their producer's commit or rollback on a master."""

    pending: int
    oldest_ms: int | None = None
    most_checks: int = 0
    max_checks: int = 0
    check_after_ms: int = 0
    discarded: int = 0


class ScheduledWork(msgspec.Struct, frozen=True):
    """What waits on one broker (``Admin.scheduled``); None for what it does not run."""

    delayed: DelayedWaiting | None = None
    transactions: TransactionsWaiting | None = None


class ProducerClient(msgspec.Struct, frozen=True):
    """A producer connected to one broker, as it introduced itself (``Admin.producers``);
    ``since_ms`` is when (wall clock) it said so on its connection."""

    client_id: str
    group: str
    host: str
    computer_room: str = ""
    client_version: str = ""
    language: str = ""
    since_ms: int = 0


class GroupQueueOffset(msgspec.Struct, frozen=True):
    """A consumer group's committed offset in one queue of a broker
    (``Admin.group_offsets``): its lag in messages and in time (how long the oldest
    message not consumed yet has waited; 0 when none waits), and ``owner``, the live
    member that pulled the queue last."""

    topic: str
    queue_id: int
    offset: int
    max_offset: int
    lag: int
    lag_ms: int
    owner: str | None = None


class OffsetChange(msgspec.Struct, frozen=True):
    """One queue of a broker's offset reset: the committed offset before (None: none)
    and after."""

    queue_id: int
    before: int | None
    after: int


class GroupReset(msgspec.Struct, frozen=True):
    """A broker's reset of a group's offsets by time (``Admin.reset_group``).
    ``replicated`` is False when, under sync replication, no slave confirmed the new
    offsets in time (a failover now could lose them); a dry run commits nothing.
    ``live_members``: the group's members consuming the topic at the broker now, each of
    which drops what it has in flight at its next pull and goes on from the new offsets
    (their commits from before the reset are refused)."""

    group: str
    topic: str
    dry_run: bool
    queues: list[OffsetChange]
    replicated: bool
    reset_generation: int = 0
    live_members: list[str] = msgspec.field(default_factory=list)


class NewMessage(msgspec.Struct, frozen=True):
    """Where a broker stored a message it made (a test message, a resent dead letter)."""

    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int


class MessagesStored(msgspec.Struct, frozen=True):
    """Messages a broker stored itself, and the durability they reached, as a send
    result says it: ``durable`` False when not on disk within the flush timeout,
    ``replicated`` False when no slave confirmed them within the replication timeout."""

    stored: list[NewMessage]
    durable: bool
    replicated: bool


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """A consumer group as the masters know it (``Admin.list_groups``): the topics it
    committed offsets on, its live members (client ids) and its lag in messages."""

    group: str
    topics: list[str]
    members: list[str]
    lag: int


@dataclass(frozen=True, slots=True)
class GroupOffsetRow:
    """One queue of ``Admin.describe_group``: the group's committed offset on a broker
    group's master."""

    broker_name: str
    offset: GroupQueueOffset


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """``Admin.describe_group``: the live members (each once, as the first master
    listing it knows it) and every committed offset with its lag."""

    group: str
    members: list[ConsumerMember]
    offsets: list[GroupOffsetRow]

    @property
    def lag(self) -> int:
        return sum(row.offset.lag for row in self.offsets)


@dataclass(frozen=True, slots=True)
class GroupDeleted:
    """``Admin.delete_group``: the offsets forgotten per broker group, the members that
    were live (non-empty only when forced), and the retry and dead-letter topics deleted
    (with the broker groups that had them)."""

    group: str
    deleted_offsets: dict[str, int]
    live_members: list[str]
    deleted_topics: dict[str, list[str]]


@dataclass(frozen=True, slots=True)
class Connections:
    """``Admin.connections``: the consumers (each once, with the brokers it heartbeats)
    and the producers (each once, with the brokers it is connected to)."""

    consumers: list[tuple[str, ConsumerMember, list[str]]]
    """(consumer group, member, broker names)."""
    producers: list[tuple[ProducerClient, list[str]]]


@dataclass(frozen=True, slots=True)
class ControllerStatus:
    """``Admin.controller_status``: the failover controller as one nameserver
    (``nameserver``) sees it: the Raft leader (its Raft address; empty: none now),
    whether that nameserver is it, its term and whether it sees a majority, the Raft
    members with whether it is connected to each (itself first; empty from an older
    nameserver), and the committed state (master, epoch, in-sync set) of every group
    the controller manages."""

    nameserver: str
    leader: str
    is_leader: bool
    term: int
    has_quorum: bool
    members: list[tuple[str, bool]]
    groups: list[GroupControl]
