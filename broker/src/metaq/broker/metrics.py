"""Prometheus metrics of one broker: request counters kept on the hot path, store and
consumer state read at scrape time.

Names follow RocketMQ 5's (``messages_in_total``, ``throughput_in_bytes_total``,
``consumer_lag_messages``, ``rpc_latency_seconds`` ...) with the ``metaq_`` prefix and
Prometheus' rules: units in the name, ``_total`` on counters (prometheus_client adds it
to a Counter's name), base units. docs/operations.md lists them all.

Each broker has its own registry (never the library's global one), so several brokers
can live in one process in tests; the process, platform and GC collectors are registered
on it too. Counters by topic keep their labelled children in a dict: a send costs a dict
lookup and two increments, not a label resolution. Histograms are observed per request
frame or per fsync, never per message (see :mod:`metaq.broker.latency`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from metaq.broker.consumers import ConsumerGroups
from metaq.broker.delay import DelayScheduler
from metaq.broker.latency import FSYNC_BUCKETS_S, RPC_BUCKETS_S, LatencyFamily, SingleLatency
from metaq.broker.offsets import ConsumerOffsets
from metaq.broker.role import GroupRole
from metaq.broker.store import MessageStore
from metaq.broker.transactions import Transactions
from metaq.common.errors import ErrorCode, MetaqError
from metaq.common.metrics import standard_collectors
from metaq.common.names import DLQ_PREFIX

MAX_LAG_LOOKUPS: Final = 10_000
"""Consumer lag in time reads one record header per (group, topic, queue) with a
backlog; past this many a scrape reports the rest in messages only, so a broker with
huge numbers of groups is not stalled by its scraper."""


class BrokerMetrics:
    """The counters handlers bump, and the registry /metrics renders."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        standard_collectors(r, "broker")
        self._messages = Counter(
            "metaq_messages_in", "Messages appended by sends, by topic", ["topic"], registry=r
        )
        self._bytes = Counter(
            "metaq_throughput_in_bytes",
            "Record bytes appended by sends, by topic",
            ["topic"],
            registry=r,
        )
        self._dlq = Counter(
            "metaq_send_to_dlq_messages",
            "Messages sent to a consumer group's dead-letter topic, by group",
            ["group"],
            registry=r,
        )
        self._pulls = Counter("metaq_pulls", "PULL answers, by status", ["status"], registry=r)
        self._pulled = Counter(
            "metaq_messages_out", "Messages returned by pulls, by topic", ["topic"], registry=r
        )
        self._pulled_bytes = Counter(
            "metaq_throughput_out_bytes",
            "Record bytes returned by pulls, by topic",
            ["topic"],
            registry=r,
        )
        self._group_pulled = Counter(
            "metaq_consumer_pulled_messages",
            "Messages returned by a consumer group's pulls, by group and topic",
            ["group", "topic"],
            registry=r,
        )
        self._group_acked = Counter(
            "metaq_consumer_acked_messages",
            "Messages a consumer group acknowledged: how far its commits here moved its "
            "committed offsets forward, by group and topic",
            ["group", "topic"],
            registry=r,
        )
        self._rejected = Counter(
            "metaq_rejected_writes",
            "SEND requests refused, by reason: not_master, not_enough_replicas, disk_full, "
            "io_errors, service_dead, out_of_descriptors, unavailable (starting or "
            "stopping), and the error "
            "code of any other refusal (invalid_message, unknown_topic, no_permission ...)",
            ["reason"],
            registry=r,
        )
        self.rpc_latency = LatencyFamily(
            "metaq_rpc_latency_seconds",
            "Data-plane requests from read to answer, by request type (a PULL's includes "
            "its time parked as a long poll)",
            "request_type",
            RPC_BUCKETS_S,
        )
        r.register(self.rpc_latency)
        self.fsync_latency = SingleLatency(
            "metaq_fsync_latency_seconds",
            "Commitlog flushes: the fsyncs of one flush of the written tail",
            FSYNC_BUCKETS_S,
        )
        r.register(self.fsync_latency)
        self.flush_timeouts = Counter(
            "metaq_flush_disk_timeouts", "SYNC sends answered FLUSH_DISK_TIMEOUT", registry=r
        )
        self.deduplicated = Counter(
            "metaq_sends_deduplicated",
            "Records of retried sends answered from the log instead of stored again",
            registry=r,
        )
        self.replication_timeouts = Counter(
            "metaq_flush_slave_timeouts",
            "Sync-replicated sends answered FLUSH_SLAVE_TIMEOUT",
            registry=r,
        )
        self.connections = Gauge("metaq_connections", "Open data-plane connections", registry=r)
        self.connections_refused = Counter(
            "metaq_connections_refused",
            "Data-plane connections refused over max_connections or the fd reserve",
            registry=r,
        )
        self.connections_idle_closed = Counter(
            "metaq_connections_idle_closed",
            "Data-plane connections closed after idle_timeout_s",
            registry=r,
        )
        self.piggybacked_commits_refused = Counter(
            "metaq_piggybacked_commits_refused",
            "Offset commits carried on a PULL and refused (a new group past "
            "max_consumer_groups, an illegal group name); the pull was served",
            registry=r,
        )
        self.request_bytes_reserved = Gauge(
            "metaq_request_bytes_reserved",
            "Bytes reserved for incomplete request frames (max_buffered_request_bytes)",
            registry=r,
        )
        self.connections_waiting_for_budget = Gauge(
            "metaq_connections_waiting_for_budget",
            "Connections not read until their incomplete frame fits the request budget",
            registry=r,
        )
        self.connections_too_slow = Counter(
            "metaq_connections_too_slow",
            "Data-plane connections closed because a frame arrived slower than "
            "min_request_bytes_per_s",
            registry=r,
        )
        self.connections_at_inflight_cap = Gauge(
            "metaq_connections_at_inflight_cap",
            "Connections not read until some of their max_connection_inflight_requests "
            "requests are answered",
            registry=r,
        )
        self.pulls_not_parked = Counter(
            "metaq_pulls_not_parked",
            "PULLs answered at once with nothing because max_parked_pulls were parked",
            registry=r,
        )
        self.zero_copy_bytes = Counter(
            "metaq_zero_copy_bytes",
            "Bytes of PULL answers written from the commitlog's files by sendfile, not "
            "copied through the broker (docs/broker.md)",
            registry=r,
        )
        self.pulls_read_in = Counter(
            "metaq_pulls_read_in",
            "PULLs for records behind the page-cache window, read in from disk on a "
            "reader thread before the answer",
            registry=r,
        )
        self.cold_read_waited = Counter(
            "metaq_cold_read_wait_seconds",
            "Seconds PULLs for records behind the page-cache window waited for their turn "
            "under cold_read_bytes_per_s",
            registry=r,
        )
        self.idle_polled = Counter(
            "metaq_idle_poll_seconds",
            "Seconds the event loop polled for a next request instead of sleeping (idle_poll_us)",
            registry=r,
        )
        self._appended_children: dict[str, tuple[Counter, Counter, Counter | None]] = {}
        self._pull_children: dict[tuple[str, str], tuple[Counter, Counter, Counter]] = {}
        self._group_pulled_children: dict[tuple[str, str], Counter] = {}
        self._group_acked_children: dict[tuple[str, str], Counter] = {}
        # Counters an alert takes increase() of are exported at zero as soon as their
        # labels are known: a series that first appears at 1 shows no increase.
        for reason in REJECTION_REASONS:
            self._rejected.labels(reason)
        self._dlq_groups: set[str] = set()
        self._state: MetricSources | None = None

    def appended(self, topic: str, messages: int, nbytes: int) -> None:
        children = self._appended_children.get(topic)
        if children is None:
            dlq = topic.startswith(DLQ_PREFIX)
            children = (
                self._messages.labels(topic),
                self._bytes.labels(topic),
                self._dlq.labels(topic[len(DLQ_PREFIX) :]) if dlq else None,
            )
            self._appended_children[topic] = children
        children[0].inc(messages)
        children[1].inc(nbytes)
        if children[2] is not None:
            children[2].inc(messages)

    def pulled(self, topic: str, status: str, messages: int, nbytes: int, group: str = "") -> None:
        children = self._pull_children.get((topic, status))
        if children is None:
            children = (
                self._pulls.labels(status),
                self._pulled.labels(topic),
                self._pulled_bytes.labels(topic),
            )
            self._pull_children[(topic, status)] = children
        children[0].inc()
        if messages:
            children[1].inc(messages)
            children[2].inc(nbytes)
            if group:
                self._by_group(self._group_pulled, self._group_pulled_children, group, topic).inc(
                    messages
                )

    def acknowledged(self, group: str, topic: str, messages: int) -> None:
        """``group``'s commit moved its offsets on ``topic`` forward by ``messages``."""
        self._by_group(self._group_acked, self._group_acked_children, group, topic).inc(messages)

    @staticmethod
    def _by_group(
        family: Counter, children: dict[tuple[str, str], Counter], group: str, topic: str
    ) -> Counter:
        child = children.get((group, topic))
        if child is None:
            child = children[(group, topic)] = family.labels(group, topic)
        return child

    def totals(self) -> dict[tuple[str, ...], float]:
        """Messages so far: in and out by topic, pulled and acknowledged by group and
        topic (what :class:`metaq.broker.stats.StatsWindow` turns into rates)."""
        out: dict[tuple[str, ...], float] = {}
        families = (
            ("in", self._messages),
            ("out", self._pulled),
            ("pulled", self._group_pulled),
            ("acked", self._group_acked),
        )
        for kind, family in families:
            for metric in family.collect():
                for sample in metric.samples:
                    if sample.name.endswith("_total"):
                        out[(kind, *sample.labels.values())] = sample.value
        return out

    def write_rejected(self, error: MetaqError, store: MessageStore) -> None:
        """Count a refused SEND under a reason an alert can name."""
        self._rejected.labels(rejection_reason(error, store)).inc()

    def watch(self, state: MetricSources) -> None:
        """Report ``state`` at every scrape."""
        self._state = state
        self.registry.register(_StateCollector(state))

    def render(self) -> bytes:
        if self._state is not None:
            self._groups_at_zero(self._state)
        return generate_latest(self.registry)

    def _groups_at_zero(self, state: MetricSources) -> None:
        """A dead-letter count of zero for every consumer group this broker knows (it
        committed offsets here or heartbeats here) that has none yet."""
        known = self._dlq_groups
        for group in (*state.offsets.groups(), *state.groups.groups()):
            if group not in known:
                known.add(group)
                self._dlq.labels(group)


