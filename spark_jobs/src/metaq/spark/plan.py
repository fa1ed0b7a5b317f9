"""Driver-side planning: which queues a read covers and the offset range of each.

Only routes and offsets are fetched here (nameserver routes, the brokers' queue bounds and
offset-by-time lookups); messages are read by the executors (:mod:`metaq.spark.pull`).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Collection, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from pyspark.sql.datasource import InputPartition

from metaq.client.admin import Admin
from metaq.client.errors import NoNameServer, UnknownTopic
from metaq.client.pull_consumer import PullConsumer
from metaq.client.routes import ClusterView, NameServerError, RouteCache
from metaq.common.errors import MetaqError
from metaq.common.model import QueueRoute, TopicRoute
from metaq.spark.options import (
    EARLIEST,
    LATEST,
    OptionError,
    QueueOffsets,
    SinkOptions,
    SourceOptions,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

PLANNER_GROUP = "spark-planner"
"""The consumer group named in offset queries; nothing is committed under it."""


class DataLoss(MetaqError):
    """Messages a read was asked for are gone (retention deleted them)."""

    retriable = False


@dataclass(frozen=True)
class QueueRange:
    """Messages ``[start, end)`` of one queue: the unit a Spark partition reads."""

    topic: str
    broker: str
    queue_id: int
    start: int
    end: int
    new_queue: bool = False
    """A queue a stream found after it started: read from its earliest message, and
    offsets below that are not a loss (nobody read the queue before)."""

    @property
    def key(self) -> str:
        return f"{self.broker}:{self.queue_id}"

    @property
    def size(self) -> int:
        return max(self.end - self.start, 0)


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One Spark partition: a queue's offset range, the tag filter to pull it with, and
    the store-time bounds ``[from_ms, until_ms)`` its rows must fall in (None: open)."""

    range: QueueRange
    tags: str
    from_ms: int | None = None
    until_ms: int | None = None


@dataclass(frozen=True)
class QueueState:
    """A queue's bounds ``[min, max)`` when planned."""

    topic: str
    queue: QueueRoute
    min_offset: int
    max_offset: int

    @property
    def key(self) -> str:
        return f"{self.queue.broker_name}:{self.queue.queue_id}"


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one planning step on a loop of its own (Spark calls the source from plain
    threads, with no loop running)."""
    return asyncio.run(coro)


async def resolve_topics(options: SourceOptions, routes: RouteCache) -> list[str]:
    """The topics a read covers: the named ones (which must exist), or the ones matching
    ``topicPattern`` on the live brokers now."""
    if not options.topic_pattern:
        for topic in options.topics:
            await _route(options, routes, topic)
        return list(options.topics)
    found: set[str] = set()
    async with Admin(
        routes=routes,
        timeout_s=options.request_timeout_s,
        tls=options.tls,
        credentials=options.credentials,
    ) as admin:
        view = await _cluster(options, admin)
        for broker in view.brokers():
            if not broker.state.http_address:
                continue
            try:
                topics = await admin.broker_topics(broker)
            except MetaqError as exc:
                log.warning("topic list of broker %s failed: %s", broker.broker_name, exc)
                continue
            found.update(t for t in topics if not t.startswith("%"))
    pattern = re.compile(options.topic_pattern)
    return sorted(t for t in found if pattern.fullmatch(t))


async def queue_states(
    options: SourceOptions,
    routes: RouteCache,
    consumer: PullConsumer,
    topics: Collection[str],
    *,
    tolerate_failures: bool = False,
) -> list[QueueState]:
    """Bounds of every readable queue of ``topics``, sorted by (topic, broker, queue).

    With ``tolerate_failures``, a queue whose broker does not answer (a master dying, its
    slave not yet routed) is left out instead of failing: a stream then keeps that queue
    where it was until the next trigger."""
    states: list[QueueState] = []
    for topic in topics:
        route = await _route(options, routes, topic, refresh=True)
        answers = await asyncio.gather(
            *(consumer.query(topic, q, with_committed=False) for q in route.read_queues),
            return_exceptions=tolerate_failures,
        )
        for q, a in zip(route.read_queues, answers, strict=True):
            if isinstance(a, BaseException):
                if not isinstance(a, MetaqError) or not a.retriable:
                    raise a
                log.info("offsets of %s %s:%s unavailable: %s", topic, q.broker_name, q.queue_id, a)
                continue
            states.append(QueueState(topic, q, a.min_offset, a.max_offset))
    return states


async def resolve_offsets(
    spec: str | QueueOffsets,
    timestamp_ms: int | None,
    states: list[QueueState],
    consumer: PullConsumer,
    *,
    option: str,
    by_timestamp: QueueOffsets | None = None,
) -> dict[tuple[str, str], int]:
    """Each queue's offset for a starting/ending spec: a timestamp (through the broker's
    offset-by-time lookup) wins over ``earliest``/``latest``/JSON, as in the Kafka source;
    ``by_timestamp`` (``<option>ByTimestamp``) gives a time per queue, and the queues it
    leaves out follow ``spec``. A time after a queue's last message resolves to its end."""
    if timestamp_ms is not None:
        found = await asyncio.gather(
            *(consumer.offset_for_timestamp(s.topic, s.queue, timestamp_ms) for s in states)
        )
        return {(s.topic, s.key): o for s, o in zip(states, found, strict=True)}
    result: dict[tuple[str, str], int] = {}
    known = {(s.topic, s.key) for s in states}
    if isinstance(spec, dict):
        _check_named(spec, known, option)
    times = by_timestamp or {}
    _check_named(times, known, option + "ByTimestamp")
    for s in states:
        wanted: int | str = spec if isinstance(spec, str) else spec.get(s.topic, {}).get(s.key, -9)
        if wanted in ("earliest", EARLIEST):
            result[(s.topic, s.key)] = s.min_offset
        elif wanted in ("latest", LATEST):
            result[(s.topic, s.key)] = s.max_offset
        elif wanted == -9:
            # A queue the JSON leaves out: the Kafka source's rule is earliest for starting
            # offsets and latest for ending ones.
            result[(s.topic, s.key)] = s.min_offset if option.startswith("start") else s.max_offset
        else:
            assert isinstance(wanted, int)
            result[(s.topic, s.key)] = wanted
    timed = [s for s in states if s.key in times.get(s.topic, {})]
    found = await asyncio.gather(
        *(consumer.offset_for_timestamp(s.topic, s.queue, times[s.topic][s.key]) for s in timed)
    )
    result.update({(s.topic, s.key): o for s, o in zip(timed, found, strict=True)})
    return result


