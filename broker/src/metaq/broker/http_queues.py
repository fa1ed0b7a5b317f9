"""The broker's admin endpoints per queue and per consumer group, which the nameservers'
web console reads and drives (docs/operations.md, "Console").

- ``GET /queues?topic=T`` — each queue's min and max offset and when its last message
  was stored; 404 for a topic this broker does not serve.
- ``GET /queues/stored`` — per topic, the messages stored so far (the sum of its queues'
  max offsets: the console's rate of messages in).
- ``GET /queues/{topic}/{queue_id}/messages?offset=N[&limit=L]`` — stored messages from
  a queue offset; ``?from_ms=A[&to_ms=B][&limit=L]`` — those stored in a time range.
- ``GET /groups/{group}/offsets`` — the group's committed offset per queue with its lag
  in messages and in time (age of the oldest message not consumed yet), and its owner:
  the live member that pulled it last.
- ``POST /groups/{group}/reset`` ``{"topic": T, "timestamp_ms": n, "dry_run": bool}`` —
  commit, on every read queue of T here, the first offset stored at or after the time;
  a dry run answers the same rows and commits nothing. ``replicated`` is false when,
  under sync replication, no slave confirmed the commits within the replication timeout.
  The reset reaches the group's live members (``metaq.broker.offsets``): each drops what
  it has in flight at its next pull and goes on from the new offsets, and commits from
  before the reset are refused. ``live_members`` names those consuming T here now.
- ``DELETE /groups/{group}[?force=true]`` — forget the group's committed offsets here
  (journaled, so its slaves forget them too); 409 naming its live members unless
  ``force``; 404 when this broker knows neither offsets nor members of it.
- ``POST /topics/{name}/messages`` ``{"body": text, "tags": t, "keys": [...],
  "properties": {...}}`` — store one message (a test message from the console).
- ``POST /groups/{group}/dlq/resend`` ``{"msg_ids": [...]}`` — store the group's dead
  letters (``%DLQ%group``) in their original topic again, as new messages.

Changes are taken by the group's master only (409 on a slave, naming the master).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from typing import Any, Final

from aiohttp import web

from metaq.broker.http import HttpContext, message_json
from metaq.broker.store import FlushMode, MessageStore
from metaq.common import http
from metaq.common.errors import InvalidMessage, MetaqError
from metaq.common.names import dlq_topic, shown
from metaq.common.record import Record, encode, new_msg_id

# The properties metaq.client.retry puts on a dead letter: the topic it was first sent to,
# its first id and its last failure. A resend keeps the user's properties only.
PROP_RETRY_TOPIC: Final = "RETRY_TOPIC"
PROP_ORIGIN_MSG_ID: Final = "ORIGIN_MSG_ID"
_RETRY_PROPS: Final = frozenset({PROP_RETRY_TOPIC, PROP_ORIGIN_MSG_ID, "LAST_FAILURE"})
MAX_LIMIT: Final = 1000
# A range read stops after this many entries even when few match, so one request never
# walks a whole queue.
MAX_SCAN: Final = 100_000


def add_routes(app: web.Application, context: HttpContext) -> None:
    """Register this module's endpoints on the broker's HTTP app."""
    views = _Views(context)
    app.add_routes(
        [
            web.get("/queues", views.queues),
            web.get("/queues/stored", views.stored),
            web.get("/queues/{topic}/{queue_id}/messages", views.queue_messages),
            web.get("/groups/{group}/offsets", views.group_offsets),
            web.post("/groups/{group}/reset", views.reset),
            web.delete("/groups/{group}", views.delete_group),
            web.post("/groups/{group}/dlq/resend", views.resend_dead),
            web.post("/topics/{name}/messages", views.send_test),
        ]
    )


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def read_queue(store: MessageStore, topic: str, queue_id: int, offset: int) -> Iterator[Record]:
    """The intact messages of one queue from ``offset`` on, in order (retention-deleted
    ones skipped)."""
    queue = store.queues.get(topic.encode(), queue_id)
    if queue is None:
        return
    for at in range(max(offset, queue.min_offset), queue.max_offset):
        cl_offset, size, _ = queue.entry(at)
        if size == 0:
            continue
        found = store.record_at(cl_offset)
        if found is not None:
            yield found


def oldest_unconsumed_age_ms(store: MessageStore, topic: str, queue_id: int, offset: int) -> int:
    """How long the message at ``offset`` has waited (0 when it is not stored yet)."""
    for found in read_queue(store, topic, queue_id, offset):
        return max(0, time.time_ns() // 1_000_000 - found.store_timestamp_ms)
    return 0


class _Views:
    def __init__(self, context: HttpContext) -> None:
        self._c = context

    def _refuse_on_slave(self) -> web.Response | None:
        role = self._c.role
        if role.takes_writes:
            return None
        master = f" ({role.master_address})" if role.master_address else ""
        return _error(
            409,
            f"broker {self._c.broker_name} is not taking writes (not its group's master); "
            f"ask the master{master}",
        )

    def _unknown_topic(self, topic: str) -> web.Response | None:
        if self._c.topics.get(topic) is not None:
            return None
        return _error(404, f"topic {shown(topic)} is not served by broker {self._c.broker_name}")

    async def queues(self, request: web.Request) -> web.Response:
        topic = request.query.get("topic", "")
        unknown = self._unknown_topic(topic)
        if unknown is not None:
            return unknown
        config = self._c.topics.get(topic)
        assert config is not None
        store = self._c.store
        rows = []
        for queue_id in range(max(config.read_queues, config.write_queues)):
            high = store.max_offset(topic, queue_id)
            last = None
            if high > 0:
                last_record = next(read_queue(store, topic, queue_id, high - 1), None)
                last = last_record.store_timestamp_ms if last_record else None
            rows.append(
                {
                    "queue_id": queue_id,
                    "min_offset": store.min_offset(topic, queue_id),
                    "max_offset": high,
                    "last_stored_ms": last,
                }
            )
        return web.json_response({"topic": topic, "config": config.to_json(), "queues": rows})

    async def stored(self, _request: web.Request) -> web.Response:
        store = self._c.store
        counts = {
            t.name: sum(
                store.max_offset(t.name, q) for q in range(max(t.read_queues, t.write_queues))
            )
            for t in self._c.topics.all()
        }
        return web.json_response({"topics": counts})

    async def queue_messages(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        unknown = self._unknown_topic(topic)
        if unknown is not None:
            return unknown
        query = request.query
        try:
            queue_id = int(request.match_info["queue_id"])
            limit = int(query.get("limit", "32"))
            offset = int(query["offset"]) if "offset" in query else None
            from_ms = int(query["from_ms"]) if "from_ms" in query else None
            to_ms = int(query["to_ms"]) if "to_ms" in query else None
        except ValueError as exc:
            return _error(400, f"queue id, offset, limit, from_ms and to_ms are integers: {exc}")
        if not 0 < limit <= MAX_LIMIT or (offset is None) == (from_ms is None):
            return _error(
                400,
                f"give either offset or from_ms (with to_ms optionally), and limit 1-{MAX_LIMIT}",
            )
        store = self._c.store
        if from_ms is not None:
            offset = store.offset_for_timestamp(topic, queue_id, from_ms)
        assert offset is not None
        found: list[dict[str, Any]] = []
        for scanned, record in enumerate(read_queue(store, topic, queue_id, offset)):
            if len(found) >= limit or scanned >= MAX_SCAN:
                break
            if to_ms is not None and record.store_timestamp_ms > to_ms:
                break
            found.append(message_json(record, self._c.broker_name))
        return web.json_response(
            {
                "topic": topic,
                "queue_id": queue_id,
                "min_offset": store.min_offset(topic, queue_id),
                "max_offset": store.max_offset(topic, queue_id),
                "messages": found,
            }
        )

    async def group_offsets(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        store = self._c.store
        rows = [
            {
                "topic": topic,
                "queue_id": queue_id,
                "offset": offset,
                "max_offset": store.max_offset(topic, queue_id),
                "lag": max(store.max_offset(topic, queue_id) - offset, 0),
                "lag_ms": oldest_unconsumed_age_ms(store, topic, queue_id, offset),
                "owner": self._c.groups.owner(group, topic, queue_id),
            }
            for (g, topic, queue_id), offset in sorted(self._c.offsets.items())
            if g == group
        ]
        return web.json_response({"group": group, "offsets": rows})

    async def reset(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        body = await http.json_object(request)
        topic = body.get("topic")
        stamp = body.get("timestamp_ms")
        dry_run = body.get("dry_run", False)
        if (
            not isinstance(topic, str)
            or not isinstance(stamp, int)
            or isinstance(stamp, bool)
            or not isinstance(dry_run, bool)
        ):
            return _error(
                400, 'expected {"topic": name, "timestamp_ms": integer, "dry_run": true|false}'
            )
        unknown = self._unknown_topic(topic)
        if unknown is not None:
            return unknown
        if not dry_run:
            refused = self._refuse_on_slave()
            if refused is not None:
                return refused
        config = self._c.topics.get(topic)
        assert config is not None
        store, offsets = self._c.store, self._c.offsets
        new = {q: store.offset_for_timestamp(topic, q, stamp) for q in range(config.read_queues)}
        rows = [
            {"queue_id": q, "before": offsets.get(group, topic, q), "after": after}
            for q, after in new.items()
        ]
        replicated = False
        generation = offsets.reset_generation(group, topic)
        if not dry_run:
            try:
                generation = offsets.reset(group, topic, new)
            except MetaqError as exc:  # a new group past max_consumer_groups, say
                return _error(400, str(exc))
            role = self._c.role
            journaled = role.journal.write_offsets() if role.journal is not None else None
            # As a consumer's commit: under sync replication, answered once a slave that
            # could be promoted holds it too.
            replicated = (
                journaled is None or not role.sync or await role.wait_replicated(journaled.end)
            )
        live = [
            m.client_id
            for m in self._c.groups.members(group)
            if any(subscribed == topic for subscribed, _ in m.subscriptions)
        ]
        return web.json_response(
            {
                "group": group,
                "topic": topic,
                "dry_run": dry_run,
                "queues": rows,
                "replicated": replicated,
                "reset_generation": generation,
                "live_members": live,
            }
        )

    async def delete_group(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        force = request.query.get("force", "false") == "true"
        refused = self._refuse_on_slave()
        if refused is not None:
            return refused
        offsets = self._c.offsets
        live = [m.client_id for m in self._c.groups.members(group)]
        if group not in offsets.groups() and not live:
            return _error(
                404, f"broker {self._c.broker_name} knows no consumer group {shown(group)}"
            )
        if live and not force:
            return _error(
                409,
                f"consumer group {shown(group)} has live members ({', '.join(live)}): stop "
                "them first, or force the delete (they would commit their positions again)",
            )
        deleted = offsets.delete_group(group)
        role = self._c.role
        if role.journal is not None:
            role.journal.write_deleted_group(group)
        return web.json_response({"group": group, "deleted_offsets": deleted, "live_members": live})

    async def send_test(self, request: web.Request) -> web.Response:
        topic = request.match_info["name"]
        body = await http.json_object(request)
        text, tags, keys = body.get("body"), body.get("tags", ""), body.get("keys", [])
        properties = body.get("properties", {})
        if (
            not isinstance(text, str)
            or not isinstance(tags, str)
            or not isinstance(keys, list)
            or not all(isinstance(k, str) for k in keys)
            or not isinstance(properties, dict)
            or not all(isinstance(v, str) for v in properties.values())
        ):
            return _error(
                400,
                'expected {"body": text, "tags": text, "keys": [text, ...], '
                '"properties": {name: text}}',
            )
        unknown = self._unknown_topic(topic)
        if unknown is not None:
            return unknown
        config = self._c.topics.get(topic)
        assert config is not None
        if not config.permission.writable or config.write_queues == 0:
            return _error(409, f"topic {shown(topic)} takes no writes on this broker")
        queue_id = random.randrange(config.write_queues)
        return await self._store_new(
            [(topic, queue_id, text.encode(), tags, tuple(keys), properties)], request
        )

    async def resend_dead(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        body = await http.json_object(request)
        wanted = body.get("msg_ids")
        if (
            not isinstance(wanted, list)
            or not wanted
            or not all(isinstance(m, str) for m in wanted)
        ):
            return _error(400, 'expected {"msg_ids": ["32 hex digits", ...]}')
        dlq = dlq_topic(group)
        if self._c.topics.get(dlq) is None:
            return _error(404, f"group {shown(group)} has no dead letters on this broker")
        chosen: dict[str, Record] = {}
        config = self._c.topics.get(dlq)
        assert config is not None
        for queue_id in range(config.read_queues):
            for letter in read_queue(self._c.store, dlq, queue_id, 0):
                ids = {letter.msg_id.hex(), letter.properties.get(PROP_ORIGIN_MSG_ID, "")}
                for msg_id in ids & set(wanted):
                    chosen[msg_id] = letter
        missing = sorted(set(wanted) - set(chosen))
        if missing:
            return _error(404, f"no dead letter of group {shown(group)} has id {missing}")
        new = []
        for letter in chosen.values():
            topic = letter.properties.get(PROP_RETRY_TOPIC, "")
            target = self._c.topics.get(topic)
            if target is None or not target.permission.writable or target.write_queues == 0:
                return _error(
                    409,
                    f"dead letter {letter.msg_id.hex()} came from topic {shown(topic)}, which "
                    f"takes no writes on broker {self._c.broker_name}",
                )
            properties = {k: v for k, v in letter.properties.items() if k not in _RETRY_PROPS}
            new.append(
                (
                    topic,
                    random.randrange(target.write_queues),
                    letter.body,
                    letter.tags,
                    tuple(letter.keys),
                    properties,
                )
            )
        return await self._store_new(new, request)

    async def _store_new(
        self,
        messages: list[tuple[str, int, bytes, str, tuple[str, ...], dict[str, str]]],
        _request: web.Request,
    ) -> web.Response:
        refused = self._refuse_on_slave()
        if refused is not None:
            return refused
        role, store = self._c.role, self._c.store
        try:
            role.check_writable()
            ids = [new_msg_id() for _ in messages]
            records = [
                encode(
                    topic,
                    body,
                    queue_id=queue_id,
                    tags=tags,
                    keys=keys,
                    properties=properties,
                    msg_id=msg_id,
                    born_timestamp_ms=time.time_ns() // 1_000_000,
                )
                for msg_id, (topic, queue_id, body, tags, keys, properties) in zip(
                    ids, messages, strict=True
                )
            ]
            appended = store.append(records)
        except InvalidMessage as exc:
            return _error(400, str(exc))
        except MetaqError as exc:
            return _error(409, str(exc))
        role.appended()
        # Answered as a producer's send is: once durable under sync flush (waited for on
        # a worker thread, not the loop) and held by a slave under sync replication.
        durable = store.config.flush_mode is not FlushMode.SYNC or await asyncio.to_thread(
            store.wait_durable, appended.end
        )
        replicated = not role.sync or await role.wait_replicated(appended.end)
        return web.json_response(
            {
                "stored": [
                    {"msg_id": msg_id.hex(), "topic": m[0], "queue_id": m[1], "queue_offset": q}
                    for msg_id, m, q in zip(ids, messages, appended.queue_offsets, strict=True)
                ],
                "durable": durable,
                "replicated": replicated,
            }
        )
