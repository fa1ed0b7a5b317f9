"""Awaiting SYNC durability from an event loop: released by flushes, timed out by a sweep."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from metaq.broker.store import FlushMode, MessageStore
from metaq.broker.store.flush import AsyncDurability
from metaq.common.record import encode
from metaq.testing.waiting import deadline

OpenStore = Callable[..., MessageStore]


def test_waiters_are_released_once_the_flusher_makes_their_offsets_durable(
    open_store: OpenStore,
) -> None:
    store = open_store(flush_mode=FlushMode.SYNC)

    async def scenario() -> list[bool]:
        durability = AsyncDurability(asyncio.get_running_loop(), store.flusher)
        try:
            ends = [store.append([encode("T", b"%d" % n)]).end for n in range(20)]
            return await asyncio.gather(*(durability.wait(end, 5.0) for end in ends))
        finally:
            durability.close()

    assert asyncio.run(scenario()) == [True] * 20
    assert store.flusher.durable == store.commitlog.write_offset


def test_a_waiter_whose_offset_never_becomes_durable_times_out_false(
    open_store: OpenStore,
) -> None:
    store = open_store(flush_mode=FlushMode.SYNC)
    store.flusher.stop()  # nothing will fsync what follows

    async def scenario() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        durability = AsyncDurability(loop, store.flusher)
        end = store.commitlog.append([encode("T", b"never synced")]).end
        began = loop.time()
        try:
            return await durability.wait(end, 0.2), loop.time() - began
        finally:
            durability.close()

    durable, waited = asyncio.run(scenario())
    assert durable is False
    assert 0.2 <= waited < deadline(2.0)


def test_closing_releases_every_waiter_with_false(open_store: OpenStore) -> None:
    store = open_store(flush_mode=FlushMode.SYNC)
    store.flusher.stop()

    async def scenario() -> bool:
        loop = asyncio.get_running_loop()
        durability = AsyncDurability(loop, store.flusher)
        end = store.commitlog.append([encode("T", b"pending")]).end
        waiter = asyncio.ensure_future(durability.wait(end, 60.0))
        # Callbacks run in order: the waiter registers before close runs.
        loop.call_soon(durability.close)
        return await waiter

    assert asyncio.run(scenario()) is False
