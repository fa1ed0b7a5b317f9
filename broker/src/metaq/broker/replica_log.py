"""The message store as replication's log (``metaq.replication.log.ReplicaLog``)."""

from __future__ import annotations

import asyncio

from metaq.broker.store import FlushMode, MessageStore
from metaq.broker.store.flush import AsyncDurability
from metaq.common.framing import Buffer


class StoreLog:
    def __init__(self, store: MessageStore, durability: AsyncDurability) -> None:
        self._store = store
        self._durability = durability
        self._sync = store.config.flush_mode is FlushMode.SYNC
        self._flush_timeout_s = store.config.flush_timeout_ms / 1e3
        self._dispatch_scheduled = False

    @property
    def segment_bytes(self) -> int:
        return self._store.config.commitlog_segment_bytes

    @property
    def min_offset(self) -> int:
        return self._store.commitlog.min_offset

    @property
    def end_offset(self) -> int:
        return self._store.commitlog.write_offset

    def read(self, offset: int, max_bytes: int) -> Buffer:
        return self._store.commitlog.read_chunk(offset, max_bytes)

    def write(self, offset: int, data: Buffer) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._store.append_replicated(offset, data)
            return
        self._store.append_replicated(offset, data, wake_dispatcher=False)
        # Indexing the bytes waits for the loop's next turn: by then the fetch that
        # acknowledges them has gone out (the follower sends it before it yields), so a
        # sync-replicated send waits neither for the dispatch nor for waking its thread.
        if not self._dispatch_scheduled:
            self._dispatch_scheduled = True
            loop.call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_scheduled = False
        self._store.dispatch_appended()

    def truncate(self, offset: int) -> None:
        self._store.truncate(offset)

    def reset(self, offset: int) -> None:
        self._store.reset(offset)

    @property
    def held_offset(self) -> int:
        if self._sync:
            return self._store.flusher.durable
        return self._store.commitlog.write_offset

    async def hold(self, offset: int) -> None:
        if self._sync:
            await self._durability.wait(offset, self._flush_timeout_s)
