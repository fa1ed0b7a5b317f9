"""Replication proves the cluster secret both ways (real brokers and nameservers).

Found by an attack run: anyone on a master's data port could REPLICA_FETCH as a slave,
get the whole log, join the in-sync set and hold every consumer's reads back with an
acked offset of 0; and replicas cut their logs to whatever a master said, so a forged
master wiped acknowledged messages on both of them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest

from metaq.client.admin import Admin, TopicSettings
from metaq.common.errors import ErrorCode, NotAuthenticated
from metaq.common.framing import FrameDecoder, FrameType
from metaq.common.record import encode, iter_records
from metaq.common.v1.data_pb2 import (
    EpochEntry,
    PullResponse,
    ReplicaAuthRequest,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    SendResponse,
)
from metaq.replication.channel import DataPlaneChannel, SlaveIdentity
from metaq.testing import BrokerError, BrokerProcess, DataClient
from metaq.testing.cluster import Cluster, ClusterBuilder
from metaq.testing.impostor import Impostor
from metaq.testing.replica_group import GROUP, TOPIC, health, read_records, start_group
from metaq.testing.waiting import (
    cluster_secret_for_tests,
    holds_for,
    run_async,
    wait_until,
    wait_until_async,
)

pytestmark = pytest.mark.slow

SEGMENT_BYTES = 4194304  # BrokerProcess's small store
# Longer than an unauthenticated fetcher took to be counted in sync before (0.5 s).
WATCH_S = 2.0


def _fetch(epoch: int, offset: int = 0) -> ReplicaFetchRequest:
    """What a stranger claiming to be slave 7 sends: it holds nothing (acked offset 0)."""
    return ReplicaFetchRequest(
        broker_name=GROUP, broker_id=7, epoch=epoch, offset=offset, acked_offset=0,
        max_bytes=1 << 20, wait_ms=50, segment_bytes=SEGMENT_BYTES,
    )  # fmt: skip


async def _keep_fetching(intruder: DataClient, epoch: int, stop: asyncio.Event) -> int:
    """Fetch as a slave would until ``stop``; the number of answers that carried data."""
    answered = 0
    while not stop.is_set():
        with contextlib.suppress(BrokerError):
            await intruder.request(FrameType.REPLICA_FETCH, _fetch(epoch))
            answered += 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.02):  # pacing, like a slave's retry
                await stop.wait()
    return answered


async def _refused(intruder: DataClient, epoch: int) -> BrokerError:
    try:
        await intruder.request(FrameType.REPLICA_FETCH, _fetch(epoch))
    except BrokerError as exc:
        return exc
    raise AssertionError("the master answered a fetch from a slave that proved nothing")


def _only_master_in_sync(master: BrokerProcess) -> None:
    holds_for(
        lambda: health(master)["in_sync_ids"] == [0],
        WATCH_S,
        "only the master is in sync while a stranger fetches",
    )


def test_an_unauthenticated_fetch_gets_nothing_and_does_not_count_as_a_replica(
    tmp_path: Path,
) -> None:
    group = start_group(tmp_path, brokers=1, mode="sync", min_in_sync=2)
    try:
        master = group.brokers[0]
        epoch = health(master)["epoch"]

        async def scenario() -> None:
            intruder = await DataClient.connect(master.data_host, master.data_port)
            producer = await DataClient.connect(master.data_host, master.data_port)
            stop = asyncio.Event()
            try:
                refusal = await _refused(intruder, epoch)
                assert refusal.code is ErrorCode.NO_PERMISSION
                assert "cluster secret" in refusal.detail
                fetching = asyncio.ensure_future(_keep_fetching(intruder, epoch, stop))
                await asyncio.to_thread(_only_master_in_sync, master)
                # Sync replication still needs a second copy: the stranger is not one.
                with pytest.raises(BrokerError) as caught:
                    await producer.send(TOPIC, 0, [encode(TOPIC, b"needs two copies")])
                assert caught.value.code is ErrorCode.NOT_ENOUGH_REPLICAS
                stop.set()
                assert await fetching == 0
            finally:
                stop.set()
                await intruder.close()
                await producer.close()

        run_async(scenario(), timeout_s=60)
    finally:
        group.stop()


def test_an_unauthenticated_fetch_does_not_hold_back_consumers(tmp_path: Path) -> None:
    group = start_group(tmp_path, brokers=1, mode="async", min_in_sync=1)
    try:
        master = group.brokers[0]
        epoch = health(master)["epoch"]
        bodies = [b"first", b"second", b"third"]

        async def scenario() -> None:
            intruder = await DataClient.connect(master.data_host, master.data_port)
            client = await DataClient.connect(master.data_host, master.data_port)
            stop = asyncio.Event()
            try:
                for body in bodies:
                    sent = await client.send(TOPIC, 0, [encode(TOPIC, body, queue_id=0)])
                    assert sent.status == SendResponse.OK
                assert (await _refused(intruder, epoch)).code is ErrorCode.NO_PERMISSION
                fetching = asyncio.ensure_future(_keep_fetching(intruder, epoch, stop))
                await asyncio.to_thread(_only_master_in_sync, master)
                pulled, payload = await client.pull(TOPIC, 0, 0)
                assert pulled.status == PullResponse.FOUND
                assert [r.body for r in iter_records(payload)] == bodies
                stop.set()
                assert await fetching == 0
            finally:
                stop.set()
                await intruder.close()
                await client.close()

        run_async(scenario(), timeout_s=60)
    finally:
        group.stop()


# --- a forged master ---------------------------------------------------------------------

PAIR_WITHOUT_FAILOVER = ClusterBuilder(
    groups=(GROUP,), replicas=2, broker_args=("--set", "failover=false")
)
"""A master (broker 0) and its slave that stay so (no controller picks)."""


def _held_by_both(master: BrokerProcess, slave: BrokerProcess) -> tuple[list[bytes], int]:
    """Five messages sent to queue 0 of the master and held by its slave too; their
    bodies and the master's log end."""
    bodies = [b"acked-%d" % n for n in range(5)]

    async def produce() -> None:
        await Admin().put_topic(
            master.http_url, TOPIC, TopicSettings(read_queues=1, write_queues=1)
        )
        client = await DataClient.connect(master.data_host, master.data_port)
        try:
            for body in bodies:
                sent = await client.send(TOPIC, 0, [encode(TOPIC, body, queue_id=0)])
                assert sent.status == SendResponse.OK
        finally:
            await client.close()

    run_async(produce())
    end = int(health(master)["commitlog_write_offset"])
    wait_until(
        lambda: health(slave)["commitlog_write_offset"] == end,
        20,
        "the slave holds the master's whole log",
    )
    return bodies, end


