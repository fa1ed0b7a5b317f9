"""The broker's data-plane gate for users: the AUTH handshake, signatures, grants.

With ``auth_enabled`` every connection must first prove a user's key (AUTH, see
``metaq.common.frame_auth``); then each request frame must be signed with the session
key, fresh, and allowed by the user's grants (``metaq.common.acl``). The exceptions are
the cluster's own: REPLICA_AUTH, and on a connection where a slave proved the cluster
secret, its REPLICA_FETCH, forwarded commits and heartbeats (``replica_auth``).

A refused request gets ERROR NO_PERMISSION saying what is missing and how to grant it,
is counted in ``metaq_auth_denied_total{reason}`` and logged with the user and the
reason, never a key or proof. The user's grants are looked up in the ACL in force at
each request, so a revoke takes effect on open connections too.

Without ``auth_enabled`` the gate only answers AUTH with an empty nonce, which tells a
client holding credentials that this broker does not check them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final, NamedTuple

from prometheus_client import CollectorRegistry, Counter

from metaq.broker.connection import Responder
from metaq.common import acl, frame_auth
from metaq.common.acl import PermissionDenied, User
from metaq.common.acl_source import AclSource
from metaq.common.errors import InvalidMessage
from metaq.common.frame_auth import FrameVerifier
from metaq.common.framing import FLAG_RESPONSE, FLAG_SIGNED, Frame, FrameType, encode_frame
from metaq.common.v1 import data_pb2

log = logging.getLogger(__name__)

_CLUSTER_TYPES: Final = frozenset(
    {FrameType.REPLICA_FETCH, FrameType.COMMIT_OFFSET, FrameType.HEARTBEAT}
)


class _Pending(NamedTuple):
    """The first AUTH step on a connection, until the second."""

    access_key: str
    client_nonce: bytes
    server_nonce: bytes


def denied_counter(registry: CollectorRegistry) -> Counter:
    counter = Counter(
        "metaq_auth_denied",
        "Requests refused by authentication or authorization, by reason",
        ["reason"],
        registry=registry,
    )
    for reason in acl.DENIAL_REASONS:
        counter.labels(reason)
    return counter


class UserGate:
    """Per connection: the handshake in progress, then the user and its frame checker."""

    def __init__(
        self,
        source: AclSource | None,
        proven: Callable[[int], bool],
        denied: Counter,
    ) -> None:
        self._source = source
        self._proven = proven
        """Whether a slave proved the cluster secret on a connection (``replica_auth``)."""
        self._denied = denied
        self._pending: dict[int, _Pending] = {}
        self._sessions: dict[int, FrameVerifier] = {}

    # --- AUTH ---------------------------------------------------------------------------

    def handle(self, responder: Responder, frame: Frame) -> None:
        """The AUTH handler."""
        request = data_pb2.AuthRequest.FromString(frame.header)
        connection = responder.connection_id
        if self._source is None:
            self._answer(responder, frame, data_pb2.AuthResponse())
            return
        if len(request.client_nonce) != frame_auth.NONCE_BYTES:
            raise InvalidMessage(f"client_nonce must be {frame_auth.NONCE_BYTES} bytes")
        user = self._source.acl.user(request.access_key)
        if not request.client_proof:
            self._sessions.pop(connection, None)
            nonce = frame_auth.new_nonce()
            self._pending[connection] = _Pending(request.access_key, request.client_nonce, nonce)
            # A stranger learns nothing from the first step, not even whether the user
            # exists: the refusal comes after the proof.
            self._answer(responder, frame, data_pb2.AuthResponse(server_nonce=nonce))
            return
        pending = self._pending.pop(connection, None)
        if pending is None or (pending.access_key, pending.client_nonce) != (
            request.access_key,
            request.client_nonce,
        ):
            raise self._refuse(
                PermissionDenied("AUTH: a proof without the first step; start over", "bad_proof"),
                request.access_key,
            )
        message = frame_auth.auth_message(
            request.access_key, request.client_nonce, pending.server_nonce
        )
        key = user.verifier.recover(message, request.client_proof) if user else None
        if user is None or key is None:
            raise self._refuse(
                PermissionDenied(
                    f"access key {request.access_key}: unknown user or wrong secret key; "
                    "check the client's access_key/secret_key (metaq acl list shows users)",
                    "unauthenticated",
                ),
                request.access_key,
            )
        host = self._host(responder)
        try:
            acl.check_address(user, host)
        except PermissionDenied as exc:
            raise self._refuse(exc, user.access_key) from None
        self._sessions[connection] = FrameVerifier(
            frame_auth.session_key(
                key, request.access_key, request.client_nonce, pending.server_nonce
            ),
            request.access_key,
        )
        log.info("connection %d from %s: user %s authenticated", connection, host, user.access_key)
        answer = data_pb2.AuthResponse(server_signature=user.verifier.server_signature(message))
        self._answer(responder, frame, answer)

    # --- every request ------------------------------------------------------------------

    def admit(self, responder: Responder, frame: Frame) -> Frame:
        """The frame to handle (signature trailer cut off), or PermissionDenied."""
        if self._source is None:
            if frame.flags & FLAG_SIGNED:
                raise InvalidMessage(
                    "this broker runs without auth and takes no signed frames; the client "
                    "signs only after AUTH told it to"
                )
            return frame
        if frame.type in frame_auth.UNSIGNED_TYPES:
            return frame
        connection = responder.connection_id
        session = self._sessions.get(connection)
        if session is None:
            if frame.type in _CLUSTER_TYPES and self._proven(connection):
                return frame  # a slave that proved the cluster secret
            if frame.type is FrameType.REPLICA_FETCH:
                return frame  # refused with what to configure by the replica gate
            raise self._refuse(
                PermissionDenied(
                    f"{frame.type.name}: this broker requires authentication; give the "
                    "client an access_key and secret_key (or METAQ_ACCESS_KEY / "
                    "METAQ_SECRET_KEY)",
                    "unauthenticated",
                ),
                "",
            )
        if not frame.flags & FLAG_SIGNED:
            raise self._refuse(
                PermissionDenied(
                    f"{frame.type.name} request {frame.request_id} is not signed; after AUTH "
                    "every request must be",
                    "bad_signature",
                ),
                session.access_key,
            )
        try:
            frame = session.verify(frame, time.time_ns() // 1_000_000)
        except PermissionDenied as exc:
            raise self._refuse(exc, session.access_key) from None
        user = self._source.acl.user(session.access_key)
        if user is None:
            raise self._refuse(
                PermissionDenied(
                    f"user {session.access_key} was removed from the ACL", "unauthenticated"
                ),
                session.access_key,
            )
        try:
            _authorize(user, frame)
        except PermissionDenied as exc:
            raise self._refuse(exc, user.access_key) from None
        return frame

    def proven(self, connection_id: int) -> bool:
        return (
            self._source is None or connection_id in self._sessions or self._proven(connection_id)
        )

    def connection_lost(self, connection_id: int) -> None:
        self._pending.pop(connection_id, None)
        self._sessions.pop(connection_id, None)

    # --- internals ----------------------------------------------------------------------

    def count(self, reason: str) -> None:
        """Count a refusal (also the HTTP admin API's) in metaq_auth_denied_total."""
        self._denied.labels(reason).inc()

    def _refuse(self, exc: PermissionDenied, who: str) -> PermissionDenied:
        self.count(exc.reason)
        log.warning("refused %s: %s", who or "an unauthenticated peer", exc)
        return exc

    @staticmethod
    def _host(responder: Responder) -> str:
        peer = getattr(responder, "peer", "")
        return str(peer).rpartition(":")[0] if peer else ""

    @staticmethod
    def _answer(responder: Responder, frame: Frame, answer: data_pb2.AuthResponse) -> None:
        responder.respond(
            encode_frame(
                frame.type, frame.request_id, answer.SerializeToString(), flags=FLAG_RESPONSE
            )
        )


def _authorize(user: User, frame: Frame) -> None:
    """What each request needs: pub on the topic it sends to, sub on the group (and the
    topic) it consumes as; the cluster's own replication is not a user's business."""
    t = frame.type
    if t is FrameType.SEND:
        send = data_pb2.SendRequest.FromString(frame.header)
        acl.check(user, "pub", "topic", send.topic)
    elif t is FrameType.PULL:
        pull = data_pb2.PullRequest.FromString(frame.header)
        if pull.consumer_group:  # none: a read for no group, which commits nothing
            acl.check(user, "sub", "group", pull.consumer_group)
        acl.check(user, "sub", "topic", pull.topic)
    elif t is FrameType.COMMIT_OFFSET:
        commit = data_pb2.CommitOffsetRequest.FromString(frame.header)
        if commit.forwarded:
            raise PermissionDenied(
                "forwarded offset commits come only from a slave that proved the cluster "
                "secret, not from users",
                "permission",
            )
        acl.check(user, "sub", "group", commit.consumer_group)
    elif t is FrameType.QUERY_OFFSET:
        query = data_pb2.QueryOffsetRequest.FromString(frame.header)
        if query.consumer_group:
            acl.check(user, "sub", "group", query.consumer_group)
        elif not user.allows("pub", "topic", query.topic):
            acl.check(user, "sub", "topic", query.topic)
    elif t is FrameType.CONSUMER_HEARTBEAT:
        beat = data_pb2.ConsumerHeartbeatRequest.FromString(frame.header)
        acl.check(user, "sub", "group", beat.consumer_group)
    elif t is FrameType.LOCK_QUEUES:
        lock = data_pb2.LockQueuesRequest.FromString(frame.header)
        acl.check(user, "sub", "group", lock.consumer_group)
    elif t is FrameType.REPLICA_FETCH:
        raise PermissionDenied(
            "REPLICA_FETCH is for slaves that proved the cluster secret, not for users",
            "permission",
        )
    # HEARTBEAT: any authenticated user. END_TRANSACTION names a half message the
    # producer got back from its own SEND, already judged by pub on its topic.
