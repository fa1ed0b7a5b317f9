"""Consumer groups: the list of them, one described and one deleted, their progress and
lag (through the data-plane consumer), a reset of their offsets by time (through the
masters' admin API, which tells the live members), and their dead letters (read and sent
again through the consumer and producer)."""

from __future__ import annotations

import asyncio
from typing import Final

from metaq.client.admin.results import (
    Connections,
    ConsumerMember,
    GroupDeleted,
    GroupDescription,
    GroupOffsetRow,
    GroupSummary,
    ProducerClient,
    QueueProgress,
    QueueReset,
    TopicReset,
)
from metaq.client.admin.topics import TopicAdmin
from metaq.client.errors import AdminError
from metaq.client.message import Message
from metaq.client.results import SendResult
from metaq.client.retry import (
    PROP_FAILURE,
    PROP_ORIGIN_MSG_ID,
    PROP_RETRY_TOPIC,
)
from metaq.common.errors import MetaqError
from metaq.common.model import QueueRoute
from metaq.common.names import dlq_topic, retry_topic

_RETRY_PROPS: Final = frozenset({PROP_FAILURE, PROP_ORIGIN_MSG_ID, PROP_RETRY_TOPIC})
_DLQ_PULL_BATCH: Final = 256


class UnknownGroup(AdminError):
    """No master holds offsets or live members of the consumer group."""

    def __init__(self, group: str, known: list[str]) -> None:
        shown = ", ".join(known[:20]) + (" ..." if len(known) > 20 else "") or "none"
        super().__init__(
            f"no consumer group {group!r}: no master holds its offsets or live members "
            f"(groups known: {shown}; see `metaq group list`)"
        )
        self.group = group


