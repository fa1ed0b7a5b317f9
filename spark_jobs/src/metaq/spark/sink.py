"""Rows to messages, sent as an idempotent producer's so a retried Spark task stores nothing twice.

Each task is a producer whose id is derived from (write id, partition id, batch id) and
the broker group; its rows get sequence numbers per queue, in row order
(``metaq.common.record.FLAG_SEQUENCED``). The retried task numbers the same rows the same
way, and the broker answers sequences it stored from its producer table instead of storing
them again, at a cost that does not grow with a de-dup window. Each row's queue is chosen
from a hash of (write, partition, batch, row number) (or the ``sharding_key``, or named by
the ``queue`` and ``broker`` columns), so the retry sends every row where its first try
went. A ``msg_id`` column (32 hex digits) is used as it is, a replay of stored messages
keeping their ids; those rows go with the retry flag, de-duplicated by id within the
broker's ``dedup_window_ms``.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructType,
)

from metaq.client.errors import NoWritableQueue, UnknownTopic
from metaq.client.producer import Producer
from metaq.client.selection import shard_queue
from metaq.common import record
from metaq.common.errors import InvalidMessage
from metaq.common.model import QueueRoute, TopicRoute
from metaq.spark.arrow_encode import (
    derived_ids,
    encode_bodies,
    id_hashes,
    payload,
    sequenced_ids,
)
from metaq.spark.options import OptionError, SinkOptions

COLUMNS: Final[dict[str, tuple[DataType, ...]]] = {
    "topic": (StringType(),),
    "body": (BinaryType(), StringType()),
    "keys": (ArrayType(StringType(), True), ArrayType(StringType(), False)),
    "tags": (StringType(),),
    "properties": (
        MapType(StringType(), StringType(), True),
        MapType(StringType(), StringType(), False),
    ),
    "sharding_key": (StringType(),),
    "msg_id": (StringType(),),
    "queue": (IntegerType(), LongType()),
    "broker": (StringType(),),
}
"""The columns a write uses and the types each may have; other columns are ignored (a
DataFrame read from metaq can be written back as it is)."""
_PER_ROW: Final = ("keys", "tags", "properties", "sharding_key", "msg_id", "queue")
"""Columns whose values send a batch through the per-row encoder."""
MAX_IN_FLIGHT: Final = 16
"""SENDs a task keeps unanswered: enough to keep the brokers busy while it encodes."""


class RowError(ValueError):
    """A row cannot become a message; names the column and what to do."""


def check_schema(schema: StructType, options: SinkOptions) -> None:
    """Fail on the driver, before any task, when the columns cannot make messages."""
    fields = {f.name.lower(): f.dataType for f in schema.fields}
    if "body" not in fields:
        raise OptionError("a metaq write needs a 'body' column (binary or string)")
    if "topic" not in fields and not options.topic:
        raise OptionError("a metaq write needs a 'topic' column or the 'topic' option")
    for name, allowed in COLUMNS.items():
        found = fields.get(name)
        if found is not None and found not in allowed:
            wanted = " or ".join(t.simpleString() for t in dict.fromkeys(allowed))
            raise OptionError(
                f"column {name!r} is {found.simpleString()}; a metaq write needs {wanted} "
                f"(cast it, e.g. col('{name}').cast('{allowed[0].simpleString()}'))"
            )


def id_prefix(write_id: str, partition: int, batch: int) -> bytes:
    """What a task's row numbers are hashed with to choose their queues (8 bytes)."""
    return hashlib.blake2b(f"{write_id}/{partition}/{batch}".encode(), digest_size=8).digest()


def producer_id(prefix: bytes, broker: str) -> int:
    """The idempotent producer id of a task (``prefix``) towards one broker group."""
    digest = hashlib.blake2b(prefix + broker.encode(), digest_size=6).digest()
    return int.from_bytes(digest, "big")


@dataclass
class WriteStats:
    rows: int = 0
    acknowledged: int = 0
    """Rows the brokers answered for (stored now, or found stored by an earlier try)."""