REJECTION_REASONS: Final = (
    "service_dead",
    "out_of_descriptors",
    "io_errors",
    "disk_full",
    "unavailable",
    *(
        code.name.lower()
        for code in ErrorCode
        if code not in (ErrorCode.UNSPECIFIED, ErrorCode.STORE_UNAVAILABLE)
    ),
)
"""Every ``reason`` label :func:`rejection_reason` gives."""


def rejection_reason(error: MetaqError, store: MessageStore) -> str:
    """The ``reason`` label of a refused write: the store's own refusals told apart."""
    if error.code is not ErrorCode.STORE_UNAVAILABLE:
        return error.code.name.lower()
    if store.dead_service is not None:
        return "service_dead"
    if store.dispatch_starved is not None:
        return "out_of_descriptors"
    if store.guard.io_refused:
        return "io_errors"
    if store.guard.reason is not None:
        return "disk_full"
    return "unavailable"


@dataclass(frozen=True, slots=True)
class MetricSources:
    """What the scrape-time collector reads."""

    store: MessageStore
    offsets: ConsumerOffsets
    groups: ConsumerGroups
    long_polls_parked: Callable[[], int]
    long_polls_woken: Callable[[], int]
    started_monotonic: float
    role: GroupRole
    delays: DelayScheduler
    transactions: Transactions
    member_notices_sent: Callable[[], int] = lambda: 0
    serving_refusal: Callable[[], str | None] = lambda: None
    """Why the data plane takes no connection now (None: it does)."""
    connection_slots: Callable[[], int] = lambda: 0
    """Connections the data plane takes at once now (the descriptor budget's share)."""


