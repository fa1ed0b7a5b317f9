"""Typed calls to one broker's HTTP admin API: health, metrics, topics, consumers and
their offsets, stored messages, and the master's side of a switchover.

Each takes a broker (:data:`~metaq.client.admin.session.BrokerRef`) and answers what the
broker said, decoded; a refusal raises :class:`~metaq.client.errors.BrokerAdminError`
with the broker's words, an answer of another shape
:class:`~metaq.client.errors.BrokerAnswerUnreadable`. Paths are built (and names
percent-encoded) here only, so no caller knows the broker's URLs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from metaq.client.admin.results import (
    BrokerHealth,
    BrokerSettings,
    CommittedOffset,
    ConsumerMember,
    GroupQueueOffset,
    GroupReset,
    MessagesStored,
    MetricSamples,
    ProducerClient,
    ScheduledWork,
    StoredMessage,
    StoredQueue,
    TopicSettings,
    TrafficStats,
)
from metaq.client.admin.session import AdminSession, BrokerRef, decoded, http_address, refused


class BrokerCalls(AdminSession):
    """The calls that each ask one broker."""

    async def health(self, broker: BrokerRef) -> BrokerHealth:
        """A broker's health; ``writable`` is False (not an error) while it refuses writes."""
        status, body = await self.request(broker, "GET", "/health")
        if status not in (200, 503) or not isinstance(body, dict):
            raise refused(broker, status, body, f"answered {status} to GET /health: {body}")
        if set(body) == {"status"}:
            raise refused(
                broker, status, body,
                "said only its status to GET /health: it sets metrics_auth, and shows more "
                "only to a request signed by an admin user (with auth) or a cluster member",
            )  # fmt: skip
        return decoded(broker, status, body, BrokerHealth)

    async def metrics(self, broker: BrokerRef) -> MetricSamples:
        """Every sample of a broker's Prometheus metrics."""
        from prometheus_client.parser import text_string_to_metric_families

        text = await self._http.text(http_address(broker), "/metrics")
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    async def broker_stats(self, broker: BrokerRef) -> TrafficStats:
        """One broker's messages in and out per topic and per consumer group, so far and
        per second over the last minute."""
        return decoded(broker, 200, await self._get(broker, "/stats"), TrafficStats)

    async def broker_config(self, broker: BrokerRef) -> BrokerSettings:
        """The settings one broker may change while it runs, with their values."""
        body = await self._get(broker, "/config")
        return decoded(broker, 200, body, BrokerSettings)

    async def set_broker_config(self, broker: BrokerRef, name: str, value: object) -> object:
        """Change one live setting of one broker (kept across its restarts); the value it
        took. Refused, saying why, for a setting fixed while it runs or a wrong value."""
        path = f"/config/{quote(name, safe='')}"
        status, body = await self.request(broker, "PUT", path, {"value": value})
        if status != 200 or not isinstance(body, dict):
            raise refused(broker, status, body, f"refused the setting: {_error(body)}")
        return body.get("value")

    # --- topics -----------------------------------------------------------------------

    async def broker_topics(self, broker: BrokerRef) -> dict[str, TopicSettings]:
        """Every topic one broker holds, with its settings there."""
        status, body = await self.request(broker, "GET", "/topics")
        if status != 200 or not isinstance(body, dict):
            raise refused(broker, status, body, f"answered {status} to GET /topics: {body}")
        return decoded(broker, status, body.get("topics", {}), dict[str, TopicSettings])

    async def put_topic(
        self, broker: BrokerRef, topic: str, settings: TopicSettings
    ) -> TopicSettings:
        """Create or replace ``topic`` on one broker (a group's master); what it took."""
        status, body = await self.request(broker, "PUT", _topic(topic), settings.to_json())
        if status != 200 or not isinstance(body, dict):
            error = body.get("error", body) if isinstance(body, dict) else body
            raise refused(broker, status, body, f"refused the topic: {error}")
        return decoded(broker, status, body.get(topic, settings.to_json()), TopicSettings)

    async def remove_topic(self, broker: BrokerRef, topic: str) -> bool:
        """Delete ``topic`` from one broker; False when it had no such topic."""
        status, body = await self.request(broker, "DELETE", _topic(topic))
        if status == 404:
            return False
        if status != 200:
            raise refused(broker, status, body, f"refused to delete: {body}")
        return True

    async def broker_queues(self, broker: BrokerRef, topic: str) -> list[StoredQueue]:
        """Each queue of ``topic`` on one broker: its offsets and its last store time."""
        body = await self._get(broker, f"/queues?{urlencode({'topic': topic})}")
        return decoded(broker, 200, body.get("queues"), list[StoredQueue])

    async def stored_counts(self, broker: BrokerRef) -> dict[str, int]:
        """Per topic, the messages one broker has stored so far (the sum of its queues'
        max offsets; two samples make a rate of messages in)."""
        body = await self._get(broker, "/queues/stored")
        return decoded(broker, 200, body.get("topics"), dict[str, int])

    async def read_queue(
        self,
        broker: BrokerRef,
        topic: str,
        queue_id: int,
        *,
        offset: int | None = None,
        from_ms: int | None = None,
        to_ms: int | None = None,
        limit: int = 32,
    ) -> list[StoredMessage]:
        """At most ``limit`` (1-1000) stored messages of one queue, in order: from queue
        ``offset``, or (with ``from_ms``) those stored from that time until ``to_ms``
        (or now); give one of ``offset`` and ``from_ms``."""
        query = {
            name: value
            for name, value in (
                ("offset", offset),
                ("from_ms", from_ms),
                ("to_ms", to_ms),
                ("limit", limit),
            )
            if value is not None
        }
        path = f"/queues/{quote(topic, safe='')}/{queue_id}/messages?{urlencode(query)}"
        body = await self._get(broker, path)
        return decoded(broker, 200, body.get("messages"), list[StoredMessage])

    async def store_message(
        self,
        broker: BrokerRef,
        topic: str,
        body: str,
        *,
        tags: str = "",
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
    ) -> MessagesStored:
        """Store one text message in ``topic`` on one broker (its group's master) in a
        queue it picks: a test message, answered as a send is, with what durability it
        reached."""
        sent = {"body": body, "tags": tags, "keys": list(keys), "properties": properties or {}}
        return await self._stored(broker, f"{_topic(topic)}/messages", sent)

    # --- consumers --------------------------------------------------------------------

    async def consumers(self, broker: BrokerRef) -> dict[str, list[ConsumerMember]]:
        """The live members of each consumer group that one broker knows."""
        body = await self._get(broker, "/consumers")
        return decoded(broker, 200, body, dict[str, list[ConsumerMember]])

    async def producers(self, broker: BrokerRef) -> list[ProducerClient]:
        """The producers connected to one broker that said who they are."""
        body = await self._get(broker, "/producers")
        return decoded(broker, 200, body.get("producers"), list[ProducerClient])

    async def scheduled(self, broker: BrokerRef) -> ScheduledWork:
        """Delayed messages (per tier of the timer wheel) and transactions waiting for a
        check-back on one broker (its group's master tracks them)."""
        body = await self._get(broker, "/scheduled")
        return decoded(broker, 200, body, ScheduledWork)

    async def consumer_offsets(self, broker: BrokerRef) -> list[CommittedOffset]:
        """Every committed consumer offset one broker holds, with its lag."""
        status, body = await self.request(broker, "GET", "/offsets")
        if status != 200:
            raise refused(broker, status, body, f"answered {status} to GET /offsets: {body}")
        return decoded(broker, status, body, list[CommittedOffset])

    async def group_offsets(self, broker: BrokerRef, group: str) -> list[GroupQueueOffset]:
        """``group``'s committed offset in each queue of one broker, with its lag in
        messages and in time and the member that pulled the queue last."""
        body = await self._get(broker, f"{_group(group)}/offsets")
        return decoded(broker, 200, body.get("offsets"), list[GroupQueueOffset])

    async def reset_group(
        self, broker: BrokerRef, group: str, topic: str, timestamp_ms: int, *, dry_run: bool
    ) -> GroupReset:
        """Commit for ``group``, on every read queue of ``topic`` on one broker (its
        group's master), the first offset stored at or after ``timestamp_ms``; a dry run
        answers the same offsets and commits nothing."""
        sent = {"topic": topic, "timestamp_ms": timestamp_ms, "dry_run": dry_run}
        status, body = await self.request(broker, "POST", f"{_group(group)}/reset", sent)
        if status != 200:
            raise refused(broker, status, body, f"refused the reset: {_error(body)}")
        return decoded(broker, status, body, GroupReset)

    async def delete_group_offsets(
        self, broker: BrokerRef, group: str, *, force: bool = False
    ) -> tuple[int, list[str]]:
        """Forget ``group``'s committed offsets on one broker (its group's master): how
        many it had, and its live members there (refused, naming them, unless
        ``force``). (0, []) when the broker knows nothing of the group."""
        path = f"{_group(group)}?force=true" if force else _group(group)
        status, body = await self.request(broker, "DELETE", path)
        if status == 404:
            return 0, []
        if status != 200:
            raise refused(broker, status, body, f"refused to delete the group: {_error(body)}")
        answer = decoded(broker, status, body, dict[str, Any])
        return int(answer.get("deleted_offsets", 0)), list(answer.get("live_members", []))

    async def resend_dead_letters(
        self, broker: BrokerRef, group: str, msg_ids: Sequence[str]
    ) -> MessagesStored:
        """Store ``group``'s dead letters with these ids (theirs, or the ones they first
        had) in their original topic again, as new messages, on one broker (the master
        holding them)."""
        sent = {"msg_ids": list(msg_ids)}
        return await self._stored(broker, f"{_group(group)}/dlq/resend", sent)

    # --- messages ---------------------------------------------------------------------

    async def broker_message(self, broker: BrokerRef, msg_id: str) -> StoredMessage | None:
        """The message with this id on one broker; None when it has none."""
        status, body = await self.request(broker, "GET", f"/messages/{quote(msg_id, safe='')}")
        if status == 404:
            return None
        if status != 200:
            raise refused(broker, status, body, f"answered HTTP {status}: {_error(body)}")
        return decoded(broker, status, body, StoredMessage)

    async def broker_messages_by_key(
        self, broker: BrokerRef, topic: str, key: str, *, limit: int = 32
    ) -> list[StoredMessage]:
        """At most ``limit`` (1-1000) messages of ``topic`` carrying ``key`` on one
        broker, newest first."""
        query = urlencode({"topic": topic, "key": key, "limit": limit})
        body = await self._get(broker, f"/messages?{query}")
        return decoded(broker, 200, body.get("messages"), list[StoredMessage])

    # --- switchover -------------------------------------------------------------------

    async def handover(self, broker: BrokerRef, to: int, *, timeout_ms: int, fence_ms: int) -> int:
        """Step one of a switchover: the master ``broker`` stops taking writes until
        slave ``to`` holds its whole log (writes resume by themselves after
        ``fence_ms``); the log end handed over."""
        body = {"to": to, "timeout_ms": timeout_ms, "fence_ms": fence_ms}
        status, reply = await self.request(broker, "POST", "/replication/handover", body)
        if status != 200 or not isinstance(reply, dict):
            raise refused(broker, status, reply, f"refused the handover: {reply}")
        return decoded(broker, status, reply.get("end"), int)

    async def resume_writes(self, broker: BrokerRef) -> None:
        """Undo a handover: the master takes writes again."""
        status, reply = await self.request(broker, "POST", "/replication/resume")
        if status != 200:
            raise refused(broker, status, reply, f"did not resume writes: {reply}")

    # --- helpers ----------------------------------------------------------------------

    async def _get(self, broker: BrokerRef, path: str) -> dict[str, Any]:
        """The JSON object a GET answers with 200; the broker's refusal otherwise."""
        status, body = await self.request(broker, "GET", path)
        if status != 200:
            raise refused(broker, status, body, f"answered HTTP {status}: {_error(body)}")
        return decoded(broker, status, body, dict[str, Any])

    async def _stored(self, broker: BrokerRef, path: str, sent: object) -> MessagesStored:
        status, body = await self.request(broker, "POST", path, sent)
        if status != 200:
            raise refused(broker, status, body, f"did not store: {_error(body)}")
        return decoded(broker, status, body, MessagesStored)


def _topic(topic: str) -> str:
    return f"/topics/{quote(topic, safe='')}"


def _group(group: str) -> str:
    return f"/groups/{quote(group, safe='')}"


def _error(body: object) -> object:
    """The broker's own words for a refusal, or its whole answer."""
    return body.get("error", body) if isinstance(body, dict) else body
