"""What every part of :class:`~metaq.client.admin.Admin` stands on: its settings, its
sessions and connections, and one call to a broker's admin API.

The parts build on one another, each a mixin over the one below: this session; the
typed calls to one broker (:mod:`~metaq.client.admin.brokers`); the cluster and its
switchover (:mod:`~metaq.client.admin.cluster`); then topics, and consumer groups on
them (a group's delete deletes its retry and dead-letter topics), with messages beside;
:class:`~metaq.client.admin.Admin` joins the last two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self, TypeVar

import msgspec

from metaq.client.admin.broker_http import BrokerHttp
from metaq.client.connection import ConnectionPool
from metaq.client.errors import AdminError, BrokerAdminError, BrokerAnswerUnreadable
from metaq.client.producer import Producer
from metaq.client.pull_consumer import PullConsumer
from metaq.client.routes import RouteCache
from metaq.common.auth import ClusterSecret
from metaq.common.model import BrokerView
from metaq.common.tls import TlsConfig
from metaq.common.users import Credentials, load_credentials

BrokerRef = BrokerView | str
"""A broker to call: as the nameserver knows it, or its HTTP address (``host:port``, or a
base URL with the scheme)."""

T = TypeVar("T")


class AdminSession:
    """The settings, sessions and connections an Admin's calls share (see
    :class:`~metaq.client.admin.Admin` for what each argument means)."""

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
                nameservers,
                rpc_timeout_s=timeout_s,
                credentials=self.credentials,
                tls=tls,
                spread=False,
            )
        self._routes = routes
        self._http = BrokerHttp(timeout_s=timeout_s, tls=tls, credentials=self.credentials)
        self._connections: ConnectionPool | None = None
        self._producer: Producer | None = None

    @classmethod
    def cluster_member(
        cls, secret: ClusterSecret | None, *, timeout_s: float, tls: TlsConfig | None = None
    ) -> Self:
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

    async def __aenter__(self) -> Self:
        self._http.open()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    @property
    def routes(self) -> RouteCache:
        if self._routes is None:
            raise AdminError("this Admin was made without nameservers; give their addresses")
        return self._routes

    async def request(
        self, broker: BrokerRef, method: str, path: str, body: Any = None
    ) -> tuple[int, Any]:
        """(HTTP status, JSON answer) of one call to a broker's admin API (``path``
        percent-encoded), for the endpoints without a method of their own here."""
        return await self._http.request(http_address(broker), method, path, body)

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

    async def _producer_started(self) -> Producer:
        """This Admin's producer (started on first use, closed with the Admin)."""
        if self._producer is None:
            self._producer = Producer(
                self.routes.nameservers, credentials=self.credentials, tls=self.tls
            )
            await self._producer.start()
        return self._producer


def http_address(broker: BrokerRef) -> str:
    """The address to call ``broker``'s admin API at."""
    if isinstance(broker, str):
        return broker
    if not broker.state.http_address:
        raise AdminError(
            f"broker {broker.broker_name} ({broker.state.data_address}) has no HTTP admin address"
        )
    return broker.state.http_address


def refused(broker: BrokerRef, status: int, body: Any, what: str) -> BrokerAdminError:
    """A broker's refusal, said as ``broker NAME <what>``."""
    name = broker.broker_name if isinstance(broker, BrokerView) else broker
    detail = body.get("error", "") if isinstance(body, dict) else ""
    return BrokerAdminError(
        name, status, detail or str(body), body, message=f"broker {name} {what}"
    )


def decoded(broker: BrokerRef, status: int, body: Any, kind: type[T]) -> T:
    """A broker's JSON answer as ``kind``; BrokerAnswerUnreadable when it is not of that
    shape (a broker of another version, or not a broker at all)."""
    try:
        return msgspec.convert(body, kind)
    except msgspec.ValidationError as exc:
        name = broker.broker_name if isinstance(broker, BrokerView) else broker
        raise BrokerAnswerUnreadable(
            name, status, f"answered JSON of an unexpected shape ({exc})", body
        ) from None