def _check_named(spec: QueueOffsets, known: set[tuple[str, str]], option: str) -> None:
    """OptionError when ``spec`` names a queue the read does not cover."""
    for topic, queues in spec.items():
        for key in queues:
            if (topic, key) not in known:
                raise OptionError(
                    f"option {option!r} names queue {key} of topic {topic!r}, which the "
                    f"read does not cover; its queues: "
                    + ", ".join(sorted(k for t, k in known if t == topic))
                )


def option_of(options: SourceOptions, state: QueueState, *, starting: bool) -> str:
    """The option that set a queue's starting (or ending) offset, for errors."""
    word = "starting" if starting else "ending"
    if (options.starting_timestamp_ms if starting else options.ending_timestamp_ms) is not None:
        return f"{word}Timestamp"
    times = options.starting_by_timestamp if starting else options.ending_by_timestamp
    if times and state.key in times.get(state.topic, {}):
        return f"{word}OffsetsByTimestamp"
    return f"{word}Offsets"


def checked_range(
    state: QueueState,
    start: int,
    end: int,
    *,
    fail_on_data_loss: bool,
    start_option: str = "startingOffsets",
    end_option: str = "endingOffsets",
) -> tuple[int, int]:
    """``[start, end)`` of a queue as the options asked, checked against its bounds as
    the Kafka source checks a partition's: a start past the queue's end, an end past it
    or a start after the end is an OptionError naming the queue and the offsets. A start
    below the queue's first message (retention deleted the rest) is DataLoss, or with
    ``fail_on_data_loss`` off a warning and the range from the first message on."""
    where = f"topic {state.topic!r} queue {state.key}"
    holds = f"it holds offsets {state.min_offset} to {state.max_offset - 1}"
    if start > state.max_offset:
        raise OptionError(
            f"option {start_option!r}: {where} starts at {start}, past the queue's end "
            f"{state.max_offset} ({holds}); start at or before the end"
        )
    if end > state.max_offset:
        raise OptionError(
            f"option {end_option!r}: {where} ends at {end}, past the queue's end "
            f"{state.max_offset} ({holds}); end at or before it, or use 'latest'"
        )
    if start > end:
        raise OptionError(
            f"options {start_option!r} and {end_option!r}: {where} starts at {start}, after "
            f"its ending offset {end}; the start must not be after the end"
        )
    if start < state.min_offset:
        text = (
            f"{where}: offsets {start} to {min(end, state.min_offset) - 1} were deleted by "
            f"retention ({holds})"
        )
        if fail_on_data_loss:
            raise DataLoss(text + "; set failOnDataLoss=false to skip them with a warning")
        log.warning("%s; skipped (failOnDataLoss=false)", text)
        start = state.min_offset
        end = max(end, start)
    return start, end


