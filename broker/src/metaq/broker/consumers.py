"""Consumer group membership, kept from consumer heartbeats, for rebalancing.

Each consumer heartbeats every broker serving its topics. A member is dropped after
``timeout_s`` without a heartbeat, at once when the connection it last heartbeat on
closes, or when it says it is leaving. Members are listed sorted by client id, so every
member of a group that asks gets the same list and computes the same assignment.
``on_change`` hears of every change of a group's member set (a join, a leave, an expiry,
a closed connection), so the other members can be told at once (see
:mod:`metaq.broker.member_notices`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from metaq.common.errors import InvalidMessage
from metaq.common.model import ConsumeMode
from metaq.common.names import check_group
from metaq.common.record import check_topic
from metaq.common.service import PeriodicService

HeldQueue: TypeAlias = tuple[str, str, int]
"""(topic, broker group, queue id) of a queue a consumer runs."""


@dataclass(frozen=True, slots=True)
class Member:
    client_id: str
    computer_room: str
    mode: ConsumeMode
    subscriptions: tuple[tuple[str, str], ...]
    """(topic, tag expression) pairs."""
    connection_id: int
    last_seen_s: float
    host: str = ""
    """Where its heartbeats come from, as this broker sees it (the address, no port)."""
    client_version: str = ""
    language: str = ""
    """What the client library says it is (empty: a client too old to say)."""
    held: tuple[HeldQueue, ...] = ()
    """The queues it last reported running, for the sticky assignment strategy."""
    holdings_version: int = 0
    """That report's version (0: it reports none)."""


class ConsumerGroups:
    """Live members per consumer group; ``clock`` is monotonic seconds (a test can skew it)."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._groups: dict[str, dict[str, Member]] = {}
        # (group, topic, queue) -> (connection, when) of its last pull: which member
        # reads a queue, for admin views (the clients share queues out among themselves).
        self._pulls: dict[tuple[str, str, int], tuple[int, float]] = {}
        self.on_change: Callable[[str, int], None] | None = None
        """Called with the group and the connection whose heartbeat changed its member
        set (0 when none did); it must not call back into this object synchronously."""

    def _changed(self, group: str, cause_connection_id: int = 0) -> None:
        if self.on_change is not None:
            self.on_change(group, cause_connection_id)

    def heartbeat(
        self,
        group: str,
        client_id: str,
        *,
        computer_room: str = "",
        mode: ConsumeMode = ConsumeMode.CLUSTERING,
        subscriptions: Sequence[tuple[str, str]] = (),
        connection_id: int = 0,
        leaving: bool = False,
        host: str = "",
        client_version: str = "",
        language: str = "",
        held: Sequence[HeldQueue] = (),
        holdings_version: int = 0,
    ) -> list[Member]:
        """Record (or, when ``leaving``, drop) a member; return the group's live members.

        ``held`` and ``holdings_version`` replace what the member reported before (a
        member that stops reporting sends none, version 0)."""
        if group not in self._groups:
            check_group(group)
        if not client_id or len(client_id) > 255:
            raise InvalidMessage("a consumer heartbeat needs a client id of 1-255 characters")
        for topic, _ in subscriptions:
            check_topic(topic)
        for topic in {topic for topic, _, _ in held}:
            check_topic(topic)
        if held and holdings_version == 0:
            raise InvalidMessage(
                "a consumer heartbeat that reports held queues needs a holdings_version of 1 "
                "or more (raise it whenever the held queues change)"
            )
        members = self._groups.setdefault(group, {})
        if leaving:
            if members.pop(client_id, None) is not None:
                self._changed(group, connection_id)
        else:
            if client_id not in members:
                self._changed(group, connection_id)
            members[client_id] = Member(
                client_id,
                computer_room,
                mode,
                tuple(subscriptions),
                connection_id,
                self._clock(),
                host,
                client_version[:64],
                language[:32],
                tuple(held),
                holdings_version,
            )
        return self.members(group)

    def members(self, group: str) -> list[Member]:
        """The live members of ``group``, sorted by client id (expired ones dropped)."""
        members = self._groups.get(group)
        if not members:
            self._groups.pop(group, None)
            return []
        deadline = self._clock() - self.timeout_s
        expired = [c for c, m in members.items() if m.last_seen_s < deadline]
        for client_id in expired:
            del members[client_id]
        if expired:
            self._changed(group)
        return sorted(members.values(), key=lambda m: m.client_id)

    def groups(self) -> dict[str, list[Member]]:
        """Every group with live members, for admin views and the nameserver registration."""
        result = {}
        for group in sorted(self._groups):
            members = self.members(group)
            if members:
                result[group] = members
        return result

    def pulled(self, group: str, topic: str, queue_id: int, connection_id: int) -> None:
        """A member of ``group`` pulled the queue over ``connection_id`` just now."""
        self._pulls[(group, topic, queue_id)] = (connection_id, self._clock())

    def owner(self, group: str, topic: str, queue_id: int) -> str | None:
        """The client id of the live member that pulled the queue last, within the
        member timeout; None when no live member has."""
        found = self._pulls.get((group, topic, queue_id))
        if found is None or found[1] < self._clock() - self.timeout_s:
            return None
        connection_id = found[0]
        members = self._groups.get(group, {})
        return next((c for c, m in members.items() if m.connection_id == connection_id), None)

    def drop_connection(self, connection_id: int) -> int:
        """Forget the members whose last heartbeat came over this (now closed) connection."""
        dropped = 0
        for group, members in self._groups.items():
            gone = [c for c, m in members.items() if m.connection_id == connection_id]
            for client_id in gone:
                del members[client_id]
            if gone:
                self._changed(group)
            dropped += len(gone)
        return dropped

    def expire(self) -> None:
        self.groups()
        deadline = self._clock() - self.timeout_s
        for key in [k for k, (_, at) in self._pulls.items() if at < deadline]:
            del self._pulls[key]


class ConsumerExpiryService(PeriodicService):
    """Drops members that stopped heartbeating, so idle groups do not linger."""

    name = "consumer-expiry"

    def __init__(self, groups: ConsumerGroups) -> None:
        super().__init__(interval_s=max(groups.timeout_s / 4, 0.05))
        self.consumer_groups = groups

    async def run_once(self) -> None:
        self.consumer_groups.expire()