class RowSender:
    """Sends one task's rows in batches per queue; used inside one event loop."""

    def __init__(self, options: SinkOptions, producer: Producer, prefix: bytes) -> None:
        self.options = options
        self.producer = producer
        self.prefix = prefix
        self.row = 0
        self.pending: dict[tuple[str, QueueRoute, bool], list[bytearray]] = {}
        """Records to send per topic, queue and whether they carry given ids."""
        self.sequences: dict[tuple[str, str, int], int] = {}
        """The next sequence per (topic, broker group, queue id)."""
        self._producer_ids: dict[str, int] = {}
        self.in_flight: list[asyncio.Future[Any]] = []
        self.stats = WriteStats()

    async def add_arrow(self, batch: pa.RecordBatch) -> None:
        """Send the rows of ``batch``: all at once when they carry only bodies (and one
        topic), else row by row through :meth:`add`."""
        by_name = {name.lower(): batch.column(i) for i, name in enumerate(batch.schema.names)}
        n = batch.num_rows
        topic = self._one_topic(by_name.get("topic"), n)
        if topic is None or any(
            by_name[c].null_count < n for c in _PER_ROW if c in by_name
        ):  # fmt: skip
            await self.add({c: a.to_pylist() for c, a in by_name.items()}, n)
            return
        bodies = by_name["body"]
        if bodies.null_count:
            first = pc.index(pc.is_null(bodies), True).as_py()
            raise RowError(
                f"column 'body' is null in row {self.row + first} of this task; every "
                "message needs a body (filter or coalesce the nulls)"
            )
        if pa.types.is_string(bodies.type):
            bodies = bodies.cast(pa.binary())  # the same bytes: UTF-8 is what add() sends
        route = await self._route(topic)
        try:
            record.check_topic(topic)
        except InvalidMessage as exc:
            raise RowError(f"column 'topic': {exc}") from None
        queues = route.write_queues
        if not queues:
            raise NoWritableQueue(topic)
        # shard_queue's choice, by the row's derived id, for every row: a retry goes where
        # the first try went.
        picks = id_hashes(derived_ids(self.prefix, self.row, n)).astype(np.int64) % len(queues)
        queue_ids = np.array([q.queue_id for q in queues], np.int32)[picks]
        producers = np.empty(n, np.uint64)
        seqs = np.empty(n, np.int64)
        for k, queue in enumerate(queues):
            rows = np.flatnonzero(picks == k)
            producers[rows] = self._producer_id(queue.broker_name)
            first = self._next_sequence(topic, queue, len(rows))
            seqs[rows] = np.arange(first, first + len(rows))
        ids = sequenced_ids(producers, queue_ids, seqs)
        records = encode_bodies(
            topic, bodies, ids, queue_ids, time.time_ns() // 1_000_000, record.FLAG_SEQUENCED
        )
        self.row += n
        size = self.options.batch_messages
        for k, queue in enumerate(queues):
            rows = np.flatnonzero(picks == k)
            for at in range(0, len(rows), size):
                chosen = records.take(pa.array(rows[at : at + size]))
                self._send_payload(topic, queue, payload(chosen), len(chosen))
        await self._throttle()

    def _producer_id(self, broker: str) -> int:
        found = self._producer_ids.get(broker)
        if found is None:
            found = self._producer_ids[broker] = producer_id(self.prefix, broker)
        return found

    def _next_sequence(self, topic: str, queue: QueueRoute, count: int) -> int:
        """Take ``count`` sequences of ``queue``; return the first."""
        key = (topic, queue.broker_name, queue.queue_id)
        first = self.sequences.get(key, 0)
        self.sequences[key] = first + count
        return first

    def _one_topic(self, column: pa.Array | None, n: int) -> str | None:
        """The topic of every row, when it is one; None when rows differ (or name none)."""
        if column is None or column.null_count == n:
            return self.options.topic or None
        if column.null_count or not n:
            return None
        first = column[0].as_py()
        if first and pc.all(pc.equal(column, first)).as_py():
            return str(first)
        return None

    async def add(self, columns: Mapping[str, Sequence[Any]], count: int) -> None:
        """Encode ``count`` rows given column by column, sending full batches."""
        topics = columns.get("topic")
        bodies = columns["body"]
        keys = columns.get("keys")
        tags = columns.get("tags")
        props = columns.get("properties")
        shards = columns.get("sharding_key")
        ids = columns.get("msg_id")
        queue_ids = columns.get("queue")
        brokers = columns.get("broker")
        now = time.time_ns() // 1_000_000
        routes: dict[str | None, TopicRoute] = {}  # one look at the producer's per call
        for i in range(count):
            number = self.row
            self.row += 1
            topic = (topics[i] if topics is not None else None) or self.options.topic
            body = bodies[i]
            if body is None:
                raise RowError(
                    f"column 'body' is null in row {number} of this task; every "
                    "message needs a body (filter or coalesce the nulls)"
                )
            if isinstance(body, str):
                body = body.encode()
            route = routes.get(topic) or await self._route(topic)
            routes[topic] = route
            given = ids[i] if ids is not None else None
            msg_id = self._id(given, number)
            shard = shards[i] if shards is not None else None
            queue_id = queue_ids[i] if queue_ids is not None else None
            if queue_id is not None:
                broker = brokers[i] if brokers is not None else None
                queue = _given_queue(route, queue_id, broker, number)
            else:
                # By the id: a retry of the task sends each row where its first try went.
                queue = shard_queue(route, shard) if shard else shard_queue(route, msg_id)
            flags = 0
            if not given:
                seq = self._next_sequence(str(topic), queue, 1)
                flags = record.FLAG_SEQUENCED
                msg_id = record.sequenced_id(
                    self._producer_id(queue.broker_name), 0, queue.queue_id, seq
                )
            try:
                rec = record.encode(
                    topic,
                    body,
                    queue_id=queue.queue_id,
                    tags=(tags[i] if tags is not None else None) or "",
                    keys=tuple(keys[i] or ()) if keys is not None else (),
                    properties=_props(props[i]) if props is not None else None,
                    msg_id=msg_id,
                    born_timestamp_ms=now,
                    flags=flags,
                )
            except InvalidMessage as exc:
                raise RowError(f"row {number} of this task: {exc}") from None
            batch = self.pending.setdefault((topic, queue, bool(given)), [])
            batch.append(rec)
            if len(batch) >= self.options.batch_messages:
                self._send(topic, queue, self.pending.pop((topic, queue, bool(given))))
        await self._throttle()

    async def finish(self) -> WriteStats:
        for (topic, queue, _), records in list(self.pending.items()):
            self._send(topic, queue, records)
        self.pending.clear()
        await self._settle()
        return self.stats

    def _send(self, topic: str, queue: QueueRoute, records: list[bytearray]) -> None:
        self._send_payload(topic, queue, b"".join(records), len(records))

    def _send_payload(
        self, topic: str, queue: QueueRoute, records: bytes | memoryview, count: int
    ) -> None:
        self.in_flight.append(self.producer.send_encoded(topic, queue, records, count))
        self.stats.rows += count

    async def _throttle(self) -> None:
        """Wait for the oldest SENDs while more than :data:`MAX_IN_FLIGHT` are unanswered."""
        while len(self.in_flight) > MAX_IN_FLIGHT:
            self._settled(await asyncio.gather(self.in_flight.pop(0), return_exceptions=True))

    async def _settle(self) -> None:
        flights, self.in_flight = self.in_flight, []
        self._settled(await asyncio.gather(*flights, return_exceptions=True))

    def _settled(self, outcomes: Sequence[Any]) -> None:
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome  # the task fails; Spark runs it again, ids and all
            self.stats.acknowledged += len(outcome)

    def _id(self, given: str | None, number: int) -> bytes:
        if given:
            try:
                raw = bytes.fromhex(given)
            except ValueError:
                raw = b""
            if len(raw) != 16:
                raise RowError(f"column 'msg_id' in row {number}: {given!r} is not 32 hex digits")
            return raw
        return self.prefix + number.to_bytes(8, "big")  # chooses the row's queue

    async def _route(self, topic: str | None) -> TopicRoute:
        if not topic:
            raise RowError("column 'topic' is null and no 'topic' option is set")
        try:
            return await self.producer.writable_route(topic)
        except UnknownTopic:
            raise RowError(
                f"column 'topic': topic {topic!r} does not exist (no live broker serves it); "
                "create it with `metaq topic create`"
            ) from None


def _given_queue(route: TopicRoute, queue_id: int, broker: str | None, number: int) -> QueueRoute:
    """The writable queue a row's ``queue`` (and ``broker``) columns name."""
    found = [
        q for q in route.write_queues
        if q.queue_id == queue_id and (not broker or q.broker_name == broker)
    ]  # fmt: skip
    if len(found) == 1:
        return found[0]
    if found:
        groups = ", ".join(q.broker_name for q in found)
        raise RowError(
            f"column 'queue' in row {number}: topic {route.topic!r} has queue {queue_id} on "
            f"broker groups {groups}; add a 'broker' column naming the group"
        )
    named = f"{broker}:{queue_id}" if broker else str(queue_id)
    raise RowError(
        f"column 'queue' in row {number}: topic {route.topic!r} has no writable queue "
        f"{named}; its writable queues: {', '.join(str(q) for q in route.write_queues)}"
    )


def _props(value: Any) -> dict[str, str] | None:
    if not value:
        return None
    items: Iterable[tuple[str, str]] = value.items() if isinstance(value, dict) else value
    return {str(k): str(v) for k, v in items}
