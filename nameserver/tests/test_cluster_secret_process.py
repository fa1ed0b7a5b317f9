"""Real nameserver processes with a cluster secret: strangers who reach the Raft or gRPC
port change nothing, and a member cannot register over a live broker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pickle
import socket
import struct
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from pysyncobj.encryptor import getEncryptor  # type: ignore[import-untyped]

from metaq.common.auth import ENV_VAR, ClusterSecret, call_metadata
from metaq.common.server_names import target_of
from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1 import control_pb2_grpc
from metaq.testing.nameserver_fakes import FakeBroker
from metaq.testing.nameserver_process import (
    NameServerProcess,
    free_ports,
    session_proof,
    signed_channel,
    start_controller_group,
    start_nameserver,
)
from metaq.testing.waiting import cluster_secret_for_tests, run_async, wait_until_async

SETTLE_S = 15.0
SCENARIO_S = 60.0
WRONG = ClusterSecret(b"not-the-clusters-secret-at-all", "an outsider")


@pytest.fixture
def nameservers() -> Iterator[list[NameServerProcess]]:
    started: list[NameServerProcess] = []
    yield started
    for server in started:
        server.stop()


class _OpenFile:
    """Unpickling this calls open(path, "w"): a stand-in for any command an attacker runs."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.path), "w"))


def _pysyncobj_message(obj: object) -> bytes:
    """A message as pysyncobj's transport frames one with no password configured."""
    data = zlib.compress(pickle.dumps(obj), 3)
    return struct.pack("i", len(data)) + data


def _send_until_closed(address: str, payload: bytes, timeout_s: float) -> None:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(payload)
        # The nameserver drops a connection whose first message it could not use; once it
        # has, whatever it was going to do with the payload is done.
        with contextlib.suppress(ConnectionResetError):
            while sock.recv(4096):
                pass


async def _leader(address: str) -> str:
    async with signed_channel(address) as channel:
        state = await control_pb2_grpc.NameServerStub(channel).GetControllerState(
            pb.GetControllerStateRequest(), timeout=2
        )
    return state.leader


def test_a_pickle_sent_to_the_raft_port_runs_nothing_and_the_controller_goes_on(
    tmp_path: Path, nameservers: list[NameServerProcess]
) -> None:
    servers = start_controller_group(tmp_path, 2)
    nameservers.extend(servers)

    async def leaders_agree() -> bool:
        leaders = {await _leader(s.grpc_address) for s in servers}
        return len(leaders) == 1 and "" not in leaders

    run_async(wait_until_async(leaders_agree, SETTLE_S, "the controllers elect a leader"))
    markers = []
    for index, server in enumerate(servers):
        marker = tmp_path / f"pwned-{index}"
        markers.append(marker)
        _send_until_closed(server.raft_address, _pysyncobj_message(_OpenFile(marker)), SETTLE_S)

    assert [m for m in markers if m.exists()] == []
    assert all(s.process.poll() is None for s in servers)
    run_async(wait_until_async(leaders_agree, SETTLE_S, "the controllers still have a leader"))


def _flood(address: str, limit: int) -> int:
    """Announce a 2 GiB message and send junk until the nameserver drops the connection
    or ``limit`` bytes went; returns how many bytes went."""
    host, _, port = address.rpartition(":")
    sent = 0
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        sock.settimeout(SETTLE_S)
        sock.connect((host, int(port)))
        chunk = struct.pack("i", 2**31 - 1) + bytes(64 * 1024)
        try:
            while sent < limit:
                sent += sock.send(chunk)
                chunk = bytes(64 * 1024)
        except (BrokenPipeError, ConnectionResetError):
            pass
    return sent


