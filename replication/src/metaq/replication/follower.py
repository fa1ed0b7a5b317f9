"""The slave's side of replication: copy the master's log verbatim, from where ours ends.

A :class:`Follower` keeps one fetch in flight. Each answer is checked before it is
written: a master in an epoch below the one this slave knows is stale and refused; when
the epoch histories say our log parted from the master's (we hold an old master's
unacknowledged tail), the log is cut back first. Then the bytes are written as they are,
so master and slave logs are byte-identical, and the next fetch reports how far we hold
them once the log says they are held (durable, under SYNC flush).

The transport is a :class:`FetchChannel`: the data plane for real, a direct call into a
:class:`~metaq.replication.master.ReplicaSet` in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from metaq.common.errors import EpochMismatch, MetaqError
from metaq.common.framing import Buffer
from metaq.common.service import cancel_and_wait
from metaq.common.v1.data_pb2 import EpochEntry, ReplicaFetchRequest, ReplicaFetchResponse
from metaq.replication.epochs import Epoch, EpochHistory, divergence
from metaq.replication.log import ReplicaLog

log = logging.getLogger(__name__)


class FetchChannel(Protocol):
    def fetch(self, request: ReplicaFetchRequest) -> Awaitable[tuple[ReplicaFetchResponse, Buffer]]:
        """The answer to ``request``; a channel sends it as soon as called. The payload
        may be a view of the channel's buffer, valid until the next request."""
        ...

    async def close(self) -> None: ...


Connect = Callable[[str], Awaitable[FetchChannel]]


class Follower:
    """Follows the master at ``master_address`` until stopped or pointed elsewhere."""

    def __init__(
        self,
        replica_log: ReplicaLog,
        history: EpochHistory,
        connect: Connect,
        *,
        broker_name: str,
        broker_id: int,
        epoch: int,
        max_bytes: int = 4 << 20,
        wait_ms: int = 1000,
        retry_s: float = 0.1,
        max_retry_s: float = 2.0,
        on_confirmed: Callable[[], None] = lambda: None,
    ) -> None:
        self.log = replica_log
        self.history = history
        self._connect = connect
        self.broker_name = broker_name
        self.broker_id = broker_id
        self.epoch = epoch
        """The group's epoch as this slave knows it; masters below it are refused."""
        self.max_bytes = max_bytes
        self.wait_ms = wait_ms
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.master_address = ""
        self.master_end = 0
        self.connected = False
        self.agreed_epoch = 0
        """The newest epoch whose master has confirmed this log agrees with its own (after
        any cut); until the current epoch's has, a tail here may be one it never had."""
        self.confirmed = 0
        """The highest confirmed offset a master this log agrees with has announced: every
        replica that could be elected held the log that far, so no failover cuts it.
        Consumers read no further here, also while the group has no master (records past
        it may be cut when another slave is elected)."""
        self._on_confirmed = on_confirmed
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._session_task: asyncio.Task[None] | None = None

    @property
    def lag_bytes(self) -> int:
        return max(0, self.master_end - self.log.end_offset)

    def follow(self, master_address: str, epoch: int) -> None:
        """Follow ``master_address`` in ``epoch`` (reconnecting if either changed)."""
        if epoch < self.epoch:
            return
        if master_address != self.master_address or epoch != self.epoch:
            self.master_address = master_address
            self.epoch = epoch
            self._changed.set()
            if self._session_task is not None:
                # Pointed elsewhere (or promoted): not one more byte from this master,
                # even an answer already received and not yet applied.
                self._session_task.cancel()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="follower")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        self.connected = False

    async def _run(self) -> None:
        # Back off while the master stays unreachable (it may be dead and the controller
        # deciding, or gone for good with no one to promote), without missing a new one.
        delay = self.retry_s
        while True:
            self._changed.clear()
            address = self.master_address
            if not address:
                await self._changed.wait()
                continue
            session = asyncio.get_running_loop().create_task(self._session(address))
            self._session_task = session
            try:
                await session
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # stopped
                # follow() ended the session: go on with the new master at once
            except (OSError, MetaqError, TimeoutError, ConnectionError) as exc:
                level = logging.WARNING if delay == self.retry_s else logging.DEBUG
                log.log(level, "replication from %s: %s; retrying", address, exc)
            except Exception:
                log.exception("replication from %s failed", address)
            finally:
                self._session_task = None
            delay = self.retry_s if self.connected else min(delay * 2, self.max_retry_s)
            self.connected = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._changed.wait()

    async def _session(self, address: str) -> None:
        # Runs as a task of its own, which follow() cancels when the master changes: a
        # fetch per message is the sync-replicated send's path, and a watcher task or
        # an asyncio.wait per fetch would cost it loop turns.
        channel = await self._connect(address)
        try:
            while not self._changed.is_set():
                request = self.request()
                response, payload = await channel.fetch(request)
                if not self.connected:
                    self.connected = True
                    log.info("replicating from %s (epoch %d) at offset %d",
                             address, response.epoch, request.offset)  # fmt: skip
                self.apply(response, payload)
                await self.log.hold(self.log.end_offset)
        finally:
            await channel.close()

    def request(self) -> ReplicaFetchRequest:
        return ReplicaFetchRequest(
            broker_name=self.broker_name,
            broker_id=self.broker_id,
            epoch=self.epoch,
            offset=self.log.end_offset,
            acked_offset=self.log.held_offset,
            max_bytes=self.max_bytes,
            wait_ms=self.wait_ms,
            segment_bytes=self.log.segment_bytes,
            epochs=[EpochEntry(epoch=e.epoch, start_offset=e.start_offset)
                    for e in self.history.entries],
        )  # fmt: skip

    def learn_confirmed(self, offset: int) -> None:
        """Take ``offset`` as confirmed (a master's word, or this broker's own as master
        when demoted); it only moves forward."""
        if offset > self.confirmed:
            self.confirmed = offset
            self._on_confirmed()

    def apply(self, response: ReplicaFetchResponse, payload: Buffer) -> None:
        """Check one answer and write its bytes; the state machine of a slave."""
        if response.epoch < self.epoch:
            raise EpochMismatch(
                f"{self.master_address} answers as master of epoch {response.epoch}, but "
                f"the group is at epoch {self.epoch}: it was replaced; not taking its data"
            )
        self.epoch = response.epoch
        self.master_end = response.master_end
        master = [Epoch(e.epoch, e.start_offset) for e in response.epochs]
        end = self.log.end_offset
        cut = divergence(self.history.entries, end, master, response.master_end)
        if cut < end:
            log.warning(
                "log diverged from the master's at offset %d (epochs here %s, master %s): "
                "cutting %d bytes no acknowledged write needs",
                cut,
                self.history.entries,
                master,
                end - cut,
            )
            self.log.truncate(cut)
            self.history.truncate(cut)
            self.confirmed = min(self.confirmed, cut)
            return
        self.agreed_epoch = response.epoch
        self.learn_confirmed(response.confirmed_offset)
        if end < response.min_offset:
            if end == self.log.min_offset:  # empty: start where the master's data starts
                self.log.reset(response.min_offset)
                # The epochs that wrote the skipped data are ours too, as far as it went.
                self.history.adopt(master, response.min_offset + 1)
                return
            raise MetaqError(
                f"this slave's log ends at {end}, below the master's oldest data "
                f"({response.min_offset}): it fell behind retention; stop it, delete its "
                "data directory and start it again to copy the master from scratch"
            )
        if response.offset != end:
            return  # an answer to a fetch from before a cut
        if payload:
            self.log.write(end, payload)
            self.history.adopt(master, self.log.end_offset)
