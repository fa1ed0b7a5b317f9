"""A push consumer's heartbeats, and the group membership it learns from their answers.

Brokers keep consumer-group membership (``docs/protocol.md``, CONSUMER_HEARTBEAT): a
consumer announces itself to every broker serving its topics, periodically, and each
answer lists the group's live members sorted by client id. The union of the answers
(:func:`~metaq.client.rebalance.merge_members`) is the member list the consumer
rebalances over; when it differs from the last one, ``on_change`` is called so the
consumer rebalances at once instead of at its next periodic round.

Given ``held`` (a consumer assigning by the ``sticky`` strategy), each heartbeat also
reports the queues this consumer runs, with a version raised at every change, and asks
for every member's report back; :func:`~metaq.client.rebalance.merge_holdings` keeps each
member's latest as ``holdings``, the group's running assignment that the strategy keeps
in place. A change of holdings alone does not wake the rebalance: a member's report
follows its own rebalance, which the others already made from the same inputs.

The consumer keeps a copy of each broker's list (:class:`BrokerCopy`) and each heartbeat
names it (the broker's epoch and the sequence number it is up to date to), so a broker
answers only the members whose entries changed since and those gone: nothing, most
heartbeats. The whole list comes on a first heartbeat, and when the broker restarted
(another epoch) or the copy is older than the departures it keeps.

The heartbeats ask brokers for CONSUMER_IDS_CHANGED notices: a broker sends one when a
member joins, leaves, expires or loses its connection, and the consumer heartbeats at
once on it, so it learns of the change within a round trip rather than an interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from metaq.client.connection import BrokerConnection, ConnectionPool
from metaq.client.errors import UnknownTopic
from metaq.client.identity import CLIENT_VERSION, LANGUAGE
from metaq.client.rebalance import HeldQueue, Holdings, Member, merge_holdings, merge_members
from metaq.client.routes import RouteCache
from metaq.client.tags import TagFilter
from metaq.common.framing import Frame, FrameType
from metaq.common.model import ConsumeMode
from metaq.common.service import PeriodicService
from metaq.common.v1.data_pb2 import (
    ConsumerHeartbeatRequest,
    ConsumerHeartbeatResponse,
    ConsumerIdsChangedNotice,
)
from metaq.common.v1.data_pb2 import (
    HeldQueue as HeldQueueProto,
)

log = logging.getLogger(__name__)


@dataclass
class BrokerCopy:
    """This consumer's copy of one broker's list of the group's members."""

    epoch: int = 0
    seq: int = 0
    """The broker's epoch and the sequence number the copy is up to date to (0: none)."""
    members: dict[str, tuple[Member, Holdings]] = field(default_factory=dict)
    """Client id -> the member and its report (version 0: none)."""

    def apply(self, answer: ConsumerHeartbeatResponse, asked_seq: int) -> None:
        """Bring the copy up to date with the answer to a heartbeat that named sequence
        number ``asked_seq``, whole or changes only.

        An answer older than the copy (two heartbeats overlapped and the later answer came
        first) is passed over: the next heartbeat asks from where the copy is."""
        same_epoch = answer.epoch == self.epoch
        if same_epoch and answer.seq < self.seq:
            return
        if answer.changes_only and not (same_epoch and asked_seq <= self.seq):
            return
        if not answer.changes_only:
            self.members = {}
        for client_id in answer.departed:
            self.members.pop(client_id, None)
        for m in answer.members:
            self.members[m.client_id] = (
                Member(m.client_id, m.computer_room),
                Holdings(
                    m.holdings_version,
                    tuple((q.topic, q.broker_name, q.queue_id) for q in m.held),
                ),
            )
        self.epoch, self.seq = answer.epoch, answer.seq

    def listed(self) -> tuple[list[Member], dict[str, Holdings]]:
        """The members, sorted by client id, and the reports of those that made one."""
        members = [self.members[c][0] for c in sorted(self.members)]
        holdings = {c: h for c, (_, h) in self.members.items() if h.version}
        return members, holdings


