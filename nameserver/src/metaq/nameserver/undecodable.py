"""Requests whose bytes do not decode get INVALID_ARGUMENT, saying what and why.

Left to itself grpc.aio answers a request it cannot parse with UNKNOWN "Unexpected
<class 'DecodeError'>", which reads like a server bug and gives a client nothing to act on
(a Session stream whose heartbeat does not decode even ends with OK). This interceptor
wraps each method's deserializer so that a bad message becomes a marker instead of an
exception, and the wrapped handler answers the marker with INVALID_ARGUMENT naming the
method and the message type.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

import grpc
from google.protobuf.message import DecodeError

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
_Continuation: TypeAlias = "Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]]"

ADVICE = (
    "the client and the nameserver speak different metaq protocol versions (upgrade the "
    "older side), or the caller is not a metaq client"
)


@dataclass(frozen=True, slots=True)
class _Undecodable:
    """Stands in for a request message that could not be parsed."""

    details: str


def _tolerant(method: str, deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as exc:
            return _Undecodable(
                f"{method}: the request ({len(data)} bytes) is not a valid protobuf message "
                f"of the expected type ({exc}): {ADVICE}"
            )

    return deserialize


class RejectUndecodable(grpc.aio.ServerInterceptor):
    """Answers undecodable requests with INVALID_ARGUMENT on every method it wraps."""

    def __init__(self) -> None:
        # The methods are fixed once the server starts: wrap each once, not per call.
        # Only methods the server has are kept: a caller picks the names it sends, and
        # remembering every unknown one would let it grow this without bound.
        self._wrapped: dict[str, Handler] = {}

    @property
    def cached(self) -> int:
        """How many methods' wrapped handlers are kept."""
        return len(self._wrapped)

    async def intercept_service(
        self, continuation: _Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Handler | None:
        method = str(handler_call_details.method)
        wrapped = self._wrapped.get(method)
        if wrapped is None:
            wrapped = _wrap(method, await continuation(handler_call_details))
            if wrapped is None:
                return None  # no such method: grpc answers UNIMPLEMENTED
            self._wrapped[method] = wrapped
        return wrapped


def _wrap(method: str, handler: Handler | None) -> Handler | None:
    if handler is None or handler.request_deserializer is None:
        return handler
    deserializer = _tolerant(method, handler.request_deserializer)
    serializer = handler.response_serializer
    # grpc's stubs type the behaviours as the sync API's; grpc.aio passes coroutines.
    behavior: Any
    if handler.unary_unary is not None:
        behavior = handler.unary_unary
        return grpc.unary_unary_rpc_method_handler(_unary(behavior), deserializer, serializer)
    if handler.stream_stream is not None:
        behavior = handler.stream_stream
        return grpc.stream_stream_rpc_method_handler(_streaming(behavior), deserializer, serializer)
    # No unary-stream or stream-unary methods exist; should one be added, it keeps
    # grpc's own handling until it is wrapped here too.
    return handler


def _unary(behavior: Callable[[Any, Context], Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def wrapped(request: Any, context: Context) -> Any:
        if isinstance(request, _Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.details)
        return await behavior(request, context)

    return wrapped


def _streaming(
    behavior: Callable[[AsyncIterator[Any], Context], Awaitable[None]],
) -> Callable[[AsyncIterator[Any], Context], Awaitable[None]]:
    """A stream handler in grpc.aio's reader/writer form (it reads ``context.read()``)."""

    async def wrapped(requests: AsyncIterator[Any], context: Context) -> None:
        await behavior(requests, cast("Context", _CheckedReads(context)))

    return wrapped


class _CheckedReads:
    """A servicer context whose ``read`` ends the call with INVALID_ARGUMENT at a
    message that did not decode; everything else is the context's own."""

    def __init__(self, context: Context) -> None:
        self._context = context

    async def read(self) -> Any:
        request = await self._context.read()
        if isinstance(request, _Undecodable):
            await self._context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.details)
        return request

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)
