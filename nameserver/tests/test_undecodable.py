"""The decode interceptor keeps wrapped handlers for the server's methods only."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from metaq.nameserver.undecodable import RejectUndecodable

KNOWN = "/metaq.v1.NameServer/GetRoute"


class _Details(grpc.HandlerCallDetails):
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


def _server_methods() -> tuple[list[str], Any]:
    """A continuation that knows one unary method, and the names it was asked for."""
    asked: list[str] = []
    handler = grpc.unary_unary_rpc_method_handler(
        lambda request, context: request, lambda data: data, lambda data: data
    )

    async def continuation(details: grpc.HandlerCallDetails) -> Any:
        asked.append(str(details.method))
        return handler if details.method == KNOWN else None

    return asked, continuation


def test_unknown_method_names_are_not_remembered_and_known_ones_are_wrapped_once() -> None:
    interceptor = RejectUndecodable()
    asked, continuation = _server_methods()

    async def calls() -> tuple[list[Any], list[Any]]:
        unknown = [
            await interceptor.intercept_service(continuation, _Details(f"/x.Y/Random{n}"))
            for n in range(1000)
        ]
        known = [
            await interceptor.intercept_service(continuation, _Details(KNOWN)) for _ in range(3)
        ]
        return unknown, known

    unknown, known = asyncio.run(calls())

    assert all(handler is None for handler in unknown)
    assert interceptor.cached == 1
    assert known[0] is not None and all(handler is known[0] for handler in known)
    assert asked.count(KNOWN) == 1
