"""Prometheus metrics of one broker: request counters kept on the hot path, store and
consumer state read at scrape time.

Each broker has its own registry (never the library's global one), so several brokers
can live in one process in tests. Counters by topic keep their labelled children in a
dict: a send costs two dict lookups and two increments, not a label resolution.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from metaq.broker.consumers import ConsumerGroups
from metaq.broker.delay import DelayScheduler
from metaq.broker.offsets import ConsumerOffsets
from metaq.broker.role import GroupRole
from metaq.broker.store import MessageStore
from metaq.broker.transactions import Transactions


class BrokerMetrics:
    """The counters handlers bump, and the registry /metrics renders."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self._messages = Counter(
            "metaq_messages_appended", "Messages appended, by topic", ["topic"], registry=r
        )
        self._bytes = Counter(
            "metaq_bytes_appended", "Record bytes appended, by topic", ["topic"], registry=r
        )
        self._pulls = Counter("metaq_pulls", "PULL answers, by status", ["status"], registry=r)
        self._pulled = Counter(
            "metaq_messages_pulled", "Messages returned by pulls, by topic", ["topic"], registry=r
        )
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
        self.pulls_read_in = Counter(
            "metaq_pulls_read_in",
            "PULLs for records behind the page-cache window, read in from disk on a "
            "reader thread before the answer",
            registry=r,
        )
        self.idle_polled = Counter(
            "metaq_idle_poll_seconds",
            "Seconds the event loop polled for a next request instead of sleeping (idle_poll_us)",
            registry=r,
        )
        self._appended_children: dict[str, tuple[Counter, Counter]] = {}
        self._pull_children: dict[tuple[str, str], tuple[Counter, Counter]] = {}

    def appended(self, topic: str, messages: int, nbytes: int) -> None:
        children = self._appended_children.get(topic)
        if children is None:
            children = (self._messages.labels(topic), self._bytes.labels(topic))
            self._appended_children[topic] = children
        children[0].inc(messages)
        children[1].inc(nbytes)

    def pulled(self, topic: str, status: str, messages: int) -> None:
        children = self._pull_children.get((topic, status))
        if children is None:
            children = (self._pulls.labels(status), self._pulled.labels(topic))
            self._pull_children[(topic, status)] = children
        children[0].inc()
        if messages:
            children[1].inc(messages)

    def watch(self, state: BrokerState) -> None:
        """Report ``state`` at every scrape."""
        self.registry.register(_StateCollector(state))

    def render(self) -> bytes:
        return generate_latest(self.registry)


@dataclass(frozen=True, slots=True)
class BrokerState:
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


class _StateCollector:
    def __init__(self, state: BrokerState) -> None:
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
            "metaq_disk_used_ratio",
            "Used fraction of the data directory's disk",
            store.guard.disk_ratio,
        )
        if store.guard.available_bytes is not None:
            yield _gauge(
                "metaq_disk_available_bytes",
                "Free bytes on the data directory's disk (as of the last sample)",
                store.guard.available_bytes,
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
        writable = 0 if store.refusal else 1
        yield _gauge("metaq_writable", "1 if the store accepts writes", writable)
        queues = GaugeMetricFamily(
            "metaq_queue_max_offset", "Next queue offset per topic queue", labels=["topic", "queue"]
        )
        # A copy in one C call: the dispatcher thread may add queues meanwhile.
        for (topic_b, queue_id), queue in list(store.queues.queues.items()):
            queues.add_metric([topic_b.decode(), str(queue_id)], queue.max_offset)
        yield queues
        lag = GaugeMetricFamily(
            "metaq_consumer_lag",
            "Messages not yet consumed: queue max offset minus committed offset",
            labels=["group", "topic", "queue"],
        )
        for (group, topic, queue_id), offset in state.offsets.items():
            behind = max(store.max_offset(topic, queue_id) - offset, 0)
            lag.add_metric([group, topic, str(queue_id)], behind)
        yield lag
        members = GaugeMetricFamily(
            "metaq_consumer_group_members", "Live consumers per group", labels=["group"]
        )
        for group, live in state.groups.groups().items():
            members.add_metric([group], len(live))
        yield members


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