def _newer_epoch(frame_type: FrameType, header: bytes) -> bytes | None:
    """Tells any fetch that the group moved on to a new epoch with an empty log."""
    if frame_type is not FrameType.REPLICA_FETCH:
        return None
    request = ReplicaFetchRequest.FromString(header)
    newer = request.epoch + 5
    return ReplicaFetchResponse(
        epoch=newer, offset=request.offset, master_end=0, min_offset=0,
        epochs=[EpochEntry(epoch=newer, start_offset=0)],
    ).SerializeToString()  # fmt: skip


def test_a_slave_cuts_nothing_for_a_master_that_cannot_prove_the_secret(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    cluster = cluster_factory(PAIR_WITHOUT_FAILOVER)
    master, slave = cluster.broker(GROUP, 0), cluster.broker(GROUP, 1)
    bodies, end = _held_by_both(master, slave)
    master.kill()

    async def impersonate() -> list[FrameType]:
        impostor = Impostor(_newer_epoch)
        # The slave goes on following the dead master's address: take it over.
        await impostor.start(master.data_host, master.data_port)
        try:
            await wait_until_async(impostor.asked, 20, "the slave connects to the impostor")
            await asyncio.to_thread(
                holds_for,
                lambda: health(slave)["commitlog_write_offset"] == end,
                WATCH_S,
                "the slave keeps its log",
            )
            return list(impostor.seen)
        finally:
            await impostor.close()

    seen = run_async(impersonate(), timeout_s=60)

    assert FrameType.REPLICA_FETCH not in seen
    assert FrameType.REPLICA_AUTH in seen

    assert [r.body for r in run_async(read_records(slave, TOPIC))] == bodies


# --- a relay at a stale master address -------------------------------------------------------


class _Relay:
    """Listens at one address and passes every connection's bytes, both ways, to a real
    broker at another: what a process left at a master's old address could do without
    the secret. Records the frames the connecting side sent."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.sent: list[tuple[FrameType, bytes]] = []
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._handlers: set[asyncio.Task[object]] = set()

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        # Ends every pipe, so each connection's handler returns rather than being cancelled.
        for writer in self._writers:
            writer.close()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        self._writers.append(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        self._writers.append(up_writer)
        decoder = FrameDecoder()

        async def pipe(
            source: asyncio.StreamReader, sink: asyncio.StreamWriter, decode: bool
        ) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while chunk := await source.read(1 << 16):
                    if decode:
                        self.sent += [(f.type, bytes(f.header)) for f in decoder.feed(chunk)]
                    sink.write(chunk)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False))


def test_a_slave_refuses_a_masters_proof_relayed_from_another_address(
    tmp_path: Path, cluster_factory: Callable[[ClusterBuilder], Cluster]
) -> None:
    cluster = cluster_factory(PAIR_WITHOUT_FAILOVER)
    master, slave = cluster.broker(GROUP, 0), cluster.broker(GROUP, 1)
    # A real master of the same group, with the secret and an empty log, elsewhere.
    other = BrokerProcess.start(tmp_path / "other", "--broker-name", GROUP)
    try:
        bodies, end = _held_by_both(master, slave)
        master.kill()
        stale = f"{master.data_host}:{master.data_port}"
        other_address = f"{other.data_host}:{other.data_port}"

        async def relay() -> tuple[list[tuple[FrameType, bytes]], BaseException]:
            relay = _Relay(other.data_host, other.data_port)
            # The slave goes on following the dead master's address: relay it elsewhere.
            await relay.start(master.data_host, master.data_port)
            try:
                await wait_until_async(
                    _relayed_auth(relay), 20, "the slave's handshake reaches the other master"
                )
                await asyncio.to_thread(
                    holds_for,
                    lambda: health(slave)["commitlog_write_offset"] == end,
                    WATCH_S,
                    "the slave keeps its log",
                )
                # What the slave was told, through the same code, from this side.
                identity = SlaveIdentity(GROUP, 1, "127.0.0.1:1", cluster_secret_for_tests())
                with pytest.raises(NotAuthenticated) as refused:
                    await DataPlaneChannel.open(stale, identity=identity)
                return list(relay.sent), refused.value
            finally:
                await relay.close()

        sent, refusal = run_async(relay(), timeout_s=60)

        assert f"answered with the proof of master {other_address}" in str(refusal)
        assert "nothing is written or cut" in str(refusal)
        # The slave stopped after the master's answer: no proof of its own, no fetch.
        kinds = {t for t, _ in sent}
        assert kinds == {FrameType.REPLICA_AUTH}, kinds
        assert not any(ReplicaAuthRequest.FromString(h).slave_proof for _, h in sent)

        assert [r.body for r in run_async(read_records(slave, TOPIC))] == bodies
    finally:
        other.kill()


def _relayed_auth(relay: _Relay) -> object:
    async def holds() -> bool:
        return any(t is FrameType.REPLICA_AUTH for t, _ in relay.sent)

    return holds