class GroupMembership(PeriodicService):
    """Heartbeats every ``interval_s`` to every broker of the subscribed topics."""

    name = "metaq-consumer-heartbeat"

    def __init__(
        self,
        *,
        group: str,
        client_id: str,
        computer_room: str,
        mode: ConsumeMode,
        routes: RouteCache,
        connections: ConnectionPool,
        interval_s: float,
        request_timeout_s: float,
        on_change: Callable[[], None],
        held: Callable[[], Iterable[HeldQueue]] | None = None,
    ) -> None:
        super().__init__(interval_s)
        self.group = group
        self.client_id = client_id
        self.computer_room = computer_room
        self.mode = mode
        self._routes = routes
        self._connections = connections
        self._request_timeout_s = request_timeout_s
        self._on_change = on_change
        self.subscriptions: dict[str, TagFilter] = {}
        self.members: tuple[Member, ...] = ()
        """The group's members as last learnt; empty until a broker answered."""
        self.holdings: dict[str, Holdings] = {}
        """With ``held``: each member's latest report of its queues, by client id, as
        last learnt (members that reported none are absent)."""
        self._held = held
        self._copies: dict[str, BrokerCopy] = {}
        """Each broker's list as last answered, by address."""
        self._reported: tuple[HeldQueue, ...] = ()
        self._holdings_version = 0
        self.notices = 0
        """CONSUMER_IDS_CHANGED notices taken."""
        self._other_requests = connections.on_request
        connections.on_request = self._on_request

    def _on_request(self, connection: BrokerConnection, frame: Frame) -> None:
        if frame.type is not FrameType.CONSUMER_IDS_CHANGED:
            if self._other_requests is not None:
                self._other_requests(connection, frame)
            return
        if ConsumerIdsChangedNotice.FromString(frame.header).consumer_group != self.group:
            return
        self.notices += 1
        # Heartbeat now rather than at the end of the interval: the answer has the
        # members, and a different list wakes the rebalance.
        self.wakeup()

    async def run_once(self) -> None:
        await self.heartbeat()

    async def _addresses(self) -> list[str]:
        """Every broker (masters and slaves) serving any subscribed topic."""
        addresses: dict[str, None] = {}
        for topic in self.subscriptions:
            try:
                route = await self._routes.route(topic)
            except UnknownTopic:
                continue  # not created yet: nobody to tell
            for group in route.groups:
                addresses.update(dict.fromkeys(group.addresses))
        return sorted(addresses)

    def _request(self, leaving: bool) -> ConsumerHeartbeatRequest:
        request = ConsumerHeartbeatRequest(
            consumer_group=self.group,
            client_id=self.client_id,
            computer_room=self.computer_room,
            mode=self.mode.to_proto(),
            leaving=leaving,
            notify_member_changes=True,
            client_version=CLIENT_VERSION,
            language=LANGUAGE,
        )
        for topic, tags in sorted(self.subscriptions.items()):
            request.subscriptions.add(topic=topic, tag_expression=tags.expression)
        if self._held is not None:
            held = tuple(sorted(self._held()))
            if held != self._reported or not self._holdings_version:
                self._reported = held
                self._holdings_version += 1
            request.report_holdings = True
            request.holdings_version = self._holdings_version
            request.held.extend(
                HeldQueueProto(topic=t, broker_name=b, queue_id=q) for t, b, q in held
            )
        return request

    async def _send(
        self, addresses: Sequence[str], leaving: bool
    ) -> list[tuple[Sequence[Member], dict[str, Holdings]]]:
        request = self._request(leaving)
        # Brokers no longer serving the topics: their copies would never be updated.
        self._copies = {a: self._copies.get(a) or BrokerCopy() for a in addresses}

        async def one(address: str) -> tuple[Sequence[Member], dict[str, Holdings]]:
            copy = self._copies[address]
            asked_seq = copy.seq
            request.known_epoch, request.known_seq = copy.epoch, asked_seq
            header = request.SerializeToString()
            connection = await self._connections.get(address)
            frame = await connection.request(
                FrameType.CONSUMER_HEARTBEAT, header, timeout_s=self._request_timeout_s
            )
            copy.apply(ConsumerHeartbeatResponse.FromString(frame.header), asked_seq)
            return copy.listed()

        results = await asyncio.gather(*(one(a) for a in addresses), return_exceptions=True)
        answers: list[tuple[Sequence[Member], dict[str, Holdings]]] = []
        for address, result in zip(addresses, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                log.warning("consumer heartbeat to broker %s failed: %s", address, result)
            else:
                answers.append(result)
        return answers

    async def heartbeat(self) -> tuple[Member, ...]:
        """Heartbeat every broker now; return the members (the last known if none answered)."""
        addresses = await self._addresses()
        answers = await self._send(addresses, leaving=False)
        if not answers:
            return self.members
        members = merge_members(listed for listed, _ in answers)
        if self._held is not None:
            live = {m.client_id for m in members}
            merged = merge_holdings(holdings for _, holdings in answers)
            self.holdings = {c: h for c, h in merged.items() if c in live}
        if members != self.members:
            log.info(
                "consumer group %s members now: %s",
                self.group,
                ", ".join(f"{m.client_id} ({m.computer_room})" for m in members),
            )
            self.members = members
            self._on_change()
        return members

    async def leave(self) -> None:
        """Tell every broker this consumer leaves, so the others rebalance at once."""
        addresses = await self._addresses()
        await self._send(addresses, leaving=True)
