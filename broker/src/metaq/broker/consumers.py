"""Consumer group membership, kept from consumer heartbeats, for rebalancing.

Each consumer heartbeats every broker serving its topics. A member is dropped after
``timeout_s`` without a heartbeat, at once when the connection it last heartbeat on
closes, or when it says it is leaving. Members are listed sorted by client id, so every
member of a group that asks gets the same list and computes the same assignment.
``on_change`` hears of every change of a group's member set (a join, a leave, an expiry,
a closed connection), so the other members can be told at once (see
:mod:`metaq.broker.member_notices`).

A member heartbeats every few seconds and a large group's member list (with the queues
each member reports running, for the sticky strategy) is megabytes, so the answer
carries only what changed since the copy the member already has (:meth:`changes`):
every change of a member's entry takes the next number of one broker-wide sequence, a
departure leaves a tombstone with its number for ``timeout_s``, and a member that names
the ``epoch`` and sequence number of its copy gets the entries and departures newer than
it. The epoch is drawn at each start, so a member whose copy came from before a restart
(or is older than the tombstones kept) gets the whole list.
"""

from __future__ import annotations

import secrets
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
    changed_seq: int = 0
    """The sequence number of the last change of what the answers list of it (its
    joining, its room, its report)."""


@dataclass(frozen=True, slots=True)
class Changes:
    """What a member's copy of its group's member list lacks (:meth:`ConsumerGroups.changes`)."""

    epoch: int
    seq: int
    """The copy is up to date to this sequence number once the changes are applied."""
    whole: bool
    """``members`` is the whole list (the copy was unknown, from another epoch or too old)."""
    members: list[Member]
    """The members whose entries changed since the copy (every member when ``whole``)."""
    departed: list[str]
    """Client ids gone since the copy (empty when ``whole``)."""


class _Group:
    __slots__ = ("departed", "horizon", "members")

    def __init__(self, horizon: int) -> None:
        self.members: dict[str, Member] = {}
        self.departed: dict[str, tuple[int, float]] = {}
        """Client id -> (sequence number, when) of a departure, kept for the timeout."""
        self.horizon = horizon
        """Copies older than this sequence number may lack departures: answer them whole."""


class ConsumerGroups:
    """Live members per consumer group; ``clock`` is monotonic seconds (a test can skew it)."""

    def __init__(
        self,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        epoch: int | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self.epoch = epoch if epoch is not None else secrets.randbits(63) + 1
        """Drawn at each start: a copy of a member list from another epoch is answered whole."""
        self._seq = 0
        self._groups: dict[str, _Group] = {}
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
    ) -> None:
        """Record (or, when ``leaving``, drop) a member.

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
        entry = self._group(group)
        if leaving:
            if client_id in entry.members:
                self._depart(group, entry, client_id)
                self._changed(group, connection_id)
        else:
            known = entry.members.get(client_id)
            if known is None:
                self._changed(group, connection_id)
            held = tuple(held)
            changed_seq = (
                known.changed_seq
                if known is not None
                and (known.computer_room, known.held, known.holdings_version)
                == (computer_room, held, holdings_version)
                else self._next_seq()
            )
            entry.members[client_id] = Member(
                client_id,
                computer_room,
                mode,
                tuple(subscriptions),
                connection_id,
                self._clock(),
                host,
                client_version[:64],
                language[:32],
                held,
                holdings_version,
                changed_seq,
            )
            entry.departed.pop(client_id, None)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _group(self, group: str) -> _Group:
        entry = self._groups.get(group)
        if entry is None:
            # A copy from before the group was last forgotten lacks its departures.
            entry = self._groups[group] = _Group(horizon=self._seq + 1)
        return entry

    def _depart(self, group: str, entry: _Group, client_id: str) -> None:
        del entry.members[client_id]
        entry.departed[client_id] = (self._next_seq(), self._clock())

    def changes(self, group: str, epoch: int = 0, seq: int = 0) -> Changes:
        """What a copy of ``group``'s member list up to date to ``seq`` in ``epoch`` lacks:
        the whole list when the copy is from another epoch (or none: 0), or older than the
        departures kept; else the entries changed since and the departures."""
        entry = self._groups.get(group)
        if entry is None or epoch != self.epoch or not entry.horizon <= seq <= self._seq:
            members = self.members(group)
            return Changes(self.epoch, self._seq, True, members, [])
        # No sorting or expiry scan of the whole group here: this runs for every
        # heartbeat of every member, and the expiry service drops the silent ones.
        changed = [m for m in entry.members.values() if m.changed_seq > seq]
        return Changes(
            self.epoch,
            self._seq,
            False,
            sorted(changed, key=lambda m: m.client_id),
            sorted(c for c, (at_seq, _) in entry.departed.items() if at_seq > seq),
        )

    def members(self, group: str) -> list[Member]:
        """The live members of ``group``, sorted by client id (expired ones dropped)."""
        entry = self._groups.get(group)
        if entry is None:
            return []
        deadline = self._clock() - self.timeout_s
        expired = [c for c, m in entry.members.items() if m.last_seen_s < deadline]
        for client_id in expired:
            self._depart(group, entry, client_id)
        if expired:
            self._changed(group)
        return sorted(entry.members.values(), key=lambda m: m.client_id)

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
        entry = self._groups.get(group)
        members = entry.members if entry is not None else {}
        return next((c for c, m in members.items() if m.connection_id == connection_id), None)

    def drop_connection(self, connection_id: int) -> int:
        """Forget the members whose last heartbeat came over this (now closed) connection."""
        dropped = 0
        for group, entry in self._groups.items():
            gone = [c for c, m in entry.members.items() if m.connection_id == connection_id]
            for client_id in gone:
                self._depart(group, entry, client_id)
            if gone:
                self._changed(group)
            dropped += len(gone)
        return dropped

    def expire(self) -> None:
        self.groups()
        deadline = self._clock() - self.timeout_s
        # A departure older than the member timeout is forgotten: a member whose copy is
        # that old has been away long enough to be answered whole.
        for group, entry in list(self._groups.items()):
            old = [c for c, (_, at) in entry.departed.items() if at < deadline]
            for client_id in old:
                at_seq, _ = entry.departed.pop(client_id)
                entry.horizon = max(entry.horizon, at_seq + 1)
            if not entry.members and not entry.departed:
                del self._groups[group]
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
