"""Where a topic's queues are: the route cache, fed by the nameservers over gRPC.

Nameservers are stateless peers that answer alike (``docs/nameserver.md``), so any one
will do: :class:`RouteCache` asks the one that answered last and, when it fails or does
not answer within ``rpc_timeout_s``, the others in turn. Only when none answers does a
call fail, with :class:`~metaq.client.errors.NoNameServer` listing what was tried. A
topic no live broker serves is :class:`~metaq.client.errors.UnknownTopic` (not
retriable) — the first nameserver that answers is believed.

Routes are cached per topic and refreshed in the background every ``refresh_interval_s``
for every topic in use, and at once when a caller asks (``refresh=True``, after a send
failed). A refresh that fails keeps the last route: a stale route is better than none
while the nameservers are away.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar

import grpc

if TYPE_CHECKING:
    from metaq.common.v1.control_pb2_grpc import NameServerAsyncStub

from metaq.client.errors import NoNameServer, UnknownTopic
from metaq.client.user_calls import UserSigningInterceptor
from metaq.common.errors import ErrorCode, MetaqError
from metaq.common.model import BrokerView, ClusterInfo, TopicRoute
from metaq.common.server_names import target_of
from metaq.common.service import PeriodicService
from metaq.common.tls import TlsConfig, grpc_channel, grpc_hint
from metaq.common.users import Credentials, load_credentials
from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1.control_pb2_grpc import NameServerStub

log = logging.getLogger(__name__)

T = TypeVar("T")

# Not worth asking another nameserver: the request itself is wrong.
# Another nameserver would answer the same: say so at once. (Auth refusals too: every
# nameserver reads the same ACL file.)
_FINAL_STATUSES: Final = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
    }
)


class NameServerError(MetaqError):
    """A nameserver refused the request as sent (gRPC INVALID_ARGUMENT and the like)."""

    retriable = False
    code = ErrorCode.INVALID_MESSAGE

    def __init__(self, address: str, status: str, detail: str) -> None:
        super().__init__(f"nameserver {address} refused the request ({status}): {detail}")
        self.address = address
        self.status = status
        self.detail = detail


# --- cluster info ---------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterView:
    """Every cluster, broker group and broker a nameserver knows (a ``GetClusterInfo``
    answer)."""

    clusters: tuple[ClusterInfo, ...]
    broker_expiry_ms: int
    nameserver: str
    """The nameserver that answered."""

    @classmethod
    def from_proto(cls, reply: pb.GetClusterInfoResponse, nameserver: str) -> ClusterView:
        """The answer ``nameserver`` gave."""
        clusters = tuple(ClusterInfo.from_proto(c) for c in reply.clusters)
        return cls(clusters, reply.broker_expiry_ms, nameserver)

    def brokers(self, cluster: str | None = None, *, down: bool = False) -> list[BrokerView]:
        """The live brokers (and with ``down`` the ones that are down too, after the
        live ones of their group)."""
        return [
            broker
            for c in self.clusters
            if cluster is None or c.cluster == cluster
            for group in c.groups
            for broker in (*group.brokers, *group.down)
            if down or not broker.down
        ]

    def masters(self, cluster: str | None = None) -> list[BrokerView]:
        return [b for b in self.brokers(cluster) if b.is_master]


# --- the cache ------------------------------------------------------------------------

FAILOVER_POLL_S: Final = (0.1, 0.5)
"""The first and the longest wait between route fetches during a failover."""

RouteListener = Callable[[str, TopicRoute], None]
"""Called with (topic, new route) whenever a fetched route differs from the cached one."""


class _Refresher(PeriodicService):
    name = "metaq-route-refresh"

    def __init__(self, cache: RouteCache, interval_s: float) -> None:
        super().__init__(interval_s)
        self._cache = cache

    async def run_once(self) -> None:
        await self._cache.refresh_all()


@dataclass(frozen=True, slots=True)
class _Unsettled:
    deadline: float
    """Monotonic time after which a failed master no longer keeps the topic polled."""
    failed: dict[str, str]
    """Broker group → the master address a send failed on, until a successor is routed."""


class RouteCache:
    """Topic routes from the nameservers, cached and refreshed. Other nameserver calls
    (cluster info, assignment, switchover: :class:`metaq.client.admin.Admin`) go through
    :meth:`call`, on the same channels.

    Use inside one event loop: :meth:`start` before, :meth:`stop` after. ``route`` works
    without ``start`` too (no background refresh then), which is what one-shot tools do.
    """

    def __init__(
        self,
        nameservers: Sequence[str],
        *,
        refresh_interval_s: float = 30.0,
        rpc_timeout_s: float = 3.0,
        credentials: Credentials | None = None,
        tls: TlsConfig | None = None,
        spread: bool = True,
    ) -> None:
        if isinstance(nameservers, str):
            nameservers = [nameservers]
        self.nameservers: tuple[str, ...] = tuple(dict.fromkeys(nameservers))
        if not self.nameservers:
            raise ValueError("at least one nameserver address is needed")
        self.rpc_timeout_s = rpc_timeout_s
        self.credentials = credentials or load_credentials()
        """The user whose key signs every call (nameservers with auth require it); by
        default from METAQ_ACCESS_KEY / METAQ_SECRET_KEY or METAQ_CREDENTIALS_FILE."""
        self.tls = tls
        """Set: the nameservers are called over TLS (see :mod:`metaq.common.tls`)."""
        self._routes: dict[str, TopicRoute] = {}
        self._fetched_at: dict[str, float] = {}
        self._fetching: dict[str, asyncio.Future[TopicRoute]] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}
        # Many clients listing the nameservers in one order would all ask the first;
        # starting at a random one spreads their route queries over all of them, as
        # RocketMQ's clients do. An operator's tool keeps the listed order (spread=False).
        self._preferred = random.randrange(len(self.nameservers)) if spread else 0
        self._listeners: list[RouteListener] = []
        self._refresher = _Refresher(self, refresh_interval_s)
        self._poll: asyncio.TimerHandle | None = None
        self._poll_wait_s = FAILOVER_POLL_S[0]
        self._unsettled: dict[str, _Unsettled] = {}
        """Topics whose route is fetched often (see :meth:`_settle`)."""

    @property
    def preferred_nameserver(self) -> str:
        """The nameserver asked first: the last one that answered."""
        return self.nameservers[self._preferred]

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Start refreshing the routes of every topic in use in the background."""
        if not self._refresher.running:
            self._refresher.start()

    async def stop(self) -> None:
        """Stop refreshing and close the gRPC channels."""
        if self._poll is not None:
            self._poll.cancel()
            self._poll = None
        await self._refresher.stop()
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()

    async def __aenter__(self) -> RouteCache:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    # --- routes -----------------------------------------------------------------------

    def add_listener(self, listener: RouteListener) -> None:
        self._listeners.append(listener)

    def cached(self, topic: str) -> TopicRoute | None:
        return self._routes.get(topic)

    @property
    def topics(self) -> list[str]:
        """Topics with a cached route: the ones the background refresh keeps current."""
        return list(self._routes)

    async def route(
        self, topic: str, *, refresh: bool = False, max_age_s: float | None = None
    ) -> TopicRoute:
        """The topic's route, from the cache unless ``refresh`` or not cached yet.

        ``max_age_s`` refreshes only a route fetched longer ago than that (so many callers
        reacting to one failure cause one fetch). Concurrent fetches of one topic share a
        single nameserver call. Raises UnknownTopic (not retriable) or NoNameServer
        (retriable).
        """
        if max_age_s is not None:
            fetched = self._fetched_at.get(topic)
            refresh = fetched is None or time.monotonic() - fetched > max_age_s
        if not refresh:
            cached = self._routes.get(topic)
            if cached is not None:
                return cached
        fetching = self._fetching.get(topic)
        if fetching is None:
            fetching = asyncio.get_running_loop().create_future()
            self._fetching[topic] = fetching
            try:
                route = await self._fetch(topic)
            except BaseException as exc:
                shared = exc if isinstance(exc, Exception) else NoNameServer([])
                fetching.set_exception(shared)
                fetching.exception()  # retrieved: waiters, if any, re-raise it
                raise
            finally:
                del self._fetching[topic]
            fetching.set_result(route)
            return route
        return await asyncio.shield(fetching)

    def invalidate(self, topic: str) -> None:
        """Forget the topic's route: the next ``route`` call fetches it again."""
        self._routes.pop(topic, None)
        self._fetched_at.pop(topic, None)

    async def refresh_all(self) -> None:
        """Fetch every cached topic again (the background refresh calls this), and those
        invalidated while a failover is being watched."""
        for topic in list(dict.fromkeys([*self._routes, *self._unsettled])):
            try:
                await self.route(topic, refresh=True)
            except UnknownTopic:
                log.info("topic %s is no longer routed; dropped from the cache", topic)
            except NoNameServer as exc:
                log.warning("route refresh of %s failed, keeping the last route: %s", topic, exc)
                if topic in self._unsettled:
                    self._schedule_poll()  # a failover is under way: try again soon

    async def _fetch(self, topic: str) -> TopicRoute:
        try:
            reply = await self.call(
                lambda stub: stub.GetRoute(
                    pb.GetRouteRequest(topic=topic), timeout=self.rpc_timeout_s
                ),
                not_found=lambda detail: UnknownTopic(topic, detail),
            )
        except UnknownTopic:
            self._routes.pop(topic, None)
            self._fetched_at.pop(topic, None)
            self._unsettled.pop(topic, None)
            raise
        route = TopicRoute.from_proto(reply.route)
        self._settle(topic, route)
        old = self._routes.get(topic)
        self._routes[topic] = route
        self._fetched_at[topic] = time.monotonic()
        # Listeners care where the queues are, not about epochs or HTTP addresses.
        if old is None or (old.write_queues, old.read_queues) != (
            route.write_queues,
            route.read_queues,
        ):
            for listener in self._listeners:
                try:
                    listener(topic, route)
                except Exception:
                    log.exception("route listener failed for topic %s", topic)
        return route

    def expect_change(self, topic: str, broker_name: str, master_address: str) -> None:
        """A send to the topic failed as a dead master's would: fetch its route often
        until it shows ``broker_name`` with a master other than ``master_address`` (a
        successor), for at most one refresh interval."""
        if self._refresher.running:
            deadline = time.monotonic() + self._refresher.interval_s
            watched = self._unsettled.get(topic)
            failed = dict(watched.failed) if watched is not None else {}
            failed[broker_name] = master_address
            self._unsettled[topic] = _Unsettled(deadline, failed)
            self._schedule_poll()

    def _settle(self, topic: str, route: TopicRoute) -> None:
        """While a route shows a group without a master, or a group whose master failed
        a send and has no successor yet, fetch the routes again soon (100 ms apart,
        backing off to 500 ms): a failover is under way, and a client should find the
        new master well within a second, not at the next periodic refresh."""
        watched = self._unsettled.get(topic)
        if watched is not None:
            failed = {
                name: address
                for name, address in watched.failed.items()
                if (group := route.group(name)) is not None
                and group.master_address in ("", address)
            }
            if failed and time.monotonic() <= watched.deadline:
                self._unsettled[topic] = _Unsettled(watched.deadline, failed)
            else:
                del self._unsettled[topic]
        if route.masterless and topic not in self._unsettled:
            self._unsettled[topic] = _Unsettled(float("inf"), {})
        if self._unsettled:
            self._schedule_poll()
        else:
            self._poll_wait_s = FAILOVER_POLL_S[0]

    def _schedule_poll(self) -> None:
        if self._poll is not None or not self._refresher.running:
            return
        wait_s = self._poll_wait_s
        self._poll_wait_s = min(wait_s * 2, FAILOVER_POLL_S[1])
        self._poll = asyncio.get_running_loop().call_later(wait_s, self._poll_now)

    def _poll_now(self) -> None:
        self._poll = None
        self._refresher.wakeup()

    # --- calling the nameservers ------------------------------------------------------

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            signing = (
                [UserSigningInterceptor(self.credentials, address)] if self.credentials else None
            )
            channel = grpc_channel(address, self.tls, interceptors=signing)
            self._channels[address] = channel
        return channel

    async def call(
        self,
        call: Callable[[NameServerAsyncStub], Awaitable[T]],
        *,
        not_found: Callable[[str], MetaqError] | None = None,
        answered: list[str] | None = None,
    ) -> T:
        """Run ``call`` against the preferred nameserver, then the others in turn (what
        every nameserver request of this client goes through, the admin's too).

        NOT_FOUND raises ``not_found(detail)`` when given; a refusal of the request itself
        raises NameServerError at once; else NoNameServer once every one failed. The
        nameserver that answered is appended to ``answered``."""
        return await self._each(
            lambda stub, _address: call(stub), not_found=not_found, answered=answered
        )

    async def call_at(
        self,
        call: Callable[[NameServerAsyncStub, str], Awaitable[T]],
        *,
        not_found: Callable[[str], MetaqError] | None = None,
        answered: list[str] | None = None,
    ) -> T:
        """:meth:`call`, with the nameserver each attempt goes to as ``call``'s second
        argument (``target_of`` its address), for a call signed for that one nameserver."""
        return await self._each(
            lambda stub, address: call(stub, target_of(address)),
            not_found=not_found,
            answered=answered,
        )

    async def _each(
        self,
        call: Callable[[NameServerAsyncStub, str], Awaitable[T]],
        *,
        not_found: Callable[[str], MetaqError] | None,
        answered: list[str] | None,
    ) -> T:
        """:meth:`call`, giving ``call`` each attempt's nameserver address."""
        tried: list[tuple[str, str]] = []
        count = len(self.nameservers)
        for step in range(count):
            index = (self._preferred + step) % count
            address = self.nameservers[index]
            try:
                result = await call(NameServerStub(self._channel(address)), address)
            except grpc.aio.AioRpcError as exc:
                status = exc.code()
                detail = exc.details() or status.name
                if status is grpc.StatusCode.NOT_FOUND and not_found is not None:
                    self._preferred = index
                    raise not_found(detail) from None
                if status in _FINAL_STATUSES:
                    self._preferred = index
                    raise NameServerError(address, status.name, detail) from None
                detail = await grpc_hint(address, self.tls, detail)
                tried.append((address, f"{status.name}: {detail}"))
                continue
            self._preferred = index
            if answered is not None:
                answered.append(address)
            return result
        raise NoNameServer(tried)
