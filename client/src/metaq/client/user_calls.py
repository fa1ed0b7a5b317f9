"""Signs a client's gRPC calls to the nameservers with its user's key.

Each unary call carries ``x-metaq-user`` metadata (:func:`metaq.common.users.sign_request`
over :func:`metaq.common.server_names.signed_purpose` of the method and the nameserver the
channel dials, named in ``x-metaq-target``, and the serialized request), which a
nameserver with ``auth_enabled`` requires (``metaq.nameserver.user_auth``); another
nameserver refuses it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import grpc
from google.protobuf.message import Message

from metaq.common.server_names import TARGET_METADATA_KEY, signed_purpose, target_of
from metaq.common.users import USER_METADATA_KEY, Credentials, sign_request

_Call: TypeAlias = "grpc.aio.UnaryUnaryCall[Any, Any]"


class UserSigningInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, credentials: Credentials, address: str) -> None:
        """Signs the calls of a channel to the nameserver at ``address`` (host:port)."""
        self._credentials = credentials
        self._target = target_of(address)

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[_Call]],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        details = client_call_details
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        assert isinstance(request, Message)
        proof = sign_request(
            self._credentials,
            signed_purpose("grpc", method.rpartition("/")[2], self._target),
            request.SerializeToString(deterministic=True),
            time.time(),
        )
        given = tuple(details.metadata or ())
        named = any(key == TARGET_METADATA_KEY for key, _ in given)  # a cluster proof's
        target = () if named else ((TARGET_METADATA_KEY, self._target),)
        metadata = grpc.aio.Metadata(*given, *target, (USER_METADATA_KEY, proof))
        signed = grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )
        return await continuation(signed, request)
