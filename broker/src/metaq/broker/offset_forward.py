"""A slave passes the offsets consumers committed there on to its master.

RocketMQ 5's slave acting as master forwards such commits; here the slave holds them on
its disk (:mod:`metaq.broker.held_offsets`) and forwards them, as a COMMIT_OFFSET marked
``forwarded``, to whichever broker it follows now: the old master when it comes back, a
new one after a failover. A slave that is promoted journals them itself instead. The
master's answer carries its resulting offsets, which replace the held ones.

The connection is the replication follower's kind (:meth:`GroupRole.connect`): with a
cluster secret both sides prove it first, so a stranger at the master's address gets no
held commit and none of its answers is adopted, and the master takes forwarded commits
from proven slaves only.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Final

from metaq.broker.held_offsets import Held, OffsetKey
from metaq.broker.offsets import ConsumerOffsets
from metaq.broker.role import GroupRole
from metaq.common.errors import ErrorCode, MetaqError
from metaq.common.framing import FrameType
from metaq.common.service import PeriodicService
from metaq.common.v1.data_pb2 import CommitOffsetRequest, CommitOffsetResponse, QueueOffset
from metaq.replication.channel import DataPlaneChannel, FetchError

log = logging.getLogger(__name__)

_PER_REQUEST: Final = 1024
"""Queues per forwarded request, so a large backlog goes as frames of ordinary size."""
_TIMEOUT_S: Final = 5.0


class OffsetForwarder(PeriodicService):
    """Every ``interval_s`` (and when woken by a held commit), on a slave that knows its
    master: persist the held commits, then forward them."""

    name = "offset-forward"

    def __init__(
        self,
        offsets: ConsumerOffsets,
        role: GroupRole,
        interval_s: float,
    ) -> None:
        super().__init__(interval_s)
        self.offsets = offsets
        self.role = role
        self._channel: DataPlaneChannel | None = None
        self._failing = False

    async def run_once(self) -> None:
        held = self.offsets.held
        await held.persist()
        address = self.role.master_address
        if not len(held) or not self.role.holds_commits or not address:
            return
        try:
            await self._forward(address)
        except (OSError, ConnectionError, TimeoutError, MetaqError) as exc:
            await self._close()
            if not self._failing:  # once per outage, not every interval
                log.warning(
                    "forwarding %d held offset commits to master %s failed (%s); retrying",
                    len(held),
                    address,
                    exc,
                )
            self._failing = True
            return
        if self._failing:
            log.info("forwarding held offset commits to master %s works again", address)
        self._failing = False
        await held.persist()

    async def _forward(self, address: str) -> None:
        channel = self._channel
        if channel is not None and (channel.address != address or channel.closed):
            # Another master, or the master closed the kept connection (its
            # idle_timeout_s between forwards): not a failure, just connect again.
            await self._close()
        kept = self._channel is not None
        try:
            await self._forward_all(address)
        except ConnectionError:
            if not kept:
                raise
            # The idle close crossed our request on the wire: once more, on a new one.
            await self._close()
            await self._forward_all(address)

    async def _forward_all(self, address: str) -> None:
        if self._channel is None:
            # The master proves the cluster secret before it sees a held commit or we
            # adopt its answer, and we prove it so that it takes them as forwarded.
            self._channel = await self.role.connect(address)
        by_group: dict[str, list[tuple[OffsetKey, Held]]] = defaultdict(list)
        for key, held in self.offsets.held.items():
            by_group[key[0]].append((key, held))
        for group, entries in by_group.items():
            for start in range(0, len(entries), _PER_REQUEST):
                await self._forward_group(
                    self._channel, group, entries[start : start + _PER_REQUEST]
                )

    async def _forward_group(
        self, channel: DataPlaneChannel, group: str, entries: list[tuple[OffsetKey, Held]]
    ) -> None:
        request = CommitOffsetRequest(consumer_group=group, forwarded=True)
        for (_, topic, queue_id), held in entries:
            entry = request.offsets.add(topic=topic, queue_id=queue_id, offset=held.offset)
            if held.expected is not None:
                entry.expected_offset = held.expected
        sent = [(key, held.offset) for key, held in entries]
        try:
            frame = await channel.request(
                FrameType.COMMIT_OFFSET, request.SerializeToString(), _TIMEOUT_S
            )
        except FetchError as exc:
            if exc.code in (ErrorCode.UNKNOWN_TOPIC, ErrorCode.INVALID_MESSAGE):
                # The master will never take these (a topic deleted there, say): keeping
                # them would retry for ever and block the group's other commits.
                log.error("master refused offsets held for group %r, dropped: %s", group, exc)
                self.offsets.forwarded(sent, {})
                return
            raise
        answer = CommitOffsetResponse.FromString(frame.header)
        self.offsets.forwarded(sent, {_key(group, o): o.offset for o in answer.offsets})

    async def _close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

    async def on_stop(self) -> None:
        await self._close()
        # The one shutdown write of the held commits (after any still running).
        await self.offsets.held.persist()


def _key(group: str, entry: QueueOffset) -> OffsetKey:
    return (group, entry.topic, entry.queue_id)
