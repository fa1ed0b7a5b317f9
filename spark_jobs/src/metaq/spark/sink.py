"""Rows to messages, sent with ids that make a retried Spark task store nothing twice.

Each row's message id is derived from (write id, partition id, batch id, row number): the
same row of a retried task gets the same id, and every SEND goes with the retry flag, so
the broker answers ids it stored within its ``dedup_window_ms`` from its index instead of
storing them again. The queue is chosen from the id (or the ``sharding_key``), so the
retry reaches the same broker group, whose index holds the first try. A ``msg_id`` column
(32 hex digits) is used as it is: a replay of stored messages keeps their ids.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    MapType,
    StringType,
    StructType,
)

from metaq.client.accumulator import Batch
from metaq.client.errors import UnknownTopic
from metaq.client.producer import Producer
from metaq.client.routes import QueueRoute, TopicRoute
from metaq.client.selection import shard_queue
from metaq.common import record
from metaq.common.errors import InvalidMessage
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
}
"""The columns a write uses and the types each may have; other columns are ignored (a
DataFrame read from metaq can be written back as it is)."""


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
    """The first 8 bytes of every id a task writes; the row number is the last 8."""
    return hashlib.blake2b(f"{write_id}/{partition}/{batch}".encode(), digest_size=8).digest()


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
        self.routes: dict[str, TopicRoute] = {}
        self.pending: dict[tuple[str, QueueRoute], list[bytearray]] = {}
        self.in_flight: list[asyncio.Future[Any]] = []
        self.stats = WriteStats()

    async def add(self, columns: Mapping[str, Sequence[Any]], count: int) -> None:
        """Encode ``count`` rows given column by column, sending full batches."""
        topics = columns.get("topic")
        bodies = columns["body"]
        keys = columns.get("keys")
        tags = columns.get("tags")
        props = columns.get("properties")
        shards = columns.get("sharding_key")
        ids = columns.get("msg_id")
        now = time.time_ns() // 1_000_000
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
            route = self.routes.get(topic) or await self._route(topic)
            msg_id = self._id(ids[i] if ids is not None else None, number)
            shard = shards[i] if shards is not None else None
            # By the id: a retry of the task sends each row where its first try went.
            queue = shard_queue(route, shard) if shard else shard_queue(route, msg_id)
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
                )
            except InvalidMessage as exc:
                raise RowError(f"row {number} of this task: {exc}") from None
            batch = self.pending.setdefault((topic, queue), [])
            batch.append(rec)
            if len(batch) >= self.options.batch_messages:
                self._send(topic, queue, self.pending.pop((topic, queue)))
        if len(self.in_flight) > 8:
            await self._settle()

    async def finish(self) -> WriteStats:
        for (topic, queue), records in list(self.pending.items()):
            self._send(topic, queue, records)
        self.pending.clear()
        await self._settle()
        return self.stats

    def _send(self, topic: str, queue: QueueRoute, records: list[bytearray]) -> None:
        batch = Batch(topic, queue, asyncio.get_running_loop().time(), coalesced=False)
        batch.records.append(b"".join(records))
        batch.count = len(records)
        batch.nbytes = len(batch.records[0])
        batch.retry = True  # the broker stores only ids it does not hold yet
        self.in_flight.append(self.producer.sender.submit(batch))
        self.stats.rows += len(records)

    async def _settle(self) -> None:
        flights, self.in_flight = self.in_flight, []
        outcomes = await asyncio.gather(*flights, return_exceptions=True)
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
        return self.prefix + number.to_bytes(8, "big")

    async def _route(self, topic: str | None) -> TopicRoute:
        if not topic:
            raise RowError("column 'topic' is null and no 'topic' option is set")
        try:
            route = await self.producer.routes.route(topic)
        except UnknownTopic:
            raise RowError(
                f"column 'topic': topic {topic!r} does not exist (no live broker serves it); "
                "create it with `metaq topic create`"
            ) from None
        self.routes[topic] = route
        return route


def _props(value: Any) -> dict[str, str] | None:
    if not value:
        return None
    items: Iterable[tuple[str, str]] = value.items() if isinstance(value, dict) else value
    return {str(k): str(v) for k, v in items}
