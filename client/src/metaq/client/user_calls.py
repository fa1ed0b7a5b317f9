"""Signs a client's gRPC calls to the nameservers with its user's key.

Each unary call carries ``x-metaq-user`` metadata (:func:`metaq.common.users.sign_request`
over ``"grpc METHOD"`` and the serialized request), which a nameserver with
``auth_enabled`` requires (``metaq.nameserver.user_auth``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import grpc
from google.protobuf.message import Message

from metaq.common.users import USER_METADATA_KEY, Credentials, sign_request

_Call: TypeAlias = "grpc.aio.UnaryUnaryCall[Any, Any]"


class UserSigningInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

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
            f"grpc {method.rpartition('/')[2]}",
            request.SerializeToString(deterministic=True),
            time.time(),
        )
        metadata = grpc.aio.Metadata(*(details.metadata or ()), (USER_METADATA_KEY, proof))
        signed = grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )
        return await continuation(signed, request)
