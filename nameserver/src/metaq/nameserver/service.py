"""The ``metaq.v1.NameServer`` gRPC servicer: the registry and assignment behind the wire.

Status codes: INVALID_ARGUMENT for a request that cannot be acted on as sent (unknown
strategy, missing fields, bad addresses), NOT_FOUND for a topic no live broker serves,
FAILED_PRECONDITION for a registration the group's live brokers contradict (epochs,
masters, clusters). Messages say what was wrong and, where it helps, what is accepted.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Mapping
from typing import TypeAlias

import grpc

from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1 import control_pb2_grpc
from metaq.nameserver import convert
from metaq.nameserver.assignment import STRATEGIES, Assignment, assign
from metaq.nameserver.convert import InvalidRequest
from metaq.nameserver.model import BrokerKey, Registered, TopicConfig, TopicRoute
from metaq.nameserver.registry import RegistrationRefused, Registry, readable_queues

log = logging.getLogger(__name__)

Context: TypeAlias = grpc.aio.ServicerContext[object, object]


class NameServerService(control_pb2_grpc.NameServerServicer):
    """Answers brokers and clients from one :class:`Registry`; holds no other state."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._sessions = itertools.count(1)
        self._expiry_ms = round(registry.broker_expiry_s * 1000)

    # --- brokers ------------------------------------------------------------------------

    async def Session(
        self,
        request_iterator: AsyncIterator[pb.BrokerHeartbeat],
        context: Context,
    ) -> AsyncIterator[pb.SessionEvent]:
        session = next(self._sessions)
        key: BrokerKey | None = None
        topics: Mapping[str, TopicConfig] | None = None
        try:
            async for heartbeat in request_iterator:
                try:
                    state = convert.broker_state(heartbeat.broker)
                    if key is not None and state.key != key:
                        raise InvalidRequest(
                            f"this session speaks for broker {key}, not {state.key}; "
                            "open one session per broker"
                        )
                    if heartbeat.HasField("topic_table"):
                        topics = convert.topic_table(heartbeat.topic_table, state.key)
                    elif topics is None:
                        raise InvalidRequest(
                            f"broker {state.key}: the first heartbeat of a session must "
                            "carry the topic table"
                        )
                    fresh = key is None or not self._registry.is_live(state.key)
                    registered = self._registry.register(state, topics, session=session)
                except InvalidRequest as exc:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                except RegistrationRefused as exc:
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
                if fresh:
                    log.info(
                        "broker %s registered (%s, %s, %d topics, session %d)",
                        state.key,
                        state.role.value,
                        state.data_address,
                        len(topics),
                        session,
                    )
                key = state.key
                self._log_fenced(registered)
                yield pb.SessionEvent(registered=self._registered(registered))
        finally:
            if key is not None and self._registry.end_session(key, session):
                log.info("broker %s left the routes: its session %d ended", key, session)

    async def RegisterBroker(
        self, request: pb.RegisterBrokerRequest, context: Context
    ) -> pb.RegisterBrokerResponse:
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
        self._log_fenced(registered)
        return self._registered(registered)

    async def UnregisterBroker(
        self, request: pb.UnregisterBrokerRequest, context: Context
    ) -> pb.UnregisterBrokerResponse:
        try:
            key = convert.broker_key(request.broker_name, request.broker_id)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        removed = self._registry.unregister(key)
        if removed:
            log.info("broker %s unregistered", key)
        return pb.UnregisterBrokerResponse(removed=removed)

    # --- clients ------------------------------------------------------------------------

    async def GetRoute(self, request: pb.GetRouteRequest, context: Context) -> pb.GetRouteResponse:
        route = await self._route(request.topic, context)
        return pb.GetRouteResponse(route=convert.route_out(route))

    async def GetClusterInfo(
        self, request: pb.GetClusterInfoRequest, context: Context
    ) -> pb.GetClusterInfoResponse:
        return pb.GetClusterInfoResponse(
            clusters=convert.clusters_out(self._registry.cluster_info(request.cluster)),
            broker_expiry_ms=self._expiry_ms,
        )

    async def GetAssignment(
        self, request: pb.GetAssignmentRequest, context: Context
    ) -> pb.GetAssignmentResponse:
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
        if not any(m.consumer_id == request.consumer_id for m in request.request.members):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"consumer {request.consumer_id!r} is not among the members of consumer group "
                f"{request.request.consumer_group!r}",
            )
        assignment = await self._assign(request.request, context)
        return pb.GetAssignmentForResponse(
            queues=convert.queues_out(request.request.topic, assignment[request.consumer_id])
        )

    # --- helpers ------------------------------------------------------------------------

    async def _route(self, topic: str, context: Context) -> TopicRoute:
        if not topic:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "topic must not be empty")
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
                f"unknown assignment strategy {request.strategy!r}; "
                f"known: {', '.join(sorted(STRATEGIES))}",
            )
        try:
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

    def _registered(self, registered: Registered) -> pb.RegisterBrokerResponse:
        return pb.RegisterBrokerResponse(
            master_data_address=registered.master_data_address,
            epoch=registered.epoch,
            broker_expiry_ms=self._expiry_ms,
        )

    @staticmethod
    def _log_fenced(registered: Registered) -> None:
        for key in registered.fenced:
            log.warning("broker %s left the routes: a master of a higher epoch registered", key)
