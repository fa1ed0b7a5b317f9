"""The ``metaq.v1.NameServer`` gRPC servicer: the registry and assignment behind the wire.

Status codes: INVALID_ARGUMENT for a request that cannot be acted on as sent (unknown
strategy, missing fields, bad addresses), NOT_FOUND for a topic no live broker serves,
FAILED_PRECONDITION for a registration the group's live brokers contradict (epochs,
masters, clusters) and for a switchover whose preconditions do not hold, UNAVAILABLE when
the failover controller has no Raft majority. Messages say what was wrong and, where it
helps, what is accepted.

Authentication: with a cluster secret, every call that changes the cluster (Session,
RegisterBroker, UnregisterBroker, Switchover) must prove it (``metaq.common.auth``) or
is refused with UNAUTHENTICATED before it changes anything; the questions (routes,
cluster, assignment, controller state) stay open to every client. A Session's proof is
over the broker identity it opens with, and every heartbeat on it must be that broker's,
so a captured proof cannot register another broker; every proof names the nameserver it
is for (``x-metaq-target``), so one captured on its way to one nameserver is refused by
the others. An UnregisterBroker signed before
the broker's current registration (by the broker's own clock) is refused, so a captured
one cannot depose the broker once it is back.

Sessions: each ``Session`` stream answers every heartbeat as it reads it, and sends news
unasked whenever the controller's state of the broker's group changes, so the broker
reads news independently of its writes; both go through one outbox, in order.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TypeAlias

import grpc
from google.protobuf.message import DecodeError, Message

from metaq.common import acl
from metaq.common.acl import PermissionDenied, User
from metaq.common.auth import (
    METADATA_KEY,
    SESSION_IDENTITY_KEY,
    AuthFailed,
    ClusterSecret,
)
from metaq.common.model import BrokerKey, BrokerState, GroupControl, TopicConfig, TopicRoute
from metaq.common.names import shown
from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1 import control_pb2_grpc
from metaq.nameserver import convert
from metaq.nameserver.assignment import STRATEGIES, Assignment, assign
from metaq.nameserver.controller import Controller, ControllerUnavailable, SwitchoverRefused
from metaq.nameserver.convert import InvalidRequest
from metaq.nameserver.registry import (
    MAX_KEPT_ROUTES,
    Registered,
    RegistrationRefused,
    Registry,
    readable_queues,
)
from metaq.nameserver.user_auth import Check, UserCalls

log = logging.getLogger(__name__)

Context: TypeAlias = grpc.aio.ServicerContext[object, object]


@dataclass(frozen=True, slots=True)
class _Abort:
    code: grpc.StatusCode
    details: str


@dataclass(eq=False, slots=True)
class _Stream:
    """One open Session stream: whom it speaks for, and what to send it next."""

    session: int
    context: Context
    outbox: deque[pb.SessionEvent] = field(default_factory=deque)
    """What to send next, in order: answers to heartbeats and news sent unasked."""
    writing: bool = False
    """A write is under way: whoever started it sends the rest of the outbox too."""
    bound: pb.BrokerState | None = None
    """The identity the stream opened with: its heartbeats may speak for no other."""
    signed_at_s: float | None = None
    """When the broker signed the stream's proof, by its own clock."""
    key: BrokerKey | None = None
    controlled: bool = False
    topics: dict[str, TopicConfig] | None = None
    """The broker's table as this session holds it (changes are applied to it)."""
    sent: pb.BrokerState | None = None
    """The broker state the last accepted heartbeat carried, as sent, and ``state`` made
    from it: most heartbeats repeat it, and are neither converted nor checked again."""
    state: BrokerState | None = None


