"""GetAssignment past the gRPC message limit: refused before sending, saying why."""

from __future__ import annotations

import asyncio

import pytest

import metaq.client.admin.cluster as cluster
from metaq.client.admin import Admin
from metaq.client.errors import AdminError


def test_a_request_past_the_message_limit_is_refused_naming_its_size_and_what_to_split(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The real limit is 32 MiB; a small one keeps the request small. Nothing listens at
    # the nameserver address: the refusal comes before any call.
    monkeypatch.setattr(cluster, "GRPC_MESSAGE_LIMIT", 1000)
    members = [(f"consumer-{n}", "default") for n in range(10)]
    previous = {
        c: [("broker-a", q) for q in range(10 * n, 10 * n + 10)] for n, (c, _) in enumerate(members)
    }

    async def ask() -> None:
        async with Admin(["127.0.0.1:9"], timeout_s=1) as admin:
            await admin.assignment("g", "t", "sticky", members, previous)

    with pytest.raises(AdminError) as refused:
        asyncio.run(ask())
    message = str(refused.value)
    assert "10 members, 100 held queues" in message
    assert "over the 1,000-byte gRPC message limit" in message
    assert "split" in message