def test_a_stranger_announcing_a_huge_message_is_dropped_within_a_few_kib(
    tmp_path: Path, nameservers: list[NameServerProcess]
) -> None:
    servers = start_controller_group(tmp_path, 3)
    nameservers.extend(servers)

    async def one_leader() -> str | None:
        leaders = {await _leader(s.grpc_address) for s in servers}
        return leaders.pop() if len(leaders) == 1 and "" not in leaders else None

    run_async(wait_until_async(one_leader, SETTLE_S, "the controllers elect a leader"))
    leader = run_async(one_leader())
    target = next(s for s in servers if s.raft_address == leader)
    limit = 32 * 1024 * 1024
    # Four streams at once into the leader, as an attacker would (pysyncobj buffered each
    # whole, copying it at every read, and the leader lost its leadership).
    floods = ThreadPoolExecutor(4)
    sent = list(floods.map(lambda _: _flood(target.raft_address, limit), range(4)))
    floods.shutdown()

    # What a stream got into the nameserver: at most the 4 KiB an unauthenticated
    # connection may buffer, plus what the kernel's socket buffers held.
    assert max(sent) < 2 * 1024 * 1024, sent
    run_async(wait_until_async(one_leader, SETTLE_S, "a leader after the flood"))
    assert run_async(one_leader()) == leader


def test_a_peer_with_the_password_but_no_members_name_is_dropped(
    tmp_path: Path, nameservers: list[NameServerProcess]
) -> None:
    servers = start_controller_group(tmp_path, 2)
    nameservers.extend(servers)
    fernet = getEncryptor(cluster_secret_for_tests().raft_password())
    host, _, port = servers[0].raft_address.rpartition(":")

    def frame(message: object) -> bytes:
        data = fernet.encrypt_at_time(
            zlib.compress(pickle.dumps(message), 3), int(time.monotonic())
        )
        return struct.pack("i", len(data)) + data

    with socket.create_connection((host, int(port)), timeout=SETTLE_S) as sock:
        ours = b"k" * 32
        sock.sendall(frame(ours))
        size = struct.unpack("i", _read(sock, 4))[0]
        key, theirs = pickle.loads(zlib.decompress(fernet.decrypt(_read(sock, size))))
        assert key == ours  # the handshake went through: we hold the password
        # pysyncobj's read-only node: a password holder that is no configured member.
        sock.sendall(frame((theirs, "readonly")))
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(4096) == b""  # closed, not served


def _read(sock: socket.socket, size: int) -> bytes:
    out = b""
    while len(out) < size:
        more = sock.recv(size - len(out))
        assert more, "the nameserver closed the connection during the handshake"
        out += more
    return out