class NameServerService(control_pb2_grpc.NameServerServicer):
    """Answers brokers and clients from one :class:`Registry` and the failover controller."""

    def __init__(
        self,
        registry: Registry,
        controller: Controller,
        secret: ClusterSecret | None,
        users: UserCalls,
    ) -> None:
        self._registry = registry
        self._users = users
        self._controller = controller
        self._secret = secret
        self._sessions = itertools.count(1)
        self._expiry_ms = round(registry.broker_expiry_s * 1000)
        # Open streams by group, then session: whom to tell when a group's control changes.
        self._streams: dict[str, dict[int, _Stream]] = {}
        # When each registered broker signed its current registration (its own clock):
        # an UnregisterBroker signed earlier is a replay from before it.
        self._registered_at_s: dict[BrokerKey, float] = {}
        self._standby_ms = round(controller.settings.standby_heartbeat_interval_s * 1000)
        self._news: set[asyncio.Task[None]] = set()
        # Each topic's last route answer, with the route it was made from: the registry
        # hands out the same route object while nothing it shows changes.
        self._route_answers: dict[str, tuple[TopicRoute, pb.GetRouteResponse]] = {}
        controller.add_listener(self._push)
        controller.add_leadership_listener(self._leadership_changed)

    # --- brokers ------------------------------------------------------------------------

    # The generated servicer declares the generator form; grpc.aio takes a coroutine too.
    async def Session(  # type: ignore[override]
        self,
        request_iterator: AsyncIterator[pb.BrokerHeartbeat],
        context: Context,
    ) -> None:
        # A stream is proven once, when it opens, for the broker it names then: its
        # heartbeats all come over it and must all be that broker's.
        identity = self._metadata(context, SESSION_IDENTITY_KEY)
        if not isinstance(identity, bytes) and self._secret is not None:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"Session needs the broker's identity ({SESSION_IDENTITY_KEY} metadata) "
                "with the proof of the cluster secret over it; this broker is older than "
                "this nameserver or not a metaq broker: upgrade it",
            )
        body = identity if isinstance(identity, bytes) else None
        signed_at_s = await self._authorize(context, "Session", body or b"")
        stream = _Stream(next(self._sessions), context, signed_at_s=signed_at_s)
        if body is not None:
            stream.bound = await self._session_identity(body, context)
        # The handler reads and answers in place (grpc.aio's reader/writer API): no task,
        # queue or generator between a heartbeat and its answer, whose hops cost more than
        # the answer itself at thousands of heartbeats a second.
        try:
            while True:
                heartbeat = await context.read()
                if not isinstance(heartbeat, pb.BrokerHeartbeat):
                    return  # grpc.aio.EOF: the broker closed its side
                try:
                    answer = self._heartbeat(heartbeat, stream)
                except Exception:
                    log.exception("session %d: a heartbeat could not be handled", stream.session)
                    answer = _Abort(grpc.StatusCode.INTERNAL, "the nameserver failed a heartbeat")
                if isinstance(answer, _Abort):
                    await context.abort(answer.code, answer.details)
                stream.outbox.append(answer)
                if not stream.writing:
                    stream.writing = True
                    await self._flush(stream)
        finally:
            self._end(stream)

    @staticmethod
    async def _flush(stream: _Stream) -> None:
        """Write the stream's outbox in order, one write at a time (gRPC allows no more);
        whoever finds it idle claims it (``writing``, set by the caller before anything
        else can run) and writes, so an answer and the news before it keep their order."""
        try:
            while stream.outbox:
                await stream.context.write(stream.outbox.popleft())
        finally:
            stream.writing = False

    async def _flush_news(self, stream: _Stream) -> None:
        try:
            await self._flush(stream)
        except Exception as exc:  # the stream broke: its reader ends the session
            log.debug("session %d: news not sent: %s", stream.session, exc)

    def _heartbeat(
        self, heartbeat: pb.BrokerHeartbeat, stream: _Stream
    ) -> pb.SessionEvent | _Abort:
        try:
            if stream.state is not None and heartbeat.broker == stream.sent:
                state = stream.state
            else:
                state = convert.broker_state(heartbeat.broker)
                self._check_bound(stream, heartbeat.broker)
                if stream.key is not None and state.key != stream.key:
                    raise InvalidRequest(
                        f"this session speaks for broker {stream.key}, not {state.key}; "
                        "open one session per broker"
                    )
                stream.sent, stream.state = heartbeat.broker, state
            changed: tuple[str, ...] = ()
            if heartbeat.HasField("topic_table"):
                stream.topics = convert.topic_table(heartbeat.topic_table, state.key)
            elif stream.topics is None:
                raise InvalidRequest(
                    f"broker {state.key}: the first heartbeat of a session must "
                    "carry the topic table"
                )
            elif heartbeat.HasField("topic_changes"):
                # Applied to the session's table in place: a create costs one topic's
                # work, not the broker's whole table (the registry reindexes these only).
                changes = convert.topic_changes(heartbeat.topic_changes, state.key)
                for config in changes.put:
                    stream.topics[config.name] = config
                for name in changes.deleted:
                    stream.topics.pop(name, None)
                changed = (*(t.name for t in changes.put), *changes.deleted)
            fresh = stream.key is None or not self._registry.is_live(state.key)
            registered = self._registry.register(
                state, stream.topics, session=stream.session, changed=changed
            )
        except InvalidRequest as exc:
            return _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except RegistrationRefused as exc:
            return _Abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        if fresh:
            log.info(
                "broker %s registered (%s, %s, %d topics, session %d)",
                state.key,
                state.role.value,
                state.data_address,
                len(stream.topics),
                stream.session,
            )
            if state.controlled and self._controller.control(state.key.broker_name) is None:
                self._controller.wakeup()  # a new group: bootstrap now, not next round
        if stream.key is None:
            self._streams.setdefault(state.key.broker_name, {})[stream.session] = stream
        if stream.signed_at_s is not None:
            self._registered_at_s[state.key] = stream.signed_at_s
        stream.key = state.key
        stream.controlled = state.controlled
        self._log_fenced(registered)
        response = self._registered(state, registered)
        version, text = self._controller.acl
        if heartbeat.HasField("acl_version") and version > heartbeat.acl_version:
            response.acl = text.encode()
        return pb.SessionEvent(registered=response, answers=heartbeat.sequence)

    def _end(self, stream: _Stream) -> None:
        key = stream.key
        if key is None:
            return
        streams = self._streams.get(key.broker_name, {})
        streams.pop(stream.session, None)
        if not streams:
            self._streams.pop(key.broker_name, None)
        if self._registry.end_session(key, stream.session):
            self._registered_at_s.pop(key, None)
            log.info("broker %s left the routes: its session %d ended", key, stream.session)
            if stream.controlled:
                self._controller.wakeup()  # it may have been a master: decide now

    def _push(self, control: GroupControl) -> None:
        """The controller's state of a group changed: tell its brokers' open sessions."""
        streams = [s for s in self._streams.get(control.broker_name, {}).values() if s.controlled]
        if not streams:
            return
        live = self._registry.members(control.broker_name)
        response = pb.RegisterBrokerResponse(
            epoch=max((b.state.epoch for b in live), default=0),
            broker_expiry_ms=self._expiry_ms,
        )
        self._add_control(response, control)
        for stream in streams:
            self._tell(stream, response, control)

    def _leadership_changed(self, leading: bool) -> None:
        """This nameserver's controller became the leader (or stopped being it): tell every
        controlled broker at once how often to beat here now, so a new leader hears the
        masters at their full rate within a round trip, not at their next standby beat."""
        for streams in self._streams.values():
            for stream in streams.values():
                if not stream.controlled or stream.key is None:
                    continue
                control = self._controller.control(stream.key.broker_name)
                response = pb.RegisterBrokerResponse(broker_expiry_ms=self._expiry_ms)
                if control is not None:
                    self._add_control(response, control)
                self._tell(stream, response, control)

    def _tell(
        self, stream: _Stream, response: pb.RegisterBrokerResponse, control: GroupControl | None
    ) -> None:
        """Push ``response`` unasked to ``stream``, with the beat this nameserver wants."""
        assert stream.key is not None
        event = pb.SessionEvent()
        event.registered.CopyFrom(response)
        event.registered.heartbeat_interval_ms = self._beat_ms(stream.key, True, control)
        stream.outbox.append(event)
        if not stream.writing:
            # Claimed now, not when the task starts: a heartbeat answered before then
            # must leave its answer to this flush rather than write beside it.
            stream.writing = True
            task = asyncio.get_running_loop().create_task(
                self._flush_news(stream), name=f"session-{stream.session}-news"
            )
            self._news.add(task)  # held until done: the loop keeps only weak references
            task.add_done_callback(self._news.discard)

    async def RegisterBroker(
        self, request: pb.RegisterBrokerRequest, context: Context
    ) -> pb.RegisterBrokerResponse:
        signed_at_s = await self._authorize(context, "RegisterBroker", request)
        try:
            state = convert.broker_state(request.broker)
            if not request.HasField("topic_table"):
                raise InvalidRequest(f"broker {state.key}: topic_table is required")
            topics = convert.topic_table(request.topic_table, state.key)
            registered = self._registry.register(state, topics)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except RegistrationRefused as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        if signed_at_s is not None:
            self._registered_at_s[state.key] = signed_at_s
        self._log_fenced(registered)
        return self._registered(state, registered)

    async def UnregisterBroker(
        self, request: pb.UnregisterBrokerRequest, context: Context
    ) -> pb.UnregisterBrokerResponse:
        signed_at_s = await self._authorize(context, "UnregisterBroker", request)
        try:
            key = convert.broker_key(request.broker_name, request.broker_id)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        registered_at_s = self._registered_at_s.get(key)
        if (
            signed_at_s is not None
            and registered_at_s is not None
            and signed_at_s < registered_at_s
        ):
            log.warning(
                "refused UnregisterBroker %s from %s: signed %.3f s before its registration",
                key,
                context.peer(),
                registered_at_s - signed_at_s,
            )
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"broker {key} registered again after this UnregisterBroker was signed "
                f"({registered_at_s - signed_at_s:.3f} s later by its clock): a stale or "
                "replayed request; a broker that means to leave signs a new one",
            )
        removed = self._registry.unregister(key)
        if removed:
            self._registered_at_s.pop(key, None)
            log.info("broker %s unregistered", key)
            self._controller.wakeup()
        return pb.UnregisterBrokerResponse(removed=removed)

    # --- clients ------------------------------------------------------------------------

    async def GetRoute(self, request: pb.GetRouteRequest, context: Context) -> pb.GetRouteResponse:
        await self._user(context, "GetRoute", request, _topic_user(request.topic))
        route = await self._route(request.topic, context)
        kept = self._route_answers.get(request.topic)
        if kept is not None and kept[0] is route:
            return kept[1]
        answer = pb.GetRouteResponse(route=route.to_proto())
        if len(self._route_answers) >= MAX_KEPT_ROUTES:
            self._route_answers.clear()
        self._route_answers[request.topic] = (route, answer)
        return answer

    async def GetClusterInfo(
        self, request: pb.GetClusterInfoRequest, context: Context
    ) -> pb.GetClusterInfoResponse:
        await self._user(context, "GetClusterInfo", request, _anyone)
        return pb.GetClusterInfoResponse(
            clusters=convert.clusters_out(
                self._registry.cluster_info(request.cluster),
                self._group_control,
                self._registry.departed(),
                request.cluster,
            ),
            broker_expiry_ms=self._expiry_ms,
        )

    async def GetAssignment(
        self, request: pb.GetAssignmentRequest, context: Context
    ) -> pb.GetAssignmentResponse:
        await self._user(context, "GetAssignment", request, _group_member(request.consumer_group))
        assignment = await self._assign(request, context)
        return pb.GetAssignmentResponse(
            assignment=[
                pb.MemberQueues(
                    consumer_id=consumer_id,
                    queues=convert.queues_out(request.topic, assignment[consumer_id]),
                )
                for consumer_id in sorted(assignment)
            ]
        )

    async def GetAssignmentFor(
        self, request: pb.GetAssignmentForRequest, context: Context
    ) -> pb.GetAssignmentForResponse:
        group = request.request.consumer_group
        await self._user(context, "GetAssignmentFor", request, _group_member(group))
        if not any(m.consumer_id == request.consumer_id for m in request.request.members):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"consumer {shown(request.consumer_id)} is not among the members of consumer "
                f"group {shown(request.request.consumer_group)}",
            )
        assignment = await self._assign(request.request, context)
        return pb.GetAssignmentForResponse(
            queues=convert.queues_out(request.request.topic, assignment[request.consumer_id])
        )

    # --- the failover controller ----------------------------------------------------------

    async def GetControllerState(
        self, request: pb.GetControllerStateRequest, context: Context
    ) -> pb.GetControllerStateResponse:
        await self._user(context, "GetControllerState", request, _anyone)
        controller = self._controller
        controls = controller.controls
        raft = controller.raft_status()
        return pb.GetControllerStateResponse(
            groups=[self._control_out(controls[name]) for name in sorted(controls)],
            leader=controller.leader,
            is_leader=controller.is_leader,
            members=[pb.RaftMember(address=a, connected=c) for a, c in raft.members],
            term=raft.term,
            has_quorum=raft.has_quorum,
        )

    async def Switchover(
        self, request: pb.SwitchoverRequest, context: Context
    ) -> pb.SwitchoverResponse:
        if self._users.enabled and self._metadata(context, METADATA_KEY) is None:
            # With users, an admin may move a master without holding the cluster secret.
            await self._user(context, "Switchover", request, _admin)
        else:
            await self._authorize(context, "Switchover", request)
        try:
            convert.check_text(request.broker_name, "broker_name")
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            control = await self._controller.switchover(
                request.broker_name, request.broker_id, request.expected_epoch
            )
        except SwitchoverRefused as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except ControllerUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return pb.SwitchoverResponse(control=self._control_out(control))

    # --- helpers ------------------------------------------------------------------------

    async def _authorize(
        self, context: Context, method: str, request: Message | bytes
    ) -> float | None:
        """End the call with UNAUTHENTICATED unless it proves the cluster secret; when
        it does, return when the caller signed it (None without a secret)."""
        if self._secret is None:
            return None
        body = (
            request if isinstance(request, bytes) else request.SerializeToString(deterministic=True)
        )
        try:
            return self._users.member_signed_at(context, method, body)
        except AuthFailed as exc:
            log.warning("refused %s from %s: %s", method, context.peer(), exc)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))

    async def _user(self, context: Context, method: str, request: Message, need: Check) -> None:
        """With auth on, end the call unless a user allowed to make it (or a cluster
        member) signed it (``user_auth``)."""
        if not self._users.enabled:
            return  # nothing to check: not even the request's bytes are needed
        body = request.SerializeToString(deterministic=True)
        await self._users.check(context, method, body, need)

    @staticmethod
    def _metadata(context: Context, key: str) -> str | bytes | None:
        values = [v for k, v in context.invocation_metadata() or () if k == key]
        return values[0] if values else None

    async def _session_identity(self, body: bytes, context: Context) -> pb.BrokerState:
        """The broker a Session opened for, from its proven identity metadata."""
        try:
            identity = pb.BrokerState.FromString(body)
            convert.broker_key(identity.broker_name, identity.broker_id)
            convert.check_text(identity.cluster, "the session identity's cluster")
            convert.check_address(identity.data_address, "the session identity's data_address")
        except (InvalidRequest, DecodeError) as exc:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the {SESSION_IDENTITY_KEY} metadata is not a broker identity ({exc}); it "
                "must be a BrokerState with cluster, broker_name, broker_id and data_address",
            )
        return identity

    @staticmethod
    def _check_bound(stream: _Stream, broker: pb.BrokerState) -> None:
        """Refuse a heartbeat for any broker but the one the stream was opened for."""
        bound = stream.bound
        if bound is None:
            return
        got = (broker.cluster, broker.broker_name, broker.broker_id, broker.data_address)
        want = (bound.cluster, bound.broker_name, bound.broker_id, bound.data_address)
        if got != want:
            raise InvalidRequest(
                f"this session was opened for broker {bound.broker_name}/{bound.broker_id} "
                f"of cluster {shown(bound.cluster)} at {bound.data_address}, not for "
                f"{broker.broker_name}/{broker.broker_id} of cluster {shown(broker.cluster)} "
                f"at {broker.data_address}; open one session per broker, naming it"
            )

    async def _route(self, topic: str, context: Context) -> TopicRoute:
        try:
            convert.check_topic_name(topic)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        route = self._registry.route(topic)
        if route is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"topic {topic!r} is not served by any live broker"
            )
        return route

    async def _assign(self, request: pb.GetAssignmentRequest, context: Context) -> Assignment:
        if request.strategy not in STRATEGIES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown assignment strategy {shown(request.strategy)}; "
                f"known: {', '.join(sorted(STRATEGIES))}",
            )
        try:
            convert.check_group_name(request.consumer_group)
            members = convert.members(request)
            previous = convert.previous(request)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        route = await self._route(request.topic, context)
        try:
            return assign(request.strategy, members, readable_queues(route), previous)
        except ValueError as exc:  # e.g. a consumer listed in two rooms
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"consumer group {request.consumer_group!r}: {exc}",
            )

    def _registered(self, state: BrokerState, registered: Registered) -> pb.RegisterBrokerResponse:
        response = pb.RegisterBrokerResponse(
            master_data_address=registered.master_data_address,
            epoch=registered.epoch,
            broker_expiry_ms=self._expiry_ms,
            takes_topic_changes=True,
        )
        control = self._controller.control(state.key.broker_name)
        if state.controlled and control is not None:
            self._add_control(response, control)
            # Only the leader elects: only its answer may extend a master's lease.
            response.lease_granted = self._controller.is_leader
        response.heartbeat_interval_ms = self._beat_ms(state.key, state.controlled, control)
        return response

    def _beat_ms(self, key: BrokerKey, controlled: bool, control: GroupControl | None) -> int:
        """How often this nameserver wants the broker's heartbeats (0: its own rate).

        Only the leader decides, on its own registry, and of a bootstrapped group only the
        master's silence is a failover; a slave's beat decides only whether it is fresh
        enough to elect (master_detection_ms, twice the standby beat at most). Every other
        beat keeps the routes (broker_expiry_s) and is asked for at the standby rate.
        """
        if self._standby_ms == 0:
            return 0
        decisive = controlled and (control is None or control.master_id == key.broker_id)
        return 0 if decisive and self._controller.is_leader else self._standby_ms

    def _add_control(self, response: pb.RegisterBrokerResponse, control: GroupControl) -> None:
        """The controller's state, and its master as the one to follow (not the routes')."""
        response.control.CopyFrom(self._control_out(control))
        response.master_data_address = response.control.master_data_address

    def _control_out(self, control: GroupControl) -> pb.GroupControl:
        master = BrokerKey(control.broker_name, control.master_id)
        return control.to_proto(self._registry.data_address(master))

    def _group_control(self, broker_name: str) -> pb.GroupControl | None:
        control = self._controller.control(broker_name)
        return None if control is None else self._control_out(control)

    @staticmethod
    def _log_fenced(registered: Registered) -> None:
        for key in registered.fenced:
            log.warning("broker %s left the routes: a master of a higher epoch registered", key)


def _anyone(user: User) -> None:
    """Any authenticated user may ask."""


def _admin(user: User) -> None:
    acl.check(user, "admin", "cluster", "")


def _topic_user(topic: str) -> Check:
    """A topic's route is for whoever may publish to or consume it."""

    def need(user: User) -> None:
        if not user.allows("pub", "topic", topic):
            try:
                acl.check(user, "sub", "topic", topic)
            except PermissionDenied as exc:
                raise PermissionDenied(
                    f"user {user.access_key} lacks pub and sub on topic {topic}; grant one "
                    f"with metaq acl grant {user.access_key} pub topic:{topic}",
                    exc.reason,
                ) from None

    return need


def _group_member(group: str) -> Check:
    def need(user: User) -> None:
        acl.check(user, "sub", "group", group)

    return need
