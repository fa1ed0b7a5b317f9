"""Test support: a broker stand-in that speaks the real ``Session`` stream to nameservers.

A :class:`FakeBroker` holds one Session open to each nameserver it is given, heartbeats on
each every ``interval_s`` (until :meth:`FakeBroker.pause`), and records every event each
nameserver sends, answers and unasked pushes alike, with the time it arrived. With
``follow=True`` it acts on the controller's decisions as a controlled broker must: it
reports MASTER at the committed epoch when a GroupControl names it, SLAVE otherwise::

    broker = FakeBroker([ns.grpc_address], "broker-a", 0, configured_master=True)
    await broker.start()
    control = await broker.wait_for_control(lambda c: c.master_id == 0, 5.0, "bootstrap")
    await broker.close()  # the sessions end: each nameserver takes the broker out at once

It is not a broker: it serves no data and reports whatever offset and in-sync set the
test sets on it. It proves the tests' cluster secret (``secret``; None proves nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from metaq.common.auth import ClusterSecret, session_identity, session_metadata
from metaq.common.server_names import target_of
from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1 import control_pb2_grpc
from metaq.testing.waiting import cluster_secret_for_tests, wait_until_async


@dataclass(frozen=True, slots=True)
class Received:
    """One event from one nameserver, and when it arrived (``time.monotonic``)."""

    nameserver: str
    at: float
    event: pb.SessionEvent


@dataclass(eq=False)
class _Link:
    address: str
    channel: grpc.aio.Channel
    call: grpc.aio.StreamStreamCall[pb.BrokerHeartbeat, pb.SessionEvent]
    reader: asyncio.Task[None] | None = None
    alive: bool = True
    sent_table: bool = False


@dataclass(eq=False)
class FakeBroker:
    nameservers: Sequence[str]
    broker_name: str
    broker_id: int
    configured_master: bool = False
    cluster: str = "c1"
    controlled: bool = True
    follow: bool = True
    interval_s: float = 0.2
    topics: tuple[str, ...] = ("orders",)
    role: int = pb.BROKER_ROLE_SLAVE
    epoch: int = 0
    commitlog_max_offset: int = 0
    # Reported while it is master (the controller reads it only from its master).
    in_sync_ids: tuple[int, ...] = ()
    unverified: bool = False
    secret: ClusterSecret | None = field(default_factory=cluster_secret_for_tests)
    received: list[Received] = field(default_factory=list)
    heartbeats_sent: int = 0
    _links: list[_Link] = field(default_factory=list)
    _beat: asyncio.Task[None] | None = None
    _paused: bool = False

    @property
    def key(self) -> str:
        return f"{self.broker_name}/{self.broker_id}"

    @property
    def data_address(self) -> str:
        return f"127.0.0.1:{20000 + self.broker_id}"

    def state(self) -> pb.BrokerState:
        return pb.BrokerState(
            cluster=self.cluster,
            broker_name=self.broker_name,
            broker_id=self.broker_id,
            role=self.role,  # type: ignore[arg-type]
            data_address=self.data_address,
            epoch=self.epoch,
            permission=pb.PERMISSION_READ_WRITE,
            commitlog_max_offset=self.commitlog_max_offset,
            controlled=self.controlled,
            configured_master=self.configured_master,
            in_sync_ids=self.in_sync_ids if self.role == pb.BROKER_ROLE_MASTER else (),
            unverified=self.unverified,
        )

    async def start(self) -> None:
        """Open a session with every nameserver, send the first heartbeats, keep beating."""
        for address in self.nameservers:
            channel = grpc.aio.insecure_channel(address)
            identity = session_identity(
                self.cluster, self.broker_name, self.broker_id, self.data_address
            )
            metadata = session_metadata(self.secret, target_of(address), identity, time.time())
            call = control_pb2_grpc.NameServerStub(channel).Session(metadata=metadata)
            link = _Link(address, channel, call)
            link.reader = asyncio.get_running_loop().create_task(self._read(link))
            self._links.append(link)
        await self.heartbeat()
        self._beat = asyncio.get_running_loop().create_task(self._beat_forever())

    async def heartbeat(self) -> None:
        """Send one heartbeat now on every session still up."""
        self.heartbeats_sent += 1
        for link in self._links:
            if not link.alive:
                continue
            message = pb.BrokerHeartbeat(broker=self.state(), sequence=self.heartbeats_sent)
            if not link.sent_table:
                message.topic_table.topics.extend(
                    pb.TopicConfig(
                        topic=topic,
                        read_queues=4,
                        write_queues=4,
                        permission=pb.PERMISSION_READ_WRITE,
                    )
                    for topic in self.topics
                )
                message.topic_table.SetInParent()
            try:
                await link.call.write(message)
                link.sent_table = True
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
                link.alive = False  # that nameserver is gone; the others go on

    def pause(self) -> None:
        """Stop the periodic heartbeats (sessions stay open: events still arrive)."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    async def close(self) -> None:
        """End every session (as a killed broker's connections would) and stop."""
        tasks = [t for t in (self._beat, *(link.reader for link in self._links)) if t]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for link in self._links:
            link.call.cancel()
            # Wait for the call's end, so none of its events reaches a closed loop later.
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
                await link.call.code()
            await link.channel.close()
        self._links = []
        self._beat = None

    # --- what arrived -----------------------------------------------------------------

    def controls(self) -> list[pb.GroupControl]:
        return [r.event.registered.control for r in self.received if _has_control(r.event)]

    def latest_control(self) -> pb.GroupControl | None:
        controls = self.controls()
        return controls[-1] if controls else None

    async def wait_for_control(
        self, predicate: Callable[[pb.GroupControl], bool], timeout_s: float, message: str
    ) -> Received:
        """The first received event whose GroupControl satisfies ``predicate``."""

        def found() -> Received | None:
            for received in self.received:
                if _has_control(received.event) and predicate(received.event.registered.control):
                    return received
            return None

        async def arrived() -> bool:
            return found() is not None

        await wait_until_async(arrived, timeout_s, f"{self.key}: {message}")
        result = found()
        assert result is not None
        return result

    # --- background work ----------------------------------------------------------------

    async def _read(self, link: _Link) -> None:
        try:
            while True:
                event = await link.call.read()
                if not isinstance(event, pb.SessionEvent):  # grpc.aio.EOF
                    break
                self.received.append(Received(link.address, time.monotonic(), event))
                if self.follow and _has_control(event):
                    self._act_on(event.registered.control)
        except grpc.aio.AioRpcError:
            pass
        link.alive = False

    def _act_on(self, control: pb.GroupControl) -> None:
        if control.epoch < self.epoch:
            return  # older news from a slower nameserver
        self.epoch = control.epoch
        mine = control.master_id == self.broker_id
        self.role = pb.BROKER_ROLE_MASTER if mine else pb.BROKER_ROLE_SLAVE

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if not self._paused:
                await self.heartbeat()


def _has_control(event: pb.SessionEvent) -> bool:
    return event.registered.HasField("control")