def _host_address() -> str | None:
    """An address of this host that is not loopback: a client dialling it is seen as
    coming from it, as a client on another host would be."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # a documentation address: nothing is sent
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


def test_without_auth_the_console_takes_changes_only_from_this_host(
    tmp_path: Path, nameservers: list[NameServerProcess]
) -> None:
    host = _host_address()
    if host is None:
        pytest.skip("this machine has no address but loopback")
    server = start_nameserver(tmp_path / "ns", "--listen-host", host, "--http-port", "0")
    nameservers.append(server)
    switchover = f"http://{server.http_address}/console/cluster/group-a/switchover"
    request = urllib.request.Request(switchover, data=b"to=1&epoch=1", method="POST")
    request.add_header("Content-Type", "application/x-www-form-urlencoded")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)

    assert refused.value.code == 403
    assert "only from this host" in json.load(refused.value)["error"]
    refused.value.close()
    with urllib.request.urlopen(f"http://{server.http_address}/console/cluster", timeout=10) as r:
        assert r.status == 200  # the pages stay open


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (("--controller-peers",), "controller_peers is set"),
        (("--listen-host", "0.0.0.0"), "listen_host '0.0.0.0' is not a loopback address"),
    ],
)
def test_a_nameserver_that_would_be_reachable_refuses_to_start_without_a_secret(
    tmp_path: Path, flags: tuple[str, ...], reason: str
) -> None:
    argv = list(flags)
    if argv == ["--controller-peers"]:
        ports = free_ports(2)
        argv = [
            "--controller-address", f"127.0.0.1:{ports[0]}",
            "--controller-peers", f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}",
        ]  # fmt: skip

    try:
        started = start_nameserver(tmp_path / "ns", *argv, env={ENV_VAR: ""})
    except RuntimeError as exc:
        refusal = str(exc)
    else:
        started.stop()
        pytest.fail("the nameserver started without a cluster secret")

    assert "exited with 2" in refusal
    assert reason in refusal
    assert "cluster_secret_file" in refusal


# --- the gRPC control plane ----------------------------------------------------------------


@contextlib.asynccontextmanager
async def _stub(address: str, secret: ClusterSecret | None) -> AsyncIterator[Any]:
    """A stub proving ``secret``, or nothing at all for None."""
    channel = signed_channel(address, secret) if secret else grpc.aio.insecure_channel(address)
    async with channel:
        yield control_pb2_grpc.NameServerStub(channel)


async def _code(call: Any) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def _finish(session: Any) -> None:
    """End a Session call and wait until it has, so no event of it outlives the loop."""
    session.cancel()
    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
        await session.code()


async def _session_code(session: Any) -> grpc.StatusCode:
    """OK once the nameserver answers a heartbeat, else the status the stream ended with
    (read from the call: a read racing the end can fail with a status of its own)."""
    try:
        await session.read()
    except grpc.aio.AioRpcError:
        code: grpc.StatusCode = await session.code()
        return code
    return grpc.StatusCode.OK


def _forged(broker_id: int, data_address: str, epoch: int) -> pb.RegisterBrokerRequest:
    return pb.RegisterBrokerRequest(
        broker=pb.BrokerState(
            cluster="c1",
            broker_name="broker-a",
            broker_id=broker_id,
            role=pb.BROKER_ROLE_MASTER,
            data_address=data_address,
            epoch=epoch,
            permission=pb.PERMISSION_READ_WRITE,
        ),
        topic_table=pb.TopicTable(
            topics=[pb.TopicConfig(topic="orders", read_queues=1, write_queues=1,
                                   permission=pb.PERMISSION_READ_WRITE)]
        ),
    )  # fmt: skip


async def _view(address: str) -> tuple[list[tuple[int, int, str]], list[tuple[int, int]]]:
    """broker-a's route (id, role, address) and the controller's (epoch, master)."""
    async with _stub(address, None) as stub:
        route = (await stub.GetRoute(pb.GetRouteRequest(topic="orders"))).route
        state = await stub.GetControllerState(pb.GetControllerStateRequest())
    brokers = [(b.broker_id, b.role, b.data_address) for g in route.groups for b in g.brokers]
    return brokers, [(g.epoch, g.master_id) for g in state.groups]


@contextlib.asynccontextmanager
async def _group(address: str) -> AsyncIterator[tuple[FakeBroker, FakeBroker]]:
    """broker-a: master 0 and slave 1, both in sync, registered with the tests' secret."""
    master = FakeBroker([address], "broker-a", 0, configured_master=True, in_sync_ids=(0, 1))
    slave = FakeBroker([address], "broker-a", 1, in_sync_ids=(0, 1))
    try:
        await master.start()
        await slave.start()
        await slave.wait_for_control(
            lambda c: (c.master_id, tuple(c.in_sync_ids)) == (0, (0, 1)),
            SETTLE_S,
            "the controller has 0 master with 0 and 1 in sync",
        )
        yield master, slave
    finally:
        await master.close()
        await slave.close()


