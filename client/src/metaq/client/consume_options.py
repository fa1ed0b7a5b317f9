"""The push consumer's settings: consume mode, where a new group starts, limits, intervals."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from metaq.common.model import ASSIGNMENT_STRATEGIES, HOLDINGS_STRATEGIES, ConsumeMode

STRATEGIES: Final = ASSIGNMENT_STRATEGIES


CLUSTERING: Final = ConsumeMode.CLUSTERING
BROADCASTING: Final = ConsumeMode.BROADCASTING


@dataclass(frozen=True, slots=True)
class ConsumeFrom:
    """Where a queue is consumed from when the group has no committed offset for it.

    A committed offset always wins: these only place a group (or a broadcasting member)
    that never consumed the queue. ``first``: the oldest message still stored; ``last``:
    only messages sent from now on; ``timestamp``: the first message stored at or after
    ``timestamp_ms`` (ms since the Unix epoch).
    """

    kind: str
    timestamp_ms: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("first", "last", "timestamp"):
            raise ValueError(f"consume from {self.kind!r}: use first, last or a timestamp")
        if self.timestamp_ms < 0:
            raise ValueError(f"a timestamp cannot be negative ({self.timestamp_ms})")

    def __str__(self) -> str:
        return f"timestamp {self.timestamp_ms}" if self.kind == "timestamp" else self.kind


FIRST: Final = ConsumeFrom("first")
LAST: Final = ConsumeFrom("last")


def TIMESTAMP(timestamp_ms: int) -> ConsumeFrom:
    """Consume from the first message stored at or after ``timestamp_ms``."""
    return ConsumeFrom("timestamp", timestamp_ms)


@dataclass(frozen=True, slots=True)
class PushConsumerConfig:
    """Everything a :class:`~metaq.client.push_consumer.PushConsumer` can be told.

    In-flight limits are per queue (RocketMQ's ``pullThresholdForQueue`` and
    ``pullThresholdSizeForQueue``): a queue stops being pulled while that many of its
    messages, or that many bytes of them, are pulled and not yet handled.
    """

    group: str
    mode: ConsumeMode = ConsumeMode.CLUSTERING
    strategy: str = "sticky"
    computer_room: str = "default"
    consume_from: ConsumeFrom = FIRST
    max_inflight_messages: int = 1000
    max_inflight_bytes: int = 64 * 1024 * 1024
    trace: bool = False
    """Write the trace of every message handled (:mod:`metaq.client.trace`): which
    member, which attempt, with what outcome, and where a failed one was sent back to."""
    concurrency: int = 16
    """Handlers running at once, over all queues."""
    long_poll_timeout_ms: int = 15_000
    pull_batch_size: int = 256
    """Messages asked for per pull."""
    pull_batch_bytes: int = 256 * 1024
    """Record bytes asked for per pull (a first message larger than this still comes
    alone). A pull costs both sides a request, a write and a wake-up whatever it carries,
    so catching up on small messages, larger pulls cost the broker and the consumer much
    less CPU a message (docs/benchmarks.md, ``make bench-accumulation``). The byte bound is
    RocketMQ 5's ``pullBatchSizeInBytes``: answers of a MiB or more, each written in one
    go, delayed the broker's other clients by milliseconds while a group caught up on
    4 KiB messages from disk. A consumer that keeps up gets what is there, so neither
    bound matters until it falls behind."""
    consume_batch_size: int = 32
    """At most this many messages per call of a batch handler."""
    max_handler_attempts: int = 3
    """Broadcasting only: calls of a handler for one message (or batch) before it is
    logged and skipped. Clustering sends a failed message back for a retry instead."""
    max_reconsume_times: int = 16
    """Clustering: retries through the group's retry topic before the dead-letter queue."""
    first_retry_level: int = 3
    """Clustering: the broker's delay level of the first retry (3: 10 s by default); each
    further retry takes the next level."""
    delay_levels: int = 18
    """How many delay levels the brokers have (their ``delay_levels``); later retries
    stay at the last one."""
    handler_retry_backoff_ms: int = 100
    """Wait before the second call; doubles for each further one."""
    lock_renew_fraction: float = 1 / 3
    """Ordered queues: renew a queue's lock once this much of its time to live passed."""
    lock_retry_ms: int = 1000
    """Ordered queues: wait before asking again for a lock another member holds."""
    heartbeat_interval_s: float = 5.0
    rebalance_interval_s: float = 20.0
    commit_interval_s: float = 1.0
    drop_grace_s: float = 2.0
    """At a rebalance, how long a queue given away waits for its running handlers before
    committing its offset (the next owner repeats whatever had not finished)."""
    close_timeout_s: float = 10.0
    """At close, how long running handlers may take; the ones still running then are
    cancelled and their messages are not committed."""
    request_timeout_s: float = 5.0
    offset_store_path: Path | None = None
    """Broadcasting only: the local offset file (default
    ``~/.metaq/offsets/<group>/<instance_name>.json``)."""
    instance_name: str = "default"
    client_id: str = ""
    """Unique per consumer instance; generated (host@pid@random) when empty."""

    @property
    def reports_holdings(self) -> bool:
        """Clustering under ``sticky``: heartbeats report the queues this member runs and
        the assignment starts from every member's report."""
        return self.mode is ConsumeMode.CLUSTERING and self.strategy in HOLDINGS_STRATEGIES

    def __post_init__(self) -> None:
        if not self.group:
            raise ValueError("a consumer group name is needed")
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"unknown assignment strategy {self.strategy!r}; known: {', '.join(STRATEGIES)}"
            )
        positive = {
            "max_inflight_messages": self.max_inflight_messages,
            "max_inflight_bytes": self.max_inflight_bytes,
            "concurrency": self.concurrency,
            "pull_batch_size": self.pull_batch_size,
            "pull_batch_bytes": self.pull_batch_bytes,
            "consume_batch_size": self.consume_batch_size,
            "max_handler_attempts": self.max_handler_attempts,
            "first_retry_level": self.first_retry_level,
            "delay_levels": self.delay_levels,
            "heartbeat_interval_s": self.heartbeat_interval_s,
            "rebalance_interval_s": self.rebalance_interval_s,
            "commit_interval_s": self.commit_interval_s,
            "request_timeout_s": self.request_timeout_s,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, not {value}")
        for name, value in {
            "long_poll_timeout_ms": self.long_poll_timeout_ms,
            "handler_retry_backoff_ms": self.handler_retry_backoff_ms,
            "max_reconsume_times": self.max_reconsume_times,
            "drop_grace_s": self.drop_grace_s,
            "close_timeout_s": self.close_timeout_s,
        }.items():
            if value < 0:
                raise ValueError(f"{name} cannot be negative ({value})")

    def local_offset_path(self) -> Path:
        if self.offset_store_path is not None:
            return self.offset_store_path
        return Path.home() / ".metaq" / "offsets" / self.group / f"{self.instance_name}.json"
