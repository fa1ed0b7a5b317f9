"""A replica checks its log after each start and repairs damaged records from its master.

A start after a clean shutdown trusts the files, and recovery after a crash checks only
what came after the checkpoint, so a byte that rotted on disk while the broker was down
goes unnoticed. A controlled broker (one the failover controller may elect) therefore
checks every record it holds against its CRC in the background after starting, in
chunks off the event loop. Until that is done, and while a damaged record waits for the
master's copy, the broker is *unverified*: its heartbeats say so and the controller does
not elect it to replace a master, and its consumers read only what has been checked.

A damaged record (sound header, bad content) is kept aside by the store and never
served; it is repaired by fetching the master's bytes at the same offset (the logs of a
group are byte-identical) with a REPLICA_FETCH marked ``repair``. A header that makes
no sense stops the check: the broker stays unverified and the operator decides.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Final

from metaq.broker.store import MessageStore
from metaq.common.auth import ClusterSecret
from metaq.common.errors import CorruptLog, MetaqError
from metaq.common.service import cancel_and_wait
from metaq.common.v1.data_pb2 import EpochEntry, ReplicaFetchRequest
from metaq.replication.channel import DataPlaneChannel, SlaveIdentity
from metaq.replication.epochs import EpochHistory

log = logging.getLogger(__name__)

_CHUNK_BYTES: Final = 64 * 1024 * 1024
_REPAIR_RETRY_S: Final = 1.0


class LogCheck:
    def __init__(
        self,
        store: MessageStore,
        history: EpochHistory,
        *,
        broker_name: str,
        broker_id: int,
        data_address: str,
        master: Callable[[], tuple[str, int]],
        on_progress: Callable[[], None],
        on_verified: Callable[[], None],
        secret: ClusterSecret | None = None,
        dial_tls: ssl.SSLContext | None = None,
    ) -> None:
        self._store = store
        self._dial_tls = dial_tls
        self._identity = SlaveIdentity(broker_name, broker_id, data_address, secret)
        self._history = history
        self._broker_name = broker_name
        self._broker_id = broker_id
        self._master = master
        """The master's data address ("" if none or this broker) and the epoch."""
        self._on_progress = on_progress
        self._on_verified = on_verified
        self.checked_to = store.commitlog.min_offset
        self.done = False
        self.problem = ""
        self._task: asyncio.Task[None] | None = None

    @property
    def verified(self) -> bool:
        return self.done and not self._store.commitlog.damaged

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        commitlog = self._store.commitlog
        target = commitlog.write_offset
        try:
            await self._check(target)
        except CorruptLog as exc:
            self.problem = str(exc)
            log.error("log check stopped, the broker stays unelectable: %s", exc)
            return
        self.done = True
        self._on_progress()
        log.info("log check: records up to %d checked, %d damaged", target, len(commitlog.damaged))
        while commitlog.damaged:
            await self._repair_all()
            if commitlog.damaged:
                await asyncio.sleep(_REPAIR_RETRY_S)
        self._on_verified()

    async def _check(self, target: int) -> None:
        commitlog = self._store.commitlog
        offset = commitlog.min_offset
        while offset < min(target, commitlog.write_offset):
            offset = max(offset, commitlog.min_offset)  # retention may have moved on
            stop = min(target, offset + _CHUNK_BYTES)
            reached = await asyncio.to_thread(commitlog.check, offset, stop)
            if reached <= offset:
                break  # the log was cut below here: nothing left to check
            offset = self.checked_to = reached
            self._on_progress()

    async def _repair_all(self) -> None:
        address, epoch = self._master()
        if not address:
            return
        try:
            channel = await DataPlaneChannel.open(
                address, identity=self._identity, ssl=self._dial_tls
            )
        except (OSError, TimeoutError, MetaqError) as exc:
            log.warning("repair: cannot reach master %s: %s", address, exc)
            return
        try:
            for offset, size in sorted(self._store.commitlog.damaged.items()):
                request = ReplicaFetchRequest(
                    broker_name=self._broker_name,
                    broker_id=self._broker_id,
                    epoch=epoch,
                    offset=offset,
                    max_bytes=size,
                    segment_bytes=self._store.config.commitlog_segment_bytes,
                    epochs=[
                        EpochEntry(epoch=e.epoch, start_offset=e.start_offset)
                        for e in self._history.entries
                    ],
                    repair=True,
                )
                _, payload = await channel.fetch(request)
                if len(payload) < size:
                    log.warning("repair: master %s has no copy of offset %d yet", address, offset)
                    continue
                await asyncio.to_thread(self._store.commitlog.repair, offset, payload)
        except (MetaqError, OSError, TimeoutError) as exc:
            log.warning("repair from master %s failed: %s; trying again", address, exc)
        finally:
            await channel.close()