def test_calls_that_change_the_cluster_need_the_secret_and_change_nothing_without_it(
    tmp_path: Path, nameservers: list[NameServerProcess]
) -> None:
    server = start_nameserver(tmp_path / "ns")
    nameservers.append(server)
    address = server.grpc_address

    async def scenario() -> None:
        async with _group(address):
            before = await _view(address)
            for secret in (None, WRONG):
                async with _stub(address, secret) as stub:
                    codes = [
                        await _code(stub.RegisterBroker(_forged(0, "10.6.6.6:1", 99))),
                        await _code(stub.RegisterBroker(_forged(7, "10.6.6.6:1", 99))),
                        await _code(
                            stub.UnregisterBroker(
                                pb.UnregisterBrokerRequest(broker_name="broker-a", broker_id=0)
                            )
                        ),
                        await _code(
                            stub.Switchover(
                                pb.SwitchoverRequest(
                                    broker_name="broker-a", broker_id=1, expected_epoch=1
                                )
                            )
                        ),
                    ]
                    # Refused as it opens, before any heartbeat is read: writing one would
                    # race the refusal (and end the call INTERNAL instead).
                    session = stub.Session(
                        metadata=session_proof(address, secret) if secret else ()
                    )
                    codes.append(await _session_code(session))
                    await _finish(session)
                assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 5, (secret, codes)
            assert await _view(address) == before
            assert before == ([(0, pb.BROKER_ROLE_MASTER, "127.0.0.1:20000"),
                               (1, pb.BROKER_ROLE_SLAVE, "127.0.0.1:20001")], [(1, 0)])  # fmt: skip

            # With the secret, the same switchover goes through.
            async with _stub(address, None) as plain:
                epoch = (await plain.GetControllerState(pb.GetControllerStateRequest())).groups[0]
            async with signed_channel(address) as channel:
                moved = await control_pb2_grpc.NameServerStub(channel).Switchover(
                    pb.SwitchoverRequest(
                        broker_name="broker-a", broker_id=1, expected_epoch=epoch.epoch
                    )
                )
            assert moved.control.master_id == 1

    run_async(scenario(), SCENARIO_S)


def test_a_registration_over_a_live_broker_is_refused_even_with_the_secret(
    tmp_path: Path, nameservers: list[NameServerProcess]
) -> None:
    server = start_nameserver(tmp_path / "ns")
    nameservers.append(server)
    address = server.grpc_address

    async def scenario() -> None:
        async with _group(address) as (master, _slave):
            before = await _view(address)
            async with signed_channel(address) as channel:
                stub = control_pb2_grpc.NameServerStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.RegisterBroker(_forged(0, "127.0.0.1:1", 99))
            assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "registered and live at 127.0.0.1:20000" in (caught.value.details() or "")
            assert await _view(address) == before

            # The broker itself goes on heartbeating from its own address.
            await wait_until_async(
                _more_answers(master, len(master.received)),
                SETTLE_S,
                "the real master is still answered",
            )
            assert await _view(address) == before

    run_async(scenario(), SCENARIO_S)


def _more_answers(broker: FakeBroker, seen: int) -> Any:
    async def holds() -> bool:
        return len(broker.received) > seen + 2

    return holds


# --- what a captured proof is worth ---------------------------------------------------------

_X = pb.BrokerState(
    cluster="c1", broker_name="broker-x", broker_id=0, data_address="127.0.0.1:20100"
)


def _heartbeat(identity: pb.BrokerState, data_address: str | None = None) -> pb.BrokerHeartbeat:
    """A master's first heartbeat for ``identity``, from ``data_address`` if given."""
    broker = pb.BrokerState()
    broker.CopyFrom(identity)
    broker.role = pb.BROKER_ROLE_MASTER
    broker.permission = pb.PERMISSION_READ_WRITE
    if data_address is not None:
        broker.data_address = data_address
    table = _forged(0, "127.0.0.1:1", 0).topic_table
    return pb.BrokerHeartbeat(broker=broker, topic_table=table)