class GroupAdmin(TopicAdmin):
    """The calls on consumer groups across the cluster."""

    async def list_groups(self) -> list[GroupSummary]:
        """Every consumer group some master holds offsets or live members of, by name."""
        masters = await self.masters()
        offsets, live = await asyncio.gather(
            asyncio.gather(*(self.consumer_offsets(m) for m in masters)),
            asyncio.gather(*(self.consumers(m) for m in masters)),
        )
        topics: dict[str, set[str]] = {}
        lag: dict[str, int] = {}
        for answer in offsets:
            for row in answer:
                topics.setdefault(row.group, set()).add(row.topic)
                lag[row.group] = lag.get(row.group, 0) + row.lag
        members: dict[str, set[str]] = {}
        for groups in live:
            for group, found in groups.items():
                members.setdefault(group, set()).update(m.client_id for m in found)
                topics.setdefault(group, set()).update(t for m in found for t, _ in m.subscriptions)
        return [
            GroupSummary(g, sorted(topics[g]), sorted(members.get(g, ())), lag.get(g, 0))
            for g in sorted(topics.keys() | members.keys())
        ]

    async def connections(self, *, group: str = "", topic: str = "") -> Connections:
        """Who is connected to the cluster's live brokers: consumers of ``group`` (or
        subscribed to ``topic``) and producers of producer group ``group`` (with
        ``topic`` alone, none: a producer does not say which topics it sends to).
        Neither: everyone. UnknownGroup / UnknownTopic when nothing of that name is
        known to the cluster."""
        view = await self.cluster()
        brokers = [b for b in view.brokers() if b.state.http_address]
        live, producers = await asyncio.gather(
            asyncio.gather(*(self.consumers(b) for b in brokers)),
            asyncio.gather(*(self.producers(b) for b in brokers)),
        )
        consumers: dict[tuple[str, str], tuple[ConsumerMember, list[str]]] = {}
        for broker, groups in zip(brokers, live, strict=True):
            for name, members in groups.items():
                if group and name != group:
                    continue
                for m in members:
                    if topic and all(t != topic for t, _ in m.subscriptions):
                        continue
                    entry = consumers.setdefault((name, m.client_id), (m, []))
                    entry[1].append(broker.broker_name)
        senders: dict[tuple[str, str], tuple[ProducerClient, list[str]]] = {}
        for broker, found in zip(brokers, producers, strict=True):
            for p in found:
                if (group and p.group != group) or (topic and not group):
                    continue
                senders.setdefault((p.group, p.client_id), (p, []))[1].append(broker.broker_name)
        if group and not consumers and not senders:
            known = {g.group for g in await self.list_groups()}
            known |= {p.group for found in producers for p in found}
            if group not in known:
                raise UnknownGroup(group, sorted(known))
        if topic and not consumers:
            await self.route(topic)  # UnknownTopic when no broker serves it
        return Connections(
            [(g, m, sorted(set(b))) for (g, _), (m, b) in sorted(consumers.items())],
            [(p, sorted(set(b))) for _, (p, b) in sorted(senders.items())],
        )

    async def describe_group(self, group: str) -> GroupDescription:
        """``group``'s live members and its committed offsets on every master, with lag;
        UnknownGroup when no master knows it."""
        masters = await self.masters()
        offsets, live = await asyncio.gather(
            asyncio.gather(*(self.group_offsets(m, group) for m in masters)),
            asyncio.gather(*(self.consumers(m) for m in masters)),
        )
        members: dict[str, ConsumerMember] = {}
        for groups in live:
            for member in groups.get(group, []):
                members.setdefault(member.client_id, member)
        rows = [
            GroupOffsetRow(m.broker_name, row)
            for m, answer in zip(masters, offsets, strict=True)
            for row in answer
        ]
        if not members and not rows:
            raise UnknownGroup(group, [g.group for g in await self.list_groups()])
        return GroupDescription(group, [members[c] for c in sorted(members)], rows)

    async def delete_group(
        self,
        group: str,
        *,
        force: bool = False,
        with_retry_topic: bool = False,
        with_dlq_topic: bool = False,
    ) -> GroupDeleted:
        """Delete ``group``: every master forgets its committed offsets (and its slaves,
        through the journal), and, when asked, its retry (``%RETRY%group``) and
        dead-letter (``%DLQ%group``) topics go too.

        Refused (AdminError naming them) while the group has live members, unless
        ``force``: forced, members that go on consuming commit their positions again
        and the group comes back. UnknownGroup when no master knows the group.
        """
        summaries = {g.group: g for g in await self.list_groups()}
        found = summaries.get(group)
        if found is None:
            raise UnknownGroup(group, sorted(summaries))
        if found.members and not force:
            raise AdminError(
                f"consumer group {group!r} has live members ({', '.join(found.members)}): "
                "stop them first, or force the delete (they would commit their positions "
                "again)"
            )
        masters = await self.masters()
        answers = await asyncio.gather(
            *(self.delete_group_offsets(m, group, force=force) for m in masters)
        )
        deleted = {
            m.broker_name: count for m, (count, _) in zip(masters, answers, strict=True) if count
        }
        topics: dict[str, list[str]] = {}
        wanted = [(with_retry_topic, retry_topic(group)), (with_dlq_topic, dlq_topic(group))]
        for asked, topic in wanted:
            if asked:
                removed = [await self.remove_topic(m, topic) for m in masters]
                topics[topic] = [m.broker_name for m, r in zip(masters, removed, strict=True) if r]
        return GroupDeleted(group, deleted, found.members, topics)

    async def progress(self, group: str, topic: str) -> list[QueueProgress]:
        """Every readable queue of ``topic`` with ``group``'s committed offset and lag."""
        consumer = self._consumer(group)
        queues = await consumer.queues(topic)
        answers = await asyncio.gather(*(consumer.query(topic, q) for q in queues))
        return [QueueProgress(q, a) for q, a in zip(queues, answers, strict=True)]

    async def topic_groups(self, topic: str) -> list[str]:
        """The consumer groups with an offset committed on ``topic``, as the masters
        serving it hold them, sorted."""
        route = await self.route(topic)
        masters = await self.masters([g.broker_name for g in route.groups])
        answers = await asyncio.gather(*(self.consumer_offsets(b) for b in masters))
        return sorted({c.group for answer in answers for c in answer if c.topic == topic})

    async def reset_offsets(
        self, group: str, topic: str, timestamp_ms: int, *, dry_run: bool = False
    ) -> TopicReset:
        """Commit for ``group``, on every readable queue of ``topic``, the first offset
        stored at or after ``timestamp_ms`` (the queue's end when every message is
        older), through each serving group's master (:meth:`reset_group`).

        The reset reaches live members: each drops what it has in flight at its next
        pull (at once when it waits at a queue's end) and goes on from the new offsets,
        and their commits from before the reset are refused, so it sticks (RocketMQ's
        resetOffsetByTime pushes it to the clients for the same reason). A dry run
        answers the same offsets and changes nothing.
        """
        route = await self.route(topic)
        masters = await self.masters([g.broker_name for g in route.groups])
        answers = await asyncio.gather(
            *(self.reset_group(m, group, topic, timestamp_ms, dry_run=dry_run) for m in masters)
        )
        routes = {(q.broker_name, q.queue_id): q for q in route.read_queues}
        queues = [
            QueueReset(
                routes.get((m.broker_name, q.queue_id))
                or QueueRoute(
                    m.broker_name, m.state.data_address, q.queue_id, m.state.computer_room
                ),
                q.before,
                q.after,
            )
            for m, answer in zip(masters, answers, strict=True)
            for q in answer.queues
        ]
        live = sorted({c for answer in answers for c in answer.live_members})
        unreplicated = [
            m.broker_name
            for m, answer in zip(masters, answers, strict=True)
            if not dry_run and not answer.replicated
        ]
        return TopicReset(queues, live, unreplicated)

    async def dead_letters(self, group: str) -> list[Message]:
        """Every dead letter of ``group`` (``%DLQ%<group>``), in queue order: messages its
        handler failed on ``max_reconsume_times`` times (see :mod:`metaq.client.retry`)."""
        topic = dlq_topic(group)
        reader = self._consumer(f"{group}-dlq-tool")
        try:
            route = await reader.routes.route(topic)
        except MetaqError as exc:
            raise AdminError(f"group {group!r} has no dead letters ({exc})") from None
        found: list[Message] = []
        for queue in route.read_queues:
            offset = 0
            while True:
                result = await reader.pull(topic, queue, offset, _DLQ_PULL_BATCH, 0)
                if not result.messages:
                    break
                found += result.messages
                offset = result.next_offset
        return found

    async def resend_dead_letter(self, letter: Message) -> SendResult:
        """Send a dead letter to its original topic again, as a new message (same body,
        tags, keys and user properties) for every group subscribed to it."""
        producer = await self._producer_started()
        topic = letter.properties[PROP_RETRY_TOPIC]
        properties = {k: v for k, v in letter.properties.items() if k not in _RETRY_PROPS}
        return await producer.send(
            topic, letter.body, tags=letter.tags, keys=letter.keys, properties=properties
        )
