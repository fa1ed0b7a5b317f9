"""The cluster as the nameservers know it: its broker groups and brokers, topic routes,
the assignment of queues to consumers, and a planned switchover of a group's master."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from metaq.client.admin.brokers import BrokerCalls
from metaq.client.admin.results import (
    ControllerStatus,
    GroupRate,
    SwitchoverResult,
    TopicRate,
    TrafficStats,
)
from metaq.client.errors import AdminError, BrokerAdminError, UnknownTopic
from metaq.client.routes import ClusterView
from metaq.common.auth import call_metadata
from metaq.common.model import BrokerView, GroupControl, QueueRoute, TopicRoute
from metaq.common.tls import GRPC_MESSAGE_LIMIT
from metaq.common.v1 import control_pb2 as pb

if TYPE_CHECKING:
    from metaq.common.v1.control_pb2_grpc import NameServerAsyncStub


class ClusterAdmin(BrokerCalls):
    """The calls that ask the nameservers (and, for a switchover, the master)."""

    async def cluster(self, name: str = "") -> ClusterView:
        """Every cluster (or just ``name``), its broker groups and brokers."""
        answered: list[str] = []

        async def call(stub: NameServerAsyncStub) -> pb.GetClusterInfoResponse:
            return await stub.GetClusterInfo(
                pb.GetClusterInfoRequest(cluster=name), timeout=self.routes.rpc_timeout_s
            )

        reply = await self.routes.call(call, answered=answered)
        return ClusterView.from_proto(reply, answered[0] if answered else "")

    async def controller_status(self) -> ControllerStatus:
        """The failover controller as the first nameserver that answers sees it: Raft
        leader, members and term, and each managed group's master, epoch and in-sync
        set."""
        answered: list[str] = []

        async def call(stub: NameServerAsyncStub) -> pb.GetControllerStateResponse:
            return await stub.GetControllerState(
                pb.GetControllerStateRequest(), timeout=self.routes.rpc_timeout_s
            )

        reply = await self.routes.call(call, answered=answered)
        return ControllerStatus(
            nameserver=answered[0] if answered else "",
            leader=reply.leader,
            is_leader=reply.is_leader,
            term=reply.term,
            has_quorum=reply.has_quorum,
            members=[(m.address, m.connected) for m in reply.members],
            groups=[GroupControl.from_proto(g) for g in reply.groups],
        )

    async def broker(self, name: str) -> BrokerView:
        """The live broker ``GROUP/ID``, or ``GROUP``'s master; AdminError naming the
        known brokers when there is no such broker, or saying when it is down."""
        group, _, broker_id = name.partition("/")
        if broker_id and not broker_id.isdigit():
            raise AdminError(f"a broker is GROUP or GROUP/ID (a number), not {name!r}")
        view = await self.cluster()
        every = view.brokers(down=True)
        for b in every:
            if b.broker_name != group:
                continue
            if (b.broker_id == int(broker_id)) if broker_id else (b.is_master and not b.down):
                if b.down:
                    raise AdminError(
                        f"broker {name} is down (it left the nameserver "
                        f"{b.last_heartbeat_age_s:.0f} s ago)"
                    )
                return b
        known = ", ".join(f"{b.broker_name}/{b.broker_id}" for b in every) or "none"
        what = f"broker {name}" if broker_id else f"live master of broker group {group!r}"
        raise AdminError(f"no {what} is registered (brokers: {known})")

    async def route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """The topic's route as clients get it (UnknownTopic when no broker serves it)."""
        return await self.routes.route(topic, refresh=refresh)

    async def masters(
        self, brokers: Sequence[str] | None = None, *, cluster: str = ""
    ) -> list[BrokerView]:
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

    async def stats(self, *, cluster: str = "") -> TrafficStats:
        """Messages in and out per topic and per consumer group over every live broker
        (masters take the sends; masters and slaves serve pulls), so far and per second
        over the last minute. A broker that does not answer is named in
        ``unreachable``; AdminError when none answers."""
        brokers = [b for b in (await self.cluster(cluster)).brokers() if b.state.http_address]
        if not brokers:
            raise AdminError("no live broker with an admin address is registered")
        answers = await asyncio.gather(
            *(self.broker_stats(b) for b in brokers), return_exceptions=True
        )
        topics: dict[str, list[float]] = {}
        groups: dict[tuple[str, str], list[float]] = {}
        unreachable, windows = [], []
        for broker, answer in zip(brokers, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer
                unreachable.append(f"{broker.broker_name}/{broker.broker_id}: {answer}")
                continue
            windows.append(answer.window_s)
            for t in answer.topics:
                row = topics.setdefault(t.topic, [0, 0, 0.0, 0.0])
                for n, value in enumerate((t.in_total, t.out_total, t.in_tps, t.out_tps)):
                    row[n] += value
            for g in answer.groups:
                row = groups.setdefault((g.group, g.topic), [0, 0, 0.0, 0.0])
                for n, value in enumerate(
                    (g.pulled_total, g.acked_total, g.pulled_tps, g.acked_tps)
                ):
                    row[n] += value
        if not windows:
            raise AdminError("no broker answered for its stats: " + "; ".join(unreachable))
        return TrafficStats(
            min(windows),
            [TopicRate(t, int(r[0]), int(r[1]), round(r[2], 3), round(r[3], 3))
             for t, r in sorted(topics.items())],
            [GroupRate(g, t, int(r[0]), int(r[1]), round(r[2], 3), round(r[3], 3))
             for (g, t), r in sorted(groups.items())],
            unreachable,
        )  # fmt: skip

    async def assignment(
        self,
        group: str,
        topic: str,
        strategy: str,
        members: Sequence[tuple[str, str]],
        previous: Mapping[str, Iterable[tuple[str, int]]] | None = None,
    ) -> dict[str, list[QueueRoute]]:
        """The topic's readable queues shared out among ``members`` ((consumer id,
        computer room) pairs) by ``strategy``; the sticky strategies keep ``previous``
        ((broker group, queue id) pairs each member runs now) in place where they can.

        Every member is a key of the answer, possibly with no queues. NameServerError for
        an unknown strategy, UnknownTopic, NoNameServer; AdminError when the request
        would pass the gRPC message limit (``metaq.common.tls.GRPC_MESSAGE_LIMIT``).
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
                    pb.MessageQueue(topic=topic, broker_name=broker, queue_id=queue_id)
                    for broker, queue_id in queues
                ],
            )
        size = request.ByteSize()
        if size > GRPC_MESSAGE_LIMIT:
            held = sum(len(p.queues) for p in request.previous)
            raise AdminError(
                f"the GetAssignment request for group {group!r}, topic {topic!r} is {size:,} "
                f"bytes ({len(members):,} members, {held:,} held queues), over the "
                f"{GRPC_MESSAGE_LIMIT:,}-byte gRPC message limit: split the topic's queues "
                "over more topics or the group's consumers over more groups"
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
        members = {b.broker_id: b for b in found.brokers}
        if to not in members:
            listed = ", ".join(f"{i} ({members[i].state.role})" for i in sorted(members)) or "none"
            raise AdminError(
                f"broker group {group!r} has no broker with id {to}; its brokers: {listed}"
            )
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

        async def call(stub: NameServerAsyncStub, target: str) -> pb.SwitchoverResponse:
            body = request.SerializeToString(deterministic=True)
            return await stub.Switchover(
                request,
                timeout=routes.rpc_timeout_s,
                # Signed per attempt for the nameserver it goes to: a retry on another
                # nameserver is a fresh proof, and no proof is good at two of them.
                metadata=call_metadata(self._secret, "Switchover", target, body, time.time()),
            )

        reply = await routes.call_at(call)
        return reply.control