async def _registered(address: str) -> set[tuple[str, int, str]]:
    """Every broker the nameserver has registered: (group, id, data address)."""
    async with _stub(address, None) as stub:
        info = await stub.GetClusterInfo(pb.GetClusterInfoRequest())
    return {
        (g.broker_name, b.state.broker_id, b.state.data_address)
        for c in info.clusters
        for g in c.groups
        for b in g.brokers
    }


def test_a_captured_session_proof_registers_no_broker_but_the_one_it_names(
    tmp_path: Path, nameservers: list[NameServerProcess]
) -> None:
    server = start_nameserver(tmp_path / "ns")
    nameservers.append(server)
    address = server.grpc_address

    async def scenario() -> None:
        # What broker X's Session opened with, as someone on the path would capture it.
        captured = session_proof(address, broker=_X)
        forgeries = [
            _heartbeat(_forged(7, "10.6.6.6:1", 99).broker),  # another broker
            _heartbeat(_X, data_address="10.6.6.6:1"),  # X, but taking its sends elsewhere
        ]
        async with _stub(address, None) as stub:
            for forged in forgeries:
                session = stub.Session(metadata=captured)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await session.write(forged)
                assert await _session_code(session) is grpc.StatusCode.INVALID_ARGUMENT
                assert "this session was opened for broker broker-x/0" in (
                    await session.details() or ""
                )
                await _finish(session)
            assert await _registered(address) == set()

            # The proof itself is good: it registers X, from X's own address.
            session = stub.Session(metadata=captured)
            await session.write(_heartbeat(_X))
            assert await _session_code(session) is grpc.StatusCode.OK
            assert await _registered(address) == {("broker-x", 0, "127.0.0.1:20100")}
            await _finish(session)

    run_async(scenario(), SCENARIO_S)


def test_an_unregistration_signed_before_the_brokers_current_registration_is_refused(
    tmp_path: Path, nameservers: list[NameServerProcess]
) -> None:
    server = start_nameserver(tmp_path / "ns")
    nameservers.append(server)
    address = server.grpc_address
    secret = cluster_secret_for_tests()
    leave = pb.UnregisterBrokerRequest(broker_name="broker-x", broker_id=0)
    body = leave.SerializeToString(deterministic=True)

    def broker() -> FakeBroker:
        return FakeBroker(
            [address], "broker-x", 0, configured_master=True, controlled=False,
            role=pb.BROKER_ROLE_MASTER,
        )  # fmt: skip

    async def x_registered() -> bool:
        return ("broker-x", 0, "127.0.0.1:20000") in await _registered(address)

    async def scenario() -> None:
        first = broker()
        await first.start()
        await wait_until_async(x_registered, SETTLE_S, "broker-x/0 registers")
        # Captured while the first incarnation runs...
        signed_s = time.time()
        target = target_of(address)
        captured = call_metadata(secret, "UnregisterBroker", target, body, signed_s)
        await first.close()

        # Proofs are dated to the millisecond: a restart signed within the same one
        # would not be "after" it (no real restart is that quick; this test can be).
        async def a_later_millisecond() -> bool:
            return int(time.time() * 1000) > int(signed_s * 1000)

        await wait_until_async(a_later_millisecond, 1.0, "the clock passes the capture")
        # ...and replayed once the broker is back (well within the skew window).
        second = broker()
        try:
            await second.start()

            async def answered() -> bool:
                return bool(second.received)

            await wait_until_async(answered, SETTLE_S, "broker-x/0 registers again")
            async with grpc.aio.insecure_channel(address) as channel:
                stub = control_pb2_grpc.NameServerStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.UnregisterBroker(leave, metadata=captured)
                assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
                assert "registered again after this UnregisterBroker was signed" in (
                    caught.value.details() or ""
                )
                assert await x_registered()

                # One the broker signs now goes through.
                fresh = call_metadata(secret, "UnregisterBroker", target, body, time.time())
                left = await stub.UnregisterBroker(leave, metadata=fresh)
                assert left.removed
        finally:
            await second.close()

    run_async(scenario(), SCENARIO_S)
