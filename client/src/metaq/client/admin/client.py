"""The admin library: cluster, topics, consumer groups, messages and failover.

:class:`Admin` is what the ``metaq`` CLI, the nameservers' console, Spark's planner and
the tests call instead of speaking HTTP or gRPC themselves (RocketMQ's
``DefaultMQAdminExt`` serves its ``mqadmin`` and its dashboard the same way). It talks to
the nameservers over gRPC (cluster info, routes, assignment, the controller's
switchover), to the brokers' HTTP admin APIs (topics, health, metrics, message lookups,
handover) and, for offsets and dead letters, through the data-plane consumer and
producer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, urlencode

import msgspec

from metaq.client.admin.broker_http import BrokerHttp
from metaq.client.admin.results import (
    MAX_QUEUES,
    MIN_QUEUES,
    BrokerHealth,
    CommittedOffset,
    MetricSamples,
    QueueProgress,
    QueueReset,
    QueueStats,
    StoredMessage,
    SwitchoverResult,
    TopicListing,
    TopicSettings,
)
from metaq.client.connection import ConnectionPool
from metaq.client.errors import AdminError, BrokerAdminError, UnknownTopic
from metaq.client.message import Message
from metaq.client.producer import Producer
from metaq.client.pull_consumer import PullConsumer
from metaq.client.results import SendResult
from metaq.client.retry import PROP_FAILURE, PROP_ORIGIN_MSG_ID, PROP_RETRY_TOPIC, dlq_topic
from metaq.client.routes import (
    BrokerInfo,
    ClusterView,
    RouteCache,
    cluster_view_from_proto,
)
from metaq.common.auth import ClusterSecret, call_metadata
from metaq.common.errors import MetaqError
from metaq.common.model import QueueRoute, TopicRoute
from metaq.common.tls import TlsConfig
from metaq.common.users import Credentials, load_credentials
from metaq.common.v1 import control_pb2 as pb

if TYPE_CHECKING:
    from metaq.common.v1.control_pb2_grpc import NameServerAsyncStub

BrokerRef = BrokerInfo | str
"""A broker to call: as the nameserver knows it, or its HTTP address (``host:port``, or a
base URL with the scheme)."""

ADMIN_GROUP: Final = "metaq-admin"
"""The consumer group named in offset queries made for bounds only; nothing is committed
under it."""
_ROUTE_POLL_S: Final = 0.05
_RETRY_PROPS: Final = frozenset({PROP_FAILURE, PROP_ORIGIN_MSG_ID, PROP_RETRY_TOPIC})
_DLQ_PULL_BATCH: Final = 256


class TopicSettingsError(AdminError):
    """A queue count out of range; ``field`` names it (``read_queues``, ``write_queues``)."""

    def __init__(self, field: str) -> None:
        super().__init__(f"{field} must be between {MIN_QUEUES} and {MAX_QUEUES}")
        self.field = field


class TopicExists(AdminError):
    """``create_topic`` found the topic on a chosen broker group already."""

    def __init__(self, topic: str, group: str) -> None:
        super().__init__(f"topic {topic} already exists on {group}")
        self.topic = topic
        self.group = group


class TopicMissing(AdminError):
    """``update_topic`` did not find the topic on a chosen broker group."""

    def __init__(self, topic: str, group: str) -> None:
        super().__init__(f"topic {topic} does not exist on {group}")
        self.topic = topic
        self.group = group


@dataclass(frozen=True, slots=True)
class TopicPlacement:
    """A topic's settings as one broker group's master took them."""

    broker: BrokerInfo
    settings: TopicSettings


class Admin:
    """Administer a metaq cluster; an async context manager, like the producer.

    ``nameservers`` are asked for what the cluster is (any one will do; see
    :class:`~metaq.client.routes.RouteCache`); without them only the broker-level calls
    (those taking a broker) work. Every call is bounded by ``timeout_s``. ``credentials``
    (by default from ``METAQ_CREDENTIALS_FILE`` or ``METAQ_ACCESS_KEY`` /
    ``METAQ_SECRET_KEY``) sign every call on clusters with auth; ``cluster_secret`` is
    what the controller requires for a switchover. With ``tls`` every call is TLS.
    ``routes`` shares another client's route cache (and its nameserver channels).

    Use it as an async context manager (or call :meth:`close`): calls then share one HTTP
    session and one set of connections. A call that takes a broker also works on an Admin
    made just for it (``await Admin().health(address)``): it opens and closes its own
    session.

    Failures raise :class:`~metaq.client.errors.AdminError` (a broker's refusal:
    :class:`~metaq.client.errors.BrokerAdminError`, with its HTTP status), or the client's
    usual :class:`~metaq.client.errors.NoNameServer` and
    :class:`~metaq.client.errors.UnknownTopic`; every message says what to do.
    """

    def __init__(
        self,
        nameservers: Sequence[str] | str = (),
        *,
        timeout_s: float = 5.0,
        credentials: Credentials | None = None,
        tls: TlsConfig | None = None,
        cluster_secret: ClusterSecret | None = None,
        routes: RouteCache | None = None,
    ) -> None:
        if isinstance(nameservers, str):
            nameservers = [nameservers]
        self.timeout_s = timeout_s
        self.credentials = credentials or load_credentials()
        self.tls = tls
        self._secret = cluster_secret
        self._own_routes = routes is None and bool(nameservers)
        if routes is None and nameservers:
            routes = RouteCache(
                nameservers, rpc_timeout_s=timeout_s, credentials=self.credentials, tls=tls
            )
        self._routes = routes
        self._http = BrokerHttp(timeout_s=timeout_s, tls=tls, credentials=self.credentials)
        self._connections: ConnectionPool | None = None
        self._producer: Producer | None = None

    @classmethod
    def cluster_member(
        cls, secret: ClusterSecret | None, *, timeout_s: float, tls: TlsConfig | None = None
    ) -> Admin:
        """An Admin of brokers only that proves ``secret`` to them (a cluster member, as a
        nameserver's console is) rather than a user's credentials; one session serves
        its calls until :meth:`close`."""
        admin = cls(timeout_s=timeout_s, tls=tls)
        admin.credentials = None
        admin._http = BrokerHttp(timeout_s=timeout_s, tls=tls, secret=secret)
        admin._http.open()
        return admin

    # --- lifecycle --------------------------------------------------------------------

    async def close(self) -> None:
        """Close what this Admin opened (sessions, connections, its route cache)."""
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.close()
        if self._connections is not None:
            connections, self._connections = self._connections, None
            await connections.close()
        await self._http.close()
        if self._own_routes and self._routes is not None:
            await self._routes.stop()

    async def __aenter__(self) -> Admin:
        self._http.open()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    @property
    def routes(self) -> RouteCache:
        if self._routes is None:
            raise AdminError("this Admin was made without nameservers; give their addresses")
        return self._routes

    # --- the cluster (nameservers) ----------------------------------------------------

    async def cluster(self, name: str = "") -> ClusterView:
        """Every cluster (or just ``name``), its broker groups and brokers."""
        answered: list[str] = []

        async def call(stub: NameServerAsyncStub) -> pb.GetClusterInfoResponse:
            return await stub.GetClusterInfo(
                pb.GetClusterInfoRequest(cluster=name), timeout=self.routes.rpc_timeout_s
            )

        reply = await self.routes.call(call, answered=answered)
        return cluster_view_from_proto(reply, answered[0] if answered else "")

    async def route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """The topic's route as clients get it (UnknownTopic when no broker serves it)."""
        return await self.routes.route(topic, refresh=refresh)

    async def masters(
        self, brokers: Sequence[str] | None = None, *, cluster: str = ""
    ) -> list[BrokerInfo]:
        """The live master of each broker group named in ``brokers`` (every group of the
        cluster when None), in that order (by name when all)."""
        view = await self.cluster(cluster)
        masters = {b.broker_name: b for b in view.masters()}
        if not brokers:
            if not masters:
                raise AdminError("the nameserver knows no live master broker")
            return [masters[name] for name in sorted(masters)]
        missing = [name for name in brokers if name not in masters]
        if missing:
            known = ", ".join(sorted(masters)) or "none"
            raise AdminError(
                f"no live master for broker group(s) {', '.join(missing)} (known: {known})"
            )
        return [masters[name] for name in brokers]

    async def assignment(
        self,
        group: str,
        topic: str,
        strategy: str,
        members: Sequence[tuple[str, str]],
        previous: Mapping[str, Sequence[QueueRoute]] | None = None,
    ) -> dict[str, list[QueueRoute]]:
        """The topic's readable queues shared out among ``members`` ((consumer id,
        computer room) pairs) by ``strategy``; sticky to ``previous`` when given.

        Every member is a key of the answer, possibly with no queues. NameServerError for
        an unknown strategy, UnknownTopic, NoNameServer.
        """
        routes = self.routes
        request = pb.GetAssignmentRequest(
            consumer_group=group,
            topic=topic,
            strategy=strategy,
            members=[pb.AssignmentMember(consumer_id=c, computer_room=r) for c, r in members],
        )
        for consumer_id, queues in (previous or {}).items():
            request.previous.add(
                consumer_id=consumer_id,
                queues=[
                    pb.MessageQueue(
                        topic=topic,
                        broker_name=q.broker_name,
                        queue_id=q.queue_id,
                        computer_room=q.computer_room,
                    )
                    for q in queues
                ],
            )
        reply = await routes.call(
            lambda stub: stub.GetAssignment(request, timeout=routes.rpc_timeout_s),
            not_found=lambda detail: UnknownTopic(topic, detail),
        )
        route = await routes.route(topic)
        known = {(q.broker_name, q.queue_id): q for q in route.read_queues}
        wanted = {(q.broker_name, q.queue_id) for m in reply.assignment for q in m.queues}
        if not wanted <= known.keys():
            route = await routes.route(topic, refresh=True)
            known = {(q.broker_name, q.queue_id): q for q in route.read_queues}
        out: dict[str, list[QueueRoute]] = {}
        for member in reply.assignment:
            out[member.consumer_id] = [
                known.get(
                    (q.broker_name, q.queue_id),
                    QueueRoute(q.broker_name, "", q.queue_id, q.computer_room),
                )
                for q in member.queues
            ]
        return out

    async def switchover(
        self, group: str, to: int, *, catch_up_timeout_s: float = 5.0
    ) -> SwitchoverResult:
        """Make broker ``to`` the master of ``group`` with near-zero unavailability.

        The master stops taking writes and waits until ``to`` holds its whole log (at most
        ``catch_up_timeout_s``); then the controller makes ``to`` master at the next epoch
        and the old master follows it. Nothing is lost, under sync or async replication.
        If the controller refuses, the old master takes writes again. Nameservers with a
        cluster secret require ``cluster_secret``.
        """
        view = await self.cluster()
        found = next((g for c in view.clusters for g in c.groups if g.broker_name == group), None)
        if found is None:
            raise AdminError(f"no broker group {group!r} is registered")
        if found.in_sync_ids is None:
            raise AdminError(f"group {group!r} is not managed by the failover controller")
        master = found.master
        if master is None:
            raise AdminError(f"group {group!r} has no master to hand over from right now")
        if master.broker_id == to:
            raise AdminError(f"broker {to} already is the master of {group!r}")
        if to not in found.in_sync_ids:
            raise AdminError(
                f"broker {to} is not in the in-sync set {list(found.in_sync_ids)} of "
                f"{group!r}; wait until it has caught up"
            )
        started = time.monotonic()
        timeout_ms = round(catch_up_timeout_s * 1000)
        try:
            end = await self.handover(
                master, to, timeout_ms=timeout_ms, fence_ms=timeout_ms + 10_000
            )
        except BrokerAdminError as exc:
            if exc.status == 0:
                raise
            shown = exc.body if exc.body is not None else exc.detail
            raise AdminError(f"master {master.broker_id} refused the handover: {shown}") from None
        try:
            control = await self._controller_switchover(group, to, found.epoch)
        except Exception:
            await self.resume_writes(master)
            raise
        elapsed_ms = (time.monotonic() - started) * 1000
        return SwitchoverResult(group, control.master_id, control.epoch, end, elapsed_ms)

    async def _controller_switchover(
        self, broker_name: str, broker_id: int, expected_epoch: int
    ) -> pb.GroupControl:
        routes = self.routes
        request = pb.SwitchoverRequest(
            broker_name=broker_name, broker_id=broker_id, expected_epoch=expected_epoch
        )

        async def call(stub: NameServerAsyncStub) -> pb.SwitchoverResponse:
            body = request.SerializeToString(deterministic=True)
            return await stub.Switchover(
                request,
                timeout=routes.rpc_timeout_s,
                # Signed per attempt: a retry on another nameserver is a fresh proof.
                metadata=call_metadata(self._secret, "Switchover", body, time.time()),
            )

        reply = await routes.call(call)
        return reply.control

    # --- topics -----------------------------------------------------------------------

    async def broker_topics(self, broker: BrokerRef) -> dict[str, TopicSettings]:
        """Every topic one broker holds, with its settings there."""
        status, body = await self.request(broker, "GET", "/topics")
        if status != 200:
            raise _refused(broker, status, body, f"answered {status} to GET /topics: {body}")
        return msgspec.convert(body.get("topics", {}), dict[str, TopicSettings])

    async def put_topic(
        self, broker: BrokerRef, topic: str, settings: TopicSettings
    ) -> TopicSettings:
        """Create or replace ``topic`` on one broker (a group's master); what it took."""
        path = f"/topics/{quote(topic, safe='')}"
        status, body = await self.request(broker, "PUT", path, settings.to_json())
        if status != 200:
            error = body.get("error", body) if isinstance(body, dict) else body
            raise _refused(broker, status, body, f"refused the topic: {error}")
        return msgspec.convert(body.get(topic, settings.to_json()), TopicSettings)

    async def remove_topic(self, broker: BrokerRef, topic: str) -> bool:
        """Delete ``topic`` from one broker; False when it had no such topic."""
        status, body = await self.request(broker, "DELETE", f"/topics/{quote(topic, safe='')}")
        if status == 404:
            return False
        if status != 200:
            raise _refused(broker, status, body, f"refused to delete: {body}")
        return True

    async def create_topic(
        self,
        topic: str,
        settings: TopicSettings | None = None,
        *,
        brokers: Sequence[str] | None = None,
        cluster: str = "",
        wait: bool = True,
    ) -> list[TopicPlacement]:
        """Create ``topic`` on the master of each broker group in ``brokers`` (default:
        every master of the cluster) and, with ``wait``, wait until the nameserver routes
        it there. TopicExists when a group has it already (nothing is changed then)."""
        wanted = settings or TopicSettings()

        def plan(broker: BrokerInfo, existing: TopicSettings | None) -> TopicSettings:
            if existing is not None:
                raise TopicExists(topic, broker.broker_name)
            return wanted

        return await self._put_topics(topic, plan, brokers, cluster, wait)

    async def update_topic(
        self,
        topic: str,
        *,
        read_queues: int | None = None,
        write_queues: int | None = None,
        perm: str | None = None,
        ordered: bool | None = None,
        brokers: Sequence[str] | None = None,
        cluster: str = "",
        wait: bool = True,
    ) -> list[TopicPlacement]:
        """Change the given settings of ``topic`` on each chosen group's master; the
        others keep their value there. TopicMissing when a group does not have it."""
        changes: dict[str, Any] = {
            "read_queues": read_queues,
            "write_queues": write_queues,
            "perm": perm,
            "ordered": ordered,
        }
        changed = {key: value for key, value in changes.items() if value is not None}

        def plan(broker: BrokerInfo, existing: TopicSettings | None) -> TopicSettings:
            if existing is None:
                raise TopicMissing(topic, broker.broker_name)
            return msgspec.structs.replace(existing, **changed)

        return await self._put_topics(topic, plan, brokers, cluster, wait)

    async def _put_topics(
        self,
        topic: str,
        plan: Callable[[BrokerInfo, TopicSettings | None], TopicSettings],
        brokers: Sequence[str] | None,
        cluster: str,
        wait: bool,
    ) -> list[TopicPlacement]:
        """Every chosen master is checked before any is changed."""
        plans = []
        for broker in await self.masters(brokers, cluster=cluster):
            settings = plan(broker, (await self.broker_topics(broker)).get(topic))
            for field in ("read_queues", "write_queues"):
                if not MIN_QUEUES <= getattr(settings, field) <= MAX_QUEUES:
                    raise TopicSettingsError(field)
            plans.append((broker, settings))
        placed = [TopicPlacement(b, await self.put_topic(b, topic, s)) for b, s in plans]
        if wait:
            await self.wait_routed(topic, {p.broker.broker_name: p.settings for p in placed})
        return placed

    async def wait_routed(
        self, topic: str, expected: Mapping[str, TopicSettings], timeout_s: float | None = None
    ) -> TopicRoute:
        """Poll the topic's route until every named broker group shows the queue counts
        given (brokers report topic changes to the nameservers on their next
        registration)."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                route: TopicRoute | None = await self.routes.route(topic, refresh=True)
            except UnknownTopic:
                route = None
            if route is not None and _route_matches(route, expected):
                return route
            if time.monotonic() > deadline:
                raise AdminError(
                    f"the brokers took the change, but the nameserver did not route it within "
                    f"{timeout_s} s (are the brokers registered with this nameserver?)"
                )
            await asyncio.sleep(_ROUTE_POLL_S)  # poll interval of a deadline-bound wait

    async def delete_topic(
        self, topic: str, *, brokers: Sequence[str] | None = None, cluster: str = ""
    ) -> list[str]:
        """Delete ``topic`` from each chosen group's master (default: every master); the
        groups that had it. Stored messages stay until retention removes them."""
        deleted = [
            broker.broker_name
            for broker in await self.masters(brokers, cluster=cluster)
            if await self.remove_topic(broker, topic)
        ]
        if not deleted:
            raise AdminError(f"topic {topic} does not exist on any chosen broker")
        return deleted

    async def list_topics(
        self, *, brokers: Sequence[str] | None = None, cluster: str = ""
    ) -> list[TopicListing]:
        """The topics of each chosen group's master, sorted by (topic, group)."""
        rows = [
            TopicListing(name, broker.broker_name, settings)
            for broker in await self.masters(brokers, cluster=cluster)
            for name, settings in (await self.broker_topics(broker)).items()
        ]
        return sorted(rows, key=lambda row: (row.topic, row.group))

    async def topic_stats(self, topic: str) -> list[QueueStats]:
        """Each readable queue's bounds, asked of the broker that serves it."""
        consumer = self._consumer(ADMIN_GROUP)
        queues = await consumer.queues(topic)
        answers = await asyncio.gather(
            *(consumer.query(topic, q, with_committed=False) for q in queues)
        )
        return [
            QueueStats(q, a.min_offset, a.max_offset) for q, a in zip(queues, answers, strict=True)
        ]

    # --- consumer groups --------------------------------------------------------------

    async def progress(self, group: str, topic: str) -> list[QueueProgress]:
        """Every readable queue of ``topic`` with ``group``'s committed offset and lag."""
        consumer = self._consumer(group)
        queues = await consumer.queues(topic)
        answers = await asyncio.gather(*(consumer.query(topic, q) for q in queues))
        return [QueueProgress(q, a) for q, a in zip(queues, answers, strict=True)]

    async def reset_offsets(self, group: str, topic: str, timestamp_ms: int) -> list[QueueReset]:
        """Commit for ``group``, on every readable queue of ``topic``, the first offset
        stored at or after ``timestamp_ms`` (the queue's end when every message is older).

        Running members of the group keep committing their own positions and would undo
        the reset: stop them first.
        """
        consumer = self._consumer(group)
        queues = await consumer.queues(topic)

        async def one(queue: QueueRoute) -> QueueReset:
            found = await consumer.query(topic, queue, timestamp_ms=timestamp_ms)
            assert found.timestamp_offset is not None, "the broker ignored timestamp_ms"
            await consumer.commit(topic, queue, found.timestamp_offset)
            return QueueReset(queue, found.committed, found.timestamp_offset)

        return list(await asyncio.gather(*(one(q) for q in queues)))

    async def consumer_offsets(self, broker: BrokerRef) -> list[CommittedOffset]:
        """Every committed consumer offset one broker holds, with its lag."""
        status, body = await self.request(broker, "GET", "/offsets")
        if status != 200:
            raise _refused(broker, status, body, f"answered {status} to GET /offsets: {body}")
        return msgspec.convert(body, list[CommittedOffset])

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
        if self._producer is None:
            self._producer = Producer(
                self.routes.nameservers, credentials=self.credentials, tls=self.tls
            )
            await self._producer.start()
        topic = letter.properties[PROP_RETRY_TOPIC]
        properties = {k: v for k, v in letter.properties.items() if k not in _RETRY_PROPS}
        return await self._producer.send(
            topic, letter.body, tags=letter.tags, keys=letter.keys, properties=properties
        )

    # --- messages ---------------------------------------------------------------------

    async def message_by_id(self, msg_id: str) -> StoredMessage:
        """The message with this id (32 hex digits, as a send result gives it), asking
        every broker of the cluster until one has it."""
        try:
            raw = bytes.fromhex(msg_id)
        except ValueError:
            raw = b""
        if len(raw) != 16:
            raise AdminError(f"a message id is 32 hex digits, not {msg_id!r}")
        brokers = [b for b in (await self.cluster()).brokers() if b.http_address]
        if not brokers:
            raise AdminError("no broker with an admin address is registered")
        unreachable = []
        for broker in brokers:
            try:
                status, body = await self.request(broker, "GET", f"/messages/{raw.hex()}")
            except BrokerAdminError as exc:
                unreachable.append(f"{broker.broker_name}: {exc}")
                continue
            if status == 200:
                return msgspec.convert(body, StoredMessage)
            if status != 404:
                unreachable.append(f"{broker.broker_name}: HTTP {status} {body}")
        where = f"; could not ask {'; '.join(unreachable)}" if unreachable else ""
        raise AdminError(f"no broker holds message {raw.hex()}{where}")

    async def messages_by_key(
        self, topic: str, key: str, *, limit: int = 32
    ) -> list[StoredMessage]:
        """The messages of ``topic`` carrying ``key``, newest first: at most ``limit``
        (1-1000) from each broker group serving the topic (its master when alive)."""
        if not 1 <= limit <= 1000:
            raise AdminError("limit must be between 1 and 1000")
        route = await self.routes.route(topic)
        view = await self.cluster()
        groups = {g.broker_name for g in route.groups}
        brokers: dict[str, BrokerInfo] = {}
        for broker in view.brokers():
            # One broker per group: the master when it is alive, else a slave.
            wanted = broker.broker_name in groups and broker.http_address
            if wanted and (broker.broker_name not in brokers or broker.is_master):
                brokers[broker.broker_name] = broker
        query = urlencode({"topic": topic, "key": key, "limit": limit})
        found: list[StoredMessage] = []
        for name in sorted(brokers):
            status, body = await self.request(brokers[name], "GET", f"/messages?{query}")
            if status != 200:
                raise _refused(brokers[name], status, body, f"answered HTTP {status}: {body}")
            found += msgspec.convert(body["messages"], list[StoredMessage])
        found.sort(key=lambda m: m.store_timestamp_ms, reverse=True)
        return found

    # --- one broker -------------------------------------------------------------------

    async def health(self, broker: BrokerRef) -> BrokerHealth:
        """A broker's health; ``writable`` is False (not an error) while it refuses writes."""
        status, body = await self.request(broker, "GET", "/health")
        if status not in (200, 503) or not isinstance(body, dict):
            raise _refused(broker, status, body, f"answered {status} to GET /health: {body}")
        return msgspec.convert(body, BrokerHealth)

    async def metrics(self, broker: BrokerRef) -> MetricSamples:
        """Every sample of a broker's Prometheus metrics."""
        from prometheus_client.parser import text_string_to_metric_families

        text = await self._http.text(_http_address(broker), "/metrics")
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    async def handover(self, broker: BrokerRef, to: int, *, timeout_ms: int, fence_ms: int) -> int:
        """Step one of a switchover: the master ``broker`` stops taking writes until
        slave ``to`` holds its whole log (writes resume by themselves after
        ``fence_ms``); the log end handed over."""
        body = {"to": to, "timeout_ms": timeout_ms, "fence_ms": fence_ms}
        status, reply = await self.request(broker, "POST", "/replication/handover", body)
        if status != 200:
            raise _refused(broker, status, reply, f"refused the handover: {reply}")
        return int(reply["end"])

    async def resume_writes(self, broker: BrokerRef) -> None:
        """Undo a handover: the master takes writes again."""
        status, reply = await self.request(broker, "POST", "/replication/resume")
        if status != 200:
            raise _refused(broker, status, reply, f"did not resume writes: {reply}")

    async def request(
        self, broker: BrokerRef, method: str, path: str, body: Any = None
    ) -> tuple[int, Any]:
        """(HTTP status, JSON answer) of one call to a broker's admin API (``path``
        percent-encoded), for the endpoints without a method of their own here."""
        return await self._http.request(_http_address(broker), method, path, body)

    # --- helpers ----------------------------------------------------------------------

    def _consumer(self, group: str) -> PullConsumer:
        """A consumer of ``group`` on this Admin's routes and connections (closed with
        the Admin, not by the caller)."""
        if self._connections is None:
            self._connections = ConnectionPool(
                connect_timeout_s=self.timeout_s, credentials=self.credentials, tls=self.tls
            )
        return PullConsumer(
            self.routes.nameservers,
            group,
            routes=self.routes,
            connections=self._connections,
            request_timeout_s=self.timeout_s,
            credentials=self.credentials,
            tls=self.tls,
        )


def _http_address(broker: BrokerRef) -> str:
    if isinstance(broker, str):
        return broker
    if not broker.http_address:
        raise AdminError(
            f"broker {broker.broker_name} ({broker.data_address}) has no HTTP admin address"
        )
    return broker.http_address


def _refused(broker: BrokerRef, status: int, body: Any, what: str) -> BrokerAdminError:
    """A broker's refusal, said as ``broker NAME <what>``."""
    name = broker.broker_name if isinstance(broker, BrokerInfo) else broker
    detail = body.get("error", "") if isinstance(body, dict) else ""
    return BrokerAdminError(
        name, status, detail or str(body), body, message=f"broker {name} {what}"
    )


def _route_matches(route: TopicRoute, expected: Mapping[str, TopicSettings]) -> bool:
    for name, settings in expected.items():
        group = route.group(name)
        if (
            group is None
            or group.read_queues != settings.read_queues
            or group.write_queues != settings.write_queues
        ):
            return False
    return True
