"""Users on the nameserver's gRPC calls: who may ask for routes, the cluster, assignments.

With ``auth_enabled`` a client's call must carry a user's proof (``x-metaq-user``
metadata, :func:`metaq.common.users.sign_request` over the method and the serialized
request) within the clock window, or a cluster-secret proof (``x-metaq-auth``: brokers
and admin tools of the cluster). A call without either ends UNAUTHENTICATED, one whose
user lacks a grant PERMISSION_DENIED, each saying what to configure; refusals are
logged with the user and the reason, never a key or proof.

Either proof covers the nameserver the call is for (``x-metaq-target``, host:port as
the caller dialled it: :mod:`metaq.common.server_names`), which must be this one, so a
call captured on its way to one nameserver is refused by the others. At this one it can
be replayed within the window, as the cluster secret's can: these calls only read
(routes, assignments), and TLS is what keeps a wiretap out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter

from metaq.common.acl import DENIAL_REASONS, PermissionDenied, User
from metaq.common.acl_source import AclSource
from metaq.common.auth import METADATA_KEY, AuthFailed, ClusterSecret, verify_call
from metaq.common.server_names import TARGET_METADATA_KEY, ServerNames, signed_purpose
from metaq.common.users import USER_METADATA_KEY, ProofError, parse_proof, verify_request

log = logging.getLogger(__name__)

Check = Callable[[User], None]
"""Raises PermissionDenied unless the user may make the call."""


def _metadata(context: Any, key: str) -> str | None:
    for k, v in context.invocation_metadata() or ():
        if k == key and isinstance(v, str):
            return v
    return None


class UserCalls:
    """The check each client call of the NameServer service makes first, and the check of
    a cluster member's proof (:meth:`member_signed_at`), both for this nameserver's gRPC
    ``names`` only."""

    def __init__(
        self, source: AclSource | None, secret: ClusterSecret | None, names: ServerNames
    ) -> None:
        self._source = source
        self._secret = secret
        self.names = names
        self.denied: dict[str, int] = {}
        """Refusals by reason, also in ``metaq_auth_denied_total`` once exported."""
        self._counter: Counter | None = None

    def export_to(self, registry: CollectorRegistry) -> None:
        """Count refusals in ``metaq_auth_denied_total{reason}`` of ``registry`` too."""
        self._counter = Counter(
            "metaq_auth_denied",
            "Requests refused by authentication or authorization, by reason",
            ["reason"],
            registry=registry,
        )
        for reason in DENIAL_REASONS:
            self._counter.labels(reason)
        for reason, count in self.denied.items():
            self._counter.labels(reason).inc(count)

    @property
    def enabled(self) -> bool:
        return self._source is not None

    def member_signed_at(self, context: Any, method: str, body: bytes) -> float:
        """When a cluster member signed this call of ``method`` over ``body`` for this
        nameserver (seconds, its clock); AuthFailed saying why not. Needs a secret."""
        assert self._secret is not None
        proof = _metadata(context, METADATA_KEY)
        target = ""
        if proof:  # else verify_call says that the proof is missing
            try:
                target = self.names.check(
                    _metadata(context, TARGET_METADATA_KEY), TARGET_METADATA_KEY
                )
            except ProofError as exc:
                raise AuthFailed(f"{method}: {exc}") from None
        return verify_call(self._secret, method, target, body, proof, time.time())

    async def check(self, context: Any, method: str, body: bytes, need: Check) -> None:
        """Return when the call may go on; else end it with the status saying why."""
        source = self._source
        if source is None:
            return
        cluster_proof = _metadata(context, METADATA_KEY)
        if cluster_proof and self._secret is not None:
            try:
                self.member_signed_at(context, method, body)
                return
            except AuthFailed as exc:
                await self._refuse(context, method, "", str(exc), "bad_proof", True)
        try:
            access_key, stamp, proof = parse_proof(_metadata(context, USER_METADATA_KEY))
            target = self.names.check(_metadata(context, TARGET_METADATA_KEY), TARGET_METADATA_KEY)
            user = source.acl.user(access_key)
            verify_request(
                user.verifier if user else None, access_key, stamp, proof,
                signed_purpose("grpc", method, target), body, time.time(),
            )  # fmt: skip
        except ProofError as exc:
            await self._refuse(context, method, "", str(exc), exc.reason, True)
            return
        assert user is not None
        try:
            need(user)
        except PermissionDenied as exc:
            await self._refuse(context, method, access_key, str(exc), exc.reason, False)

    def count(self, reason: str) -> None:
        self.denied[reason] = self.denied.get(reason, 0) + 1
        if self._counter is not None:
            self._counter.labels(reason).inc()

    async def _refuse(
        self, context: Any, method: str, who: str, why: str, reason: str, unauthenticated: bool
    ) -> None:
        self.count(reason)
        log.warning("refused %s from %s %s: %s", method, context.peer(), who, why)
        status = (
            grpc.StatusCode.UNAUTHENTICATED
            if unauthenticated
            else grpc.StatusCode.PERMISSION_DENIED
        )
        await context.abort(status, why)