class _StateCollector:
    def __init__(self, state: MetricSources) -> None:
        self._state = state

    def collect(self) -> Iterable[Metric]:
        state = self._state
        store = state.store
        yield _gauge(
            "metaq_uptime_seconds",
            "Seconds since start",
            time.monotonic() - state.started_monotonic,
        )
        yield _gauge(
            "metaq_long_polls_parked",
            "PULLs parked waiting for messages",
            state.long_polls_parked(),
        )
        woken = CounterMetricFamily("metaq_long_polls_woken", "Parked PULLs woken by new messages")
        woken.add_metric([], state.long_polls_woken())
        yield woken
        notices = CounterMetricFamily(
            "metaq_consumer_change_notices",
            "CONSUMER_IDS_CHANGED notices sent to consumers when their group's members changed",
        )
        notices.add_metric([], state.member_notices_sent())
        yield notices
        yield _gauge(
            "metaq_dispatch_backlog_bytes",
            "Commitlog bytes not yet dispatched to consume queues",
            store.dispatch_backlog_bytes,
        )
        yield _gauge(
            "metaq_commitlog_write_offset", "Commitlog end (bytes)", store.commitlog.write_offset
        )
        yield _gauge(
            "metaq_commitlog_durable_offset", "Commitlog bytes known fsynced", store.flusher.durable
        )
        yield _gauge(
            "metaq_commitlog_min_offset",
            "Oldest commitlog byte still kept",
            store.commitlog.min_offset,
        )
        released = CounterMetricFamily(
            "metaq_commitlog_page_cache_released_bytes",
            "Commitlog bytes handed back from the page cache behind commitlog_cache_bytes",
        )
        released.add_metric([], store.page_cache.released_bytes)
        yield released
        yield _gauge(
            "metaq_flush_behind_bytes",
            "Commitlog bytes written but not yet fsynced",
            max(0, store.commitlog.write_offset - store.flusher.durable),
        )
        segments = store.commitlog.segments
        yield _gauge(
            "metaq_storage_size_bytes",
            "Commitlog bytes written and still kept (from the oldest segment's start to "
            "the log's end)",
            max(0, store.commitlog.write_offset - segments.min_offset),
        )
        yield _gauge(
            "metaq_storage_allocated_bytes",
            "Bytes of the commitlog's segment files, allocated whole ahead of the writes",
            len(segments.segments) * segments.segment_bytes,
        )
        yield _gauge(
            "metaq_disk_used_ratio",
            "Used fraction of the data directory's disk as df counts it: used / (used + available)",
            store.guard.disk_ratio,
        )
        yield _gauge(
            "metaq_disk_full_ratio",
            "Disk use at which the store refuses writes (store.disk_full_ratio)",
            store.config.disk_full_ratio,
        )
        if store.guard.available_bytes is not None:
            yield _gauge(
                "metaq_disk_available_bytes",
                "Free bytes on the data directory's disk the broker may still allocate "
                "(df's Avail, as of the last sample)",
                store.guard.available_bytes,
            )
        yield _gauge(
            "metaq_disk_reserve_bytes",
            "Free bytes the store never writes into: under them it refuses writes "
            "whatever the used ratio (store.disk_reserve_bytes)",
            store.config.disk_reserve_bytes,
        )
        deleted = CounterMetricFamily(
            "metaq_commitlog_segments_deleted",
            "Commitlog segments retention deleted, by reason: expired, consumed (by every "
            "group, early under disk pressure), unconsumed (store.force_clean_unconsumed)",
            labels=["reason"],
        )
        for reason, count in store.deleted_segments.items():
            deleted.add_metric([reason], count)
        yield deleted
        role = state.role
        info = GaugeMetricFamily(
            "metaq_broker_info",
            "Always 1: who this broker is, for joins (`* on (instance) group_left`)",
            labels=["cluster", "broker_group", "broker_id"],
        )
        config = role.config
        info.add_metric([config.cluster_name, config.broker_name, str(config.broker_id)], 1)
        yield info
        yield _gauge("metaq_epoch", "The broker group's epoch as this broker knows it", role.epoch)
        yield _gauge(
            "metaq_is_master", "1 while this broker takes writes as its group's master",
            1 if role.replicas is not None else 0,
        )  # fmt: skip
        lag = GaugeMetricFamily(
            "metaq_replica_lag_bytes",
            "Commitlog bytes a slave is behind its master (on the master: per slave)",
            labels=["broker_id"],
        )
        for broker_id, behind in role.lag_bytes().items():
            lag.add_metric([str(broker_id)], behind)
        yield lag
        lag_s = GaugeMetricFamily(
            "metaq_replica_lag_seconds",
            "Master: seconds since each connected slave last held the whole log",
            labels=["broker_id"],
        )
        for broker_id, seconds in role.lag_seconds().items():
            lag_s.add_metric([str(broker_id)], seconds)
        yield lag_s
        if role.replicas is not None:
            yield _gauge(
                "metaq_in_sync_replicas",
                "Master: copies of the log in sync, its own included",
                len(role.in_sync_ids()),
            )
            yield _gauge(
                "metaq_replicas",
                "Master: copies of the log it knows this term (its own and every slave "
                "that fetched or was in sync), in sync or not",
                role.replica_count(),
            )
        delays = state.delays
        yield _gauge("metaq_delayed_pending", "Delayed messages not delivered yet (master)",
                     delays.pending())  # fmt: skip
        next_due = delays.next_due_ms()
        yield _gauge(
            "metaq_delayed_next_due_seconds",
            "Seconds until the next delayed message moves or is delivered (-1: none)",
            -1 if next_due is None else max(0.0, next_due / 1e3 - time.time()),
        )
        delivered = CounterMetricFamily("metaq_delayed_delivered", "Delayed messages delivered")
        delivered.add_metric([], delays.delivered)
        yield delivered
        txn = state.transactions
        yield _gauge("metaq_transactions_pending", "Half messages not ended yet (master)",
                     txn.pending())  # fmt: skip
        discarded = CounterMetricFamily(
            "metaq_transactions_discarded", "Half messages discarded after their last check"
        )
        discarded.add_metric([], txn.discarded)
        yield discarded
        yield _gauge(
            "metaq_connection_slots",
            "Data-plane connections taken at once now: max_connections, or what the "
            "open-file limit leaves beside the broker's own files and fd_reserve",
            state.connection_slots(),
        )
        yield _gauge(
            "metaq_dispatch_waiting_for_descriptor",
            "1 while the dispatcher cannot open a file (EMFILE/ENFILE) and retries",
            0 if store.dispatch_service.starved is None else 1,
        )
        writable = 0 if store.refusal or state.serving_refusal() else 1
        yield _gauge(
            "metaq_writable", "1 if the store accepts writes and clients can connect", writable
        )
        queues = GaugeMetricFamily(
            "metaq_queue_max_offset", "Next queue offset per topic queue", labels=["topic", "queue"]
        )
        # A copy in one C call: the dispatcher thread may add queues meanwhile.
        for (topic_b, queue_id), queue in list(store.queues.queues.items()):
            queues.add_metric([topic_b.decode(), str(queue_id)], queue.max_offset)
        yield queues
        yield from _consumer_lag(state)
        members = GaugeMetricFamily(
            "metaq_consumer_group_members", "Live consumers per group", labels=["group"]
        )
        for group, live in state.groups.groups().items():
            members.add_metric([group], len(live))
        yield members


