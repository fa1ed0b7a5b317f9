"""What the console's pages read: the registry, the controller, and the brokers' HTTP
admin APIs through :class:`Brokers` (over :class:`metaq.client.admin.Admin`'s typed
calls), every call bounded by a timeout."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from metaq.client.admin import Admin, MessagesStored
from metaq.client.errors import BrokerAdminError, BrokerAnswerUnreadable, BrokerUnreachable
from metaq.common.auth import ClusterSecret
from metaq.common.model import BrokerKey, BrokerView, Role
from metaq.common.tls import TlsConfig
from metaq.nameserver.cluster_acl import ClusterAcl
from metaq.nameserver.console.samples import Sampler, Samples
from metaq.nameserver.controller import Controller
from metaq.nameserver.registry import Registry

T = TypeVar("T")
P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class Answer(Generic[T]):
    """What a broker answered, or in plain words why there is no answer."""

    value: T | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    def get(self, default: T) -> T:
        """The answer, or ``default`` when there is none."""
        return self.value if self.ok and self.value is not None else default


class Brokers:
    """Calls to brokers' HTTP admin APIs through the client's admin library, each
    answered as an :class:`Answer` (a page shows what it could gather and says what not).

    With ``tls`` (the nameserver's own settings: a process that serves TLS dials TLS)
    the calls are HTTPS, checked against its CA and showing its certificate to brokers
    that verify clients. With ``secret`` every call is signed with the cluster secret
    (:func:`metaq.common.auth.sign_http`): brokers with ``auth_enabled`` take the console
    as a cluster member, whoever is logged in to it (the console itself admits only users
    holding ``admin cluster``)."""

    def __init__(
        self, timeout_s: float, tls: TlsConfig | None = None, secret: ClusterSecret | None = None
    ) -> None:
        self.timeout_s = timeout_s
        self._admin = Admin.cluster_member(secret, timeout_s=timeout_s, tls=tls)

    async def ask(
        self,
        broker: BrokerView,
        call: Callable[Concatenate[Admin, str, P], Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> Answer[T]:
        """``call`` (an :class:`Admin` method taking a broker, such as ``Admin.health``)
        on ``broker``, with the arguments that follow the broker."""
        state = broker.state
        who = f"broker {state.key} at {state.http_address or state.data_address}"
        if not state.http_address:
            return Answer(error=f"{who} has no HTTP address registered (started without one)")
        try:
            return Answer(await call(self._admin, state.http_address, *args, **kwargs))
        except BrokerUnreachable as exc:
            if exc.timed_out:
                return Answer(error=f"{who} did not answer within {self.timeout_s:g} s (down?)")
            return Answer(error=f"{who} is unreachable ({exc.detail})")
        except BrokerAnswerUnreadable as exc:
            what = "something that is not JSON" if exc.body is None else "JSON of another shape"
            return Answer(error=f"{who} answered {what}")
        except BrokerAdminError as exc:
            reason = exc.body.get("error") if isinstance(exc.body, dict) else None
            return Answer(error=f"{who}: {reason or f'HTTP {exc.status}'}")

    async def close(self) -> None:
        await self._admin.close()


def problems_of(*answers: Sequence[Answer[Any]]) -> list[str]:
    """What each of these answers could not say, in order."""
    return [a.error for some in answers for a in some if a.error]


def durability_warning(stored: MessagesStored) -> str:
    """What a broker's store (test message, resend) did not reach, if anything, as the
    send statuses FLUSH_DISK_TIMEOUT and FLUSH_SLAVE_TIMEOUT would say it."""
    missing = []
    if not stored.durable:
        missing.append("was not on disk within the flush timeout")
    if not stored.replicated:
        missing.append("was not confirmed by a slave within the replication timeout")
    return f" — but it {' and '.join(missing)}" if missing else ""


@dataclass
class Rates:
    """Messages per second from two samples of a growing count (TPS in the topic list)."""

    _last: dict[str, tuple[float, int]] = field(default_factory=dict)

    def rate(self, key: str, count: int, now: float | None = None) -> float | None:
        now = time.monotonic() if now is None else now
        previous = self._last.get(key)
        self._last[key] = (now, count)
        if previous is None or now <= previous[0] or count < previous[1]:
            return None
        return (count - previous[1]) / (now - previous[0])


@dataclass
class ConsoleContext:
    registry: Registry
    controller: Controller
    brokers: Brokers
    samples: Samples
    acl: ClusterAcl | None = None
    """The cluster's users and grants (None when this nameserver runs without auth)."""
    rates_in: Rates = field(default_factory=Rates)
    rates_out: Rates = field(default_factory=Rates)
    sampler: Sampler = field(init=False)

    def __post_init__(self) -> None:
        self.sampler = Sampler(self.samples, self.brokers, lambda: list(self.masters().values()))

    @classmethod
    def of(
        cls,
        registry: Registry,
        controller: Controller,
        timeout_ms: int,
        tls: TlsConfig | None = None,
        secret: ClusterSecret | None = None,
        sample_interval_ms: int = 30_000,
        acl: ClusterAcl | None = None,
    ) -> ConsoleContext:
        brokers = Brokers(timeout_ms / 1000, tls, secret)
        return cls(registry, controller, brokers, Samples(sample_interval_ms / 1000), acl)

    def live_brokers(self) -> list[BrokerView]:
        return [
            broker for name in self.registry.group_names() for broker in self.registry.members(name)
        ]

    def masters(self) -> dict[str, BrokerView]:
        """Each group's master as the routes take it (the controller's, when it manages
        the group): the broker that takes changes."""
        found: dict[str, BrokerView] = {}
        for name in self.registry.group_names():
            control = self.controller.control(name)
            for broker in self.registry.members(name):
                if broker.state.role is not Role.MASTER:
                    continue
                if control is None or broker.state.key.broker_id == control.master_id:
                    found.setdefault(name, broker)
        return found

    def gone(self) -> dict[BrokerKey, str]:
        """Brokers that left the registry lately (a broker whose process died leaves it
        at once, its session ending, and the page must still say it is gone), each with
        a plain-words line; the registry forgets them after an hour."""
        return {
            gone.state.key: (
                f"broker {gone.state.key} (data {gone.state.data_address}, http "
                f"{gone.state.http_address or '-'}) is not registered any more (last seen "
                f"live {gone.last_heartbeat_age_s:.0f} s ago): it is down or cut off from this "
                "nameserver"
            )
            for gone in self.registry.departed()
        }

    async def close(self) -> None:
        await self.sampler.stop()
        await self.brokers.close()