def split(ranges: list[QueueRange], min_partitions: int, max_messages: int = 0) -> list[QueueRange]:
    """Cut ranges into pieces of at most ``max_messages`` (Kafka's
    ``maxRecordsPerPartition``; 0: no limit), then cut the largest until there are at
    least ``min_partitions`` (Kafka's ``minPartitions``): each piece stays one queue's
    contiguous offsets."""
    pieces = [r for r in ranges if r.size > 0]
    if max_messages:
        pieces = [p for r in pieces for p in _cut(r, -(-r.size // max_messages))]
    if min_partitions <= len(pieces):
        return pieces
    total = sum(r.size for r in pieces)
    shares = [min(max(1, -(-min_partitions * r.size // total)), r.size) for r in pieces]
    return [p for r, parts in zip(pieces, shares, strict=True) for p in _cut(r, parts)]


def _cut(r: QueueRange, parts: int) -> list[QueueRange]:
    """``r`` in ``parts`` contiguous pieces whose sizes differ by at most one."""
    step, extra = divmod(r.size, parts)
    out = []
    start = r.start
    for i in range(parts):
        end = start + step + (1 if i < extra else 0)
        out.append(QueueRange(r.topic, r.broker, r.queue_id, start, end, r.new_queue))
        start = end
    return out


async def check_topic(options: SourceOptions | SinkOptions, topic: str) -> None:
    """OptionError unless ``topic`` exists (a live broker serves it) and a nameserver
    answers: what a write checks on the driver, before any task runs."""
    async with RouteCache(
        options.nameservers, rpc_timeout_s=options.request_timeout_s, tls=options.tls,
        credentials=options.credentials,
    ) as routes:  # fmt: skip
        await _route(options, routes, topic)


async def _route(
    options: SourceOptions | SinkOptions, routes: RouteCache, topic: str, *, refresh: bool = False
) -> TopicRoute:
    try:
        return await routes.route(topic, refresh=refresh)
    except UnknownTopic:
        raise OptionError(
            f"option 'topic': topic {topic!r} does not exist (no live broker serves it); "
            "create it with `metaq topic create` or fix the name"
        ) from None
    except NoNameServer as exc:
        raise OptionError(
            f"option 'nameservers': no nameserver of {', '.join(options.nameservers)} "
            f"answered ({exc}); check the addresses and that the cluster is up"
        ) from None
    except NameServerError as exc:
        raise _refused(options, exc) from None


def _refused(options: SourceOptions | SinkOptions, exc: NameServerError) -> Exception:
    """A refusal for want of a user or a grant, in the options' terms; else ``exc``."""
    if exc.status == "UNAUTHENTICATED":
        given = "as user " + options.credentials.access_key if options.credentials else "unsigned"
        return OptionError(
            f"options 'accessKey' and 'secretKeyFile': the cluster requires a user and "
            f"refused the request sent {given} (nameserver {exc.address}: {exc.detail}); "
            "set both options: the user's access key and a file holding its secret key"
        )
    if exc.status == "PERMISSION_DENIED":
        return OptionError(
            f"option 'accessKey': the cluster refused user "
            f"{options.credentials.access_key if options.credentials else '(none)'} "
            f"(nameserver {exc.address}: {exc.detail})"
        )
    return exc


async def _cluster(options: SourceOptions, admin: Admin) -> ClusterView:
    try:
        return await admin.cluster()
    except NoNameServer as exc:
        raise OptionError(
            f"option 'nameservers': no nameserver of {', '.join(options.nameservers)} "
            f"answered ({exc}); check the addresses and that the cluster is up"
        ) from None