def _consumer_lag(state: MetricSources) -> Iterable[Metric]:
    """Lag per (group, topic, queue) in messages, and in time: the age of the oldest
    unconsumed message, from the store timestamp of the one at the committed offset (0
    with nothing unconsumed). One consume-queue entry and one record header per queue
    with a backlog, at most MAX_LAG_LOOKUPS of them a scrape."""
    store = state.store
    messages = GaugeMetricFamily(
        "metaq_consumer_lag_messages",
        "Messages not yet consumed: queue max offset minus committed offset",
        labels=["group", "topic", "queue"],
    )
    latency = GaugeMetricFamily(
        "metaq_consumer_lag_latency_seconds",
        "Age of the oldest unconsumed message (its store time to now; 0 when none)",
        labels=["group", "topic", "queue"],
    )
    now_ms = time.time_ns() // 1_000_000
    lookups = 0
    for (group, topic, queue_id), offset in state.offsets.items():
        labels = [group, topic, str(queue_id)]
        behind = max(store.max_offset(topic, queue_id) - offset, 0)
        messages.add_metric(labels, behind)
        if not behind:
            latency.add_metric(labels, 0.0)
            continue
        if lookups >= MAX_LAG_LOOKUPS:
            continue
        lookups += 1
        # Below the queue's min offset (retention deleted it) the oldest is the first kept.
        oldest = max(offset, store.min_offset(topic, queue_id))
        stored_ms = store.store_timestamp_at(topic, queue_id, oldest)
        if stored_ms is not None:
            latency.add_metric(labels, max(0.0, (now_ms - stored_ms) / 1e3))
    yield messages
    yield latency


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
