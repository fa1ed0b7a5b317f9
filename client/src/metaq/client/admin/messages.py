"""Stored messages across the cluster: by id, by key in a topic, and read in queue order
for no consumer group."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Final

from metaq.client.admin.cluster import ClusterAdmin
from metaq.client.admin.results import MessageTrace, StoredMessage
from metaq.client.errors import AdminError, BrokerAdminError, UnknownTopic
from metaq.client.message import Message
from metaq.client.pull_consumer import PullStatus
from metaq.client.trace import decode_events
from metaq.common.model import BrokerView, QueueRoute
from metaq.common.names import TRACE_TOPIC

_READ_BATCH: Final = 256


class MessageAdmin(ClusterAdmin):
    """The calls that look stored messages up."""

    async def message_by_id(self, msg_id: str) -> StoredMessage:
        """The message with this id (32 hex digits, as a send result gives it), asking
        every broker of the cluster until one has it."""
        try:
            raw = bytes.fromhex(msg_id)
        except ValueError:
            raw = b""
        if len(raw) != 16:
            raise AdminError(f"a message id is 32 hex digits, not {msg_id!r}")
        brokers = [b for b in (await self.cluster()).brokers() if b.state.http_address]
        if not brokers:
            raise AdminError("no broker with an admin address is registered")
        unreachable = []
        for broker in brokers:
            try:
                found = await self.broker_message(broker, raw.hex())
            except BrokerAdminError as exc:
                unreachable.append(f"{broker.broker_name}: {exc}")
                continue
            if found is not None:
                return found
        where = f"; could not ask {'; '.join(unreachable)}" if unreachable else ""
        raise AdminError(f"no broker holds message {raw.hex()}{where}")

    async def message_trace(self, msg_id: str) -> MessageTrace:
        """Where message ``msg_id`` went: the message as stored, and every trace event
        producers and consumers with tracing on wrote for it (:mod:`metaq.client.trace`),
        oldest first. AdminError when neither the message nor a trace of it is found."""
        try:
            raw = bytes.fromhex(msg_id)
        except ValueError:
            raw = b""
        if len(raw) != 16:
            raise AdminError(f"a message id is 32 hex digits, not {msg_id!r}")
        msg_id = raw.hex()
        problems = []
        stored: StoredMessage | None = None
        try:
            stored = await self.message_by_id(msg_id)
        except AdminError as exc:
            problems.append(str(exc))
        try:
            records = await self.messages_by_key(TRACE_TOPIC, msg_id, limit=1000)
        except UnknownTopic:
            records = []
            problems.append(
                f"no broker holds the trace topic {TRACE_TOPIC}: no client with tracing on "
                "has sent or consumed a message yet"
            )
        events = decode_events(msg_id, (m.body for m in records if m.body_encoding == "text"))
        if stored is None and not events:
            raise AdminError("; ".join(problems))
        return MessageTrace(msg_id, stored, events, problems)

    async def messages_by_key(
        self, topic: str, key: str, *, limit: int = 32
    ) -> list[StoredMessage]:
        """The messages of ``topic`` carrying ``key``, newest first: at most ``limit``
        (1-1000) from each broker group serving the topic (its master when alive)."""
        if not 1 <= limit <= 1000:
            raise AdminError("limit must be between 1 and 1000")
        route = await self.routes.route(topic)
        brokers = await self._readers({g.broker_name for g in route.groups})
        found: list[StoredMessage] = []
        for name in sorted(brokers):
            found += await self.broker_messages_by_key(brokers[name], topic, key, limit=limit)
        found.sort(key=lambda m: m.store_timestamp_ms, reverse=True)
        return found

    async def message_at(
        self, topic: str, queue_id: int, offset: int, *, broker_name: str = ""
    ) -> StoredMessage:
        """The message at queue ``offset`` of ``topic``'s queue ``queue_id`` on broker
        group ``broker_name`` (which may be left out when only one group serves the
        topic with that queue id), asked of its master when alive, else a slave.
        AdminError saying the queue's bounds when no message is stored there."""
        route = await self.routes.route(topic)
        groups = sorted({q.broker_name for q in route.read_queues if q.queue_id == queue_id})
        if broker_name:
            if broker_name not in groups:
                raise AdminError(
                    f"broker group {broker_name!r} serves no readable queue {queue_id} of "
                    f"topic {topic!r} (groups that do: {', '.join(groups) or 'none'})"
                )
            groups = [broker_name]
        elif not groups:
            ids = sorted({q.queue_id for q in route.read_queues})
            raise AdminError(
                f"topic {topic!r} has no readable queue {queue_id} (its queue ids: "
                f"{', '.join(map(str, ids)) or 'none'})"
            )
        elif len(groups) > 1:
            raise AdminError(
                f"queue {queue_id} of topic {topic!r} is served by broker groups "
                f"{', '.join(groups)}: name one (--broker)"
            )
        broker = (await self._readers(set(groups)))[groups[0]]
        found = await self.read_queue(broker, topic, queue_id, offset=offset, limit=1)
        if found and found[0].queue_offset == offset:
            return found[0]
        bounds = {q.queue_id: q for q in await self.broker_queues(broker, topic)}.get(queue_id)
        held = f"[{bounds.min_offset}, {bounds.max_offset})" if bounds else "nothing"
        raise AdminError(
            f"no message at offset {offset} of {topic}/{groups[0]}/{queue_id}: the queue "
            f"holds offsets {held}"
        )

    async def _readers(self, groups: set[str]) -> dict[str, BrokerView]:
        """One broker with an admin address per named group: its master when alive,
        else a slave."""
        brokers: dict[str, BrokerView] = {}
        for broker in (await self.cluster()).brokers():
            wanted = broker.broker_name in groups and broker.state.http_address
            if wanted and (broker.broker_name not in brokers or broker.is_master):
                brokers[broker.broker_name] = broker
        missing = groups - brokers.keys()
        if missing:
            raise AdminError(f"no broker of group(s) {', '.join(sorted(missing))} is registered")
        return brokers

    async def read_messages(
        self,
        topic: str,
        count: int,
        *,
        queues: Sequence[QueueRoute] | None = None,
        offset: int | None = None,
        since_ms: int | None = None,
    ) -> AsyncIterator[Message]:
        """Up to ``count`` stored messages of ``topic``, pulled for no consumer group:
        nothing is committed, no group is joined, the brokers keep no trace of the read
        (RocketMQ's ``printMsg`` / ``printMsgByQueue``).

        Queue by queue (``queues``, else every readable queue of the topic, in route
        order), each from ``offset``, else the first message stored at or after
        ``since_ms``, else its oldest kept message, up to its end as of the read: what
        arrives meanwhile may be included, nothing is waited for.
        """
        if count < 1:
            raise AdminError("count must be at least 1")
        reader = self._consumer("")
        left = count
        for queue in queues if queues is not None else await reader.queues(topic):
            if offset is not None:
                at = offset
            else:
                bounds = await reader.query(
                    topic, queue, timestamp_ms=since_ms, with_committed=False
                )
                at = bounds.min_offset if since_ms is None else bounds.timestamp_offset or 0
            while left:
                pulled = await reader.pull(topic, queue, at, min(left, _READ_BATCH))
                if pulled.status in (PullStatus.OFFSET_TOO_SMALL, PullStatus.OFFSET_MOVED):
                    at = pulled.next_offset  # retention deleted them: on from the oldest
                    continue
                if pulled.status not in (PullStatus.FOUND, PullStatus.NO_MATCHED_MESSAGE):
                    break  # at (or past) the queue's end
                for message in pulled.messages[:left]:
                    yield message
                left -= min(len(pulled.messages), left)
                at = pulled.next_offset
            if not left:
                return
