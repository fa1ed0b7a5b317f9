"""Real ``metaq-nameserver`` processes driven over gRPC: registration, liveness, assignment.

Brokers are stood in for by ``NameServerRegistrar`` — in this process where the test only
needs registration, in a child process (``registrar_child.py``) where the test kills or
stops the broker. Every wait polls a condition against a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from metaq.broker.registration import BrokerDescription, FixedTopics, NameServerRegistrar
from metaq.broker.topics import TopicTable
from metaq.common.model import (
    BrokerKey,
    BrokerState,
    Permission,
    ReplicationMode,
    Role,
    TopicChanges,
    TopicConfig,
)
from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1 import control_pb2_grpc
from metaq.testing.nameserver_process import (
    NameServerProcess,
    session_proof,
    signed_channel,
    start_nameserver,
)
from metaq.testing.waiting import cluster_secret_for_tests, deadline, secret_env, wait_until_async

if TYPE_CHECKING:
    from metaq.common.v1.control_pb2_grpc import NameServerAsyncStub

CHILD = Path(__file__).with_name("registrar_child.py")
STARTUP_S = 20.0

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="real processes on loopback")


# --- fixtures ----------------------------------------------------------------------------


@pytest.fixture
def nameservers(tmp_path: Path) -> Iterator[Callable[..., NameServerProcess]]:
    """``nameservers(*flags)``: a started nameserver on a free port, stopped at teardown."""
    started: list[NameServerProcess] = []

    def start(*flags: str) -> NameServerProcess:
        server = start_nameserver(tmp_path / f"nameserver-{len(started)}", *flags)
        started.append(server)
        return server

    yield start
    for server in started:
        if server.process.poll() is not None:
            # Died during the test: its output is the only account of why.
            print(f"nameserver {server.grpc_address} exited with "
                  f"{server.process.returncode}:\n{server.output()}")  # fmt: skip
        server.stop()


@pytest.fixture
def broker_processes(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """``broker_processes(*args)``: a registrar_child.py process, killed at teardown."""
    children: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        log = tmp_path / f"broker-{len(children)}.log"
        with log.open("wb") as stderr:
            child = subprocess.Popen(
                [sys.executable, str(CHILD), *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=secret_env(),
            )
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
        child.wait()


SECRET = cluster_secret_for_tests()

# --- helpers -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def client(address: str) -> AsyncIterator[NameServerAsyncStub]:
    async with signed_channel(address) as channel:
        yield control_pb2_grpc.NameServerStub(channel)


async def route_of(stub: NameServerAsyncStub, topic: str) -> pb.TopicRoute | None:
    try:
        return (await stub.GetRoute(pb.GetRouteRequest(topic=topic))).route
    except grpc.aio.AioRpcError as exc:
        if exc.code() is grpc.StatusCode.NOT_FOUND:
            return None
        raise


async def wait_for_route(address: str, topic: str, present: bool, timeout_s: float) -> float:
    """Wait until ``topic`` has (or has no) route at ``address``; return the seconds taken."""
    async with client(address) as stub:

        async def holds() -> bool:
            try:
                return (await route_of(stub, topic) is not None) == present
            except grpc.aio.AioRpcError as exc:
                # A restarted server on the same port: gRPC shares the old connection's
                # back-off between channels, so "unavailable" means "not yet".
                if exc.code() is grpc.StatusCode.UNAVAILABLE:
                    return False
                raise

        state = "appears" if present else "disappears"
        return await wait_until_async(holds, timeout_s, f"{topic} {state} at {address}")


def describe(
    broker_name: str = "broker-a",
    *,
    room: str = "",
    topics: tuple[TopicConfig, ...] = (TopicConfig("orders", 4, 4),),
) -> BrokerDescription:
    state = BrokerState(
        cluster="c1",
        key=BrokerKey(broker_name, 0),
        role=Role.MASTER,
        data_address="127.0.0.1:10911",
        http_address="127.0.0.1:10912",
        computer_room=room,
        epoch=3,
        replication_mode=ReplicationMode.ASYNC,
    )
    return BrokerDescription(state, FixedTopics(tuple(topics)))


def register_request(
    broker_name: str, room: str, queues: int, permission: int = pb.PERMISSION_READ_WRITE
) -> pb.RegisterBrokerRequest:
    return pb.RegisterBrokerRequest(
        broker=pb.BrokerState(
            cluster="c1",
            broker_name=broker_name,
            broker_id=0,
            role=pb.BROKER_ROLE_MASTER,
            data_address=f"{broker_name}.example:10911",
            computer_room=room,
            epoch=1,
            permission=pb.PERMISSION_READ_WRITE,
        ),
        topic_table=pb.TopicTable(
            topics=[
                pb.TopicConfig(
                    topic="orders",
                    read_queues=queues,
                    write_queues=queues,
                    permission=permission,  # type: ignore[arg-type]
                )
            ]
        ),
    )


async def rpc_error(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc
    raise AssertionError("the call was expected to fail")


# --- registration ------------------------------------------------------------------------


def test_a_registered_broker_appears_in_the_route_and_the_cluster_info(
    nameservers: Callable[..., NameServerProcess],
) -> None:
    server = nameservers()
    description = describe(
        room="hz",
        topics=(
            TopicConfig("orders", 8, 6, ordered=True),
            TopicConfig("audit", 2, 2, Permission.READ_ONLY),
        ),
    )

    async def scenario() -> tuple[pb.TopicRoute, pb.TopicRoute, pb.GetClusterInfoResponse]:
        registrar = NameServerRegistrar(
            [server.grpc_address], lambda: description, 0.2, secret=SECRET
        )
        await registrar.start()
        try:
            await wait_for_route(server.grpc_address, "orders", True, STARTUP_S)
            async with client(server.grpc_address) as stub:
                orders, audit = await route_of(stub, "orders"), await route_of(stub, "audit")
                info = await stub.GetClusterInfo(pb.GetClusterInfoRequest())
        finally:
            await registrar.stop()
        assert orders is not None and audit is not None
        return orders, audit, info

    orders, audit, info = asyncio.run(scenario())

    (group,) = orders.groups
    assert (group.cluster, group.broker_name, group.computer_room, group.epoch) == (
        "c1",
        "broker-a",
        "hz",
        3,
    )
    assert (group.read_queues, group.write_queues, group.ordered) == (8, 6, True)
    assert group.permission == pb.PERMISSION_READ_WRITE
    assert [(b.broker_id, b.role, b.data_address, b.http_address) for b in group.brokers] == [
        (0, pb.BROKER_ROLE_MASTER, "127.0.0.1:10911", "127.0.0.1:10912")
    ]
    assert audit.groups[0].permission == pb.PERMISSION_READ_ONLY
    (cluster,) = info.clusters
    (broker,) = cluster.groups[0].brokers
    assert broker.session_open
    assert broker.topic_count == 2
    assert broker.last_heartbeat_age_ms < info.broker_expiry_ms


def test_unary_registration_is_idempotent_and_unregister_removes_the_broker_at_once(
    nameservers: Callable[..., NameServerProcess],
) -> None:
    server = nameservers()

    async def scenario() -> None:
        async with client(server.grpc_address) as stub:
            request = register_request("broker-a", "hz", 4)
            first = await stub.RegisterBroker(request)
            second = await stub.RegisterBroker(request)
            assert first == second
            assert first.master_data_address == "broker-a.example:10911"
            assert first.broker_expiry_ms == 10_000
            assert await route_of(stub, "orders") is not None

            gone = await stub.UnregisterBroker(
                pb.UnregisterBrokerRequest(broker_name="broker-a", broker_id=0)
            )
            again = await stub.UnregisterBroker(
                pb.UnregisterBrokerRequest(broker_name="broker-a", broker_id=0)
            )

            assert (gone.removed, again.removed) == (True, False)
            assert await route_of(stub, "orders") is None

    asyncio.run(scenario())


def test_registrations_the_nameserver_cannot_accept_fail_with_a_reason(
    nameservers: Callable[..., NameServerProcess],
) -> None:
    server = nameservers()

    async def scenario() -> None:
        async with client(server.grpc_address) as stub:
            await stub.RegisterBroker(register_request("broker-a", "hz", 4))
            stale = register_request("broker-a", "hz", 4)
            stale.broker.broker_id = 1
            error = await rpc_error(stub.RegisterBroker(stale))
            assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "broker-a/0 is its master at epoch 1" in (error.details() or "")

            no_permission = register_request("broker-b", "hz", 4, pb.PERMISSION_UNSPECIFIED)
            error = await rpc_error(stub.RegisterBroker(no_permission))
            assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "PERMISSION_READ_WRITE" in (error.details() or "")

            no_table = pb.BrokerHeartbeat(broker=register_request("broker-c", "", 1).broker)
            call = stub.Session(metadata=session_proof(server.grpc_address, broker=no_table.broker))
            await call.write(no_table)
            error = await rpc_error(call.read())
            assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "must carry the topic table" in (error.details() or "")

    asyncio.run(scenario())


# --- liveness ----------------------------------------------------------------------------


def test_a_killed_broker_leaves_the_route_at_once_long_before_its_expiry(
    nameservers: Callable[..., NameServerProcess],
    broker_processes: Callable[..., subprocess.Popen[bytes]],
) -> None:
    expiry_s = deadline(30.0)
    server = nameservers("--broker-expiry-s", str(expiry_s))
    broker = broker_processes("--nameserver", server.grpc_address, "--broker-name", "broker-a")
    asyncio.run(wait_for_route(server.grpc_address, "orders", True, STARTUP_S))

    broker.kill()  # kill -9: no unregister, no goodbye; only the connection drops
    took_s = asyncio.run(wait_for_route(server.grpc_address, "orders", False, expiry_s))

    assert took_s < expiry_s / 10, f"the broker took {took_s:.2f} s to leave"


def test_a_stopped_broker_that_keeps_its_connection_leaves_within_the_expiry(
    nameservers: Callable[..., NameServerProcess],
    broker_processes: Callable[..., subprocess.Popen[bytes]],
) -> None:
    expiry_s = deadline(2.0)
    server = nameservers("--broker-expiry-s", str(expiry_s), "--expiry-scan-interval-s", "0.1")
    broker = broker_processes(
        "--nameserver", server.grpc_address, "--broker-name", "broker-a", "--interval-s", "0.2"
    )
    asyncio.run(wait_for_route(server.grpc_address, "orders", True, STARTUP_S))

    broker.send_signal(signal.SIGSTOP)  # the fixture resumes and kills it at teardown
    took_s = asyncio.run(wait_for_route(server.grpc_address, "orders", False, expiry_s + 2))

    # Gone within the expiry (plus polling), but not at once: its session was still open.
    assert expiry_s / 2 < took_s <= expiry_s + deadline(0.5), (
        f"the broker took {took_s:.2f} s to leave"
    )


def test_the_registrar_carries_on_with_the_other_nameserver_when_one_is_killed(
    nameservers: Callable[..., NameServerProcess],
) -> None:
    first, second = nameservers("--broker-expiry-s", "2"), nameservers("--broker-expiry-s", "2")
    orders = TopicConfig("orders", 4, 4)
    current = {"description": describe(topics=(orders,))}

    async def scenario() -> None:
        registrar = NameServerRegistrar(
            [first.grpc_address, second.grpc_address],
            lambda: current["description"],
            0.2,
            secret=SECRET,
        )
        await registrar.start()
        try:
            for server in (first, second):
                await wait_for_route(server.grpc_address, "orders", True, STARTUP_S)

            first.kill()
            current["description"] = describe(topics=(orders, TopicConfig("payments", 2, 2)))
            registrar.refresh()

            await wait_for_route(second.grpc_address, "payments", True, 5.0)

            async def only_second_connected() -> bool:
                return registrar.connected == {second.grpc_address}

            await wait_until_async(only_second_connected, 5.0, "the registrar sees one down")
            async with client(second.grpc_address) as stub:
                info = await stub.GetClusterInfo(pb.GetClusterInfoRequest())
            (broker,) = info.clusters[0].groups[0].brokers
            assert broker.session_open and broker.topic_count == 2
        finally:
            await registrar.stop()

    asyncio.run(scenario())


def test_after_the_first_heartbeat_a_session_carries_only_the_topics_that_changed(
    nameservers: Callable[..., NameServerProcess], tmp_path: Path
) -> None:
    # The whole table at every create made a broker of 10,000 topics send (and the
    # nameserver index) all of them per create.
    server = nameservers()
    table = TopicTable(tmp_path)
    for n in range(500):
        table.create(f"kept-{n:03d}")
    whole_tables: list[int] = []

    class Counted:
        @property
        def version(self) -> int:
            return table.version

        def all(self) -> list[TopicConfig]:
            whole_tables.append(table.version)
            return table.all()

        def changes_since(self, version: int) -> TopicChanges | None:
            return table.changes_since(version)

    source = Counted()
    state = describe().state

    async def scenario() -> None:
        registrar = NameServerRegistrar(
            [server.grpc_address], lambda: BrokerDescription(state, source), 0.2, secret=SECRET
        )
        table.listeners.append(lambda _name: registrar.refresh())
        await registrar.start()
        try:
            await wait_for_route(server.grpc_address, "kept-499", True, STARTUP_S)
            table.create("fresh")
            await wait_for_route(server.grpc_address, "fresh", True, 5.0)
            table.delete("kept-000")
            await wait_for_route(server.grpc_address, "kept-000", False, 5.0)
            table.update("kept-001", write_queues=2)

            async def updated() -> bool:
                async with client(server.grpc_address) as stub:
                    route = await route_of(stub, "kept-001")
                return route is not None and route.groups[0].write_queues == 2

            await wait_until_async(updated, 5.0, "the update reaches the route")
            async with client(server.grpc_address) as stub:
                info = await stub.GetClusterInfo(pb.GetClusterInfoRequest())
            assert info.clusters[0].groups[0].brokers[0].topic_count == 500
        finally:
            await registrar.stop()

    asyncio.run(scenario())
    assert len(whole_tables) == 1, "the table went whole once, at the session's start"


def test_a_hung_nameserver_does_not_hold_up_registration_with_the_others(
    nameservers: Callable[..., NameServerProcess],
) -> None:
    hung, healthy = nameservers(), nameservers()
    description = describe()
    hung.pause()  # accepts connections (the kernel does) but never answers

    async def scenario() -> None:
        registrar = NameServerRegistrar(
            [hung.grpc_address, healthy.grpc_address],
            lambda: description,
            0.2,
            max_backoff_s=0.5,
            secret=SECRET,
        )
        await registrar.start()
        try:
            await wait_for_route(healthy.grpc_address, "orders", True, 5.0)

            # The route shows once the nameserver applied the registration; the registrar
            # marks the link connected when the answer comes back, a moment later.
            async def only_healthy_connected() -> bool:
                return registrar.connected == {healthy.grpc_address}

            await wait_until_async(
                only_healthy_connected, 5.0, "the registrar sees the healthy one"
            )
            assert hung.grpc_address not in registrar.connected

            hung.resume()
            await wait_for_route(hung.grpc_address, "orders", True, 10.0)
        finally:
            await registrar.stop()

    asyncio.run(scenario())


def test_the_registrar_registers_again_with_a_restarted_nameserver(
    nameservers: Callable[..., NameServerProcess],
) -> None:
    server = nameservers()
    description = describe()

    async def scenario() -> None:
        registrar = NameServerRegistrar(
            [server.grpc_address], lambda: description, 0.2, max_backoff_s=0.5, secret=SECRET
        )
        await registrar.start()
        try:
            await wait_for_route(server.grpc_address, "orders", True, STARTUP_S)
            server.kill()

            async def disconnected() -> bool:
                return not registrar.connected

            await wait_until_async(disconnected, 5.0, "the registrar notices the loss")
            restarted = nameservers("--grpc-port", str(server.grpc_port))
            assert restarted.grpc_address == server.grpc_address
            await wait_for_route(restarted.grpc_address, "orders", True, 10.0)
        finally:
            await registrar.stop()

    asyncio.run(scenario())


def test_stopping_the_registrar_unregisters_from_every_nameserver(
    nameservers: Callable[..., NameServerProcess],
) -> None:
    servers = [nameservers("--broker-expiry-s", "30"), nameservers("--broker-expiry-s", "30")]
    description = describe()

    async def scenario() -> list[pb.TopicRoute | None]:
        registrar = NameServerRegistrar(
            [s.grpc_address for s in servers], lambda: description, secret=SECRET
        )
        await registrar.start()
        for server in servers:
            await wait_for_route(server.grpc_address, "orders", True, STARTUP_S)

        await registrar.stop()

        routes = []
        for server in servers:
            async with client(server.grpc_address) as stub:
                routes.append(await route_of(stub, "orders"))
        return routes

    assert asyncio.run(scenario()) == [None, None]


# --- assignment --------------------------------------------------------------------------


def assignment_request(
    strategy: str, members: list[tuple[str, str]], topic: str = "orders"
) -> pb.GetAssignmentRequest:
    return pb.GetAssignmentRequest(
        consumer_group="cg",
        topic=topic,
        strategy=strategy,
        members=[pb.AssignmentMember(consumer_id=c, computer_room=r) for c, r in members],
    )


def held(response: pb.GetAssignmentResponse) -> dict[str, list[tuple[str, int, str]]]:
    return {
        m.consumer_id: [(q.broker_name, q.queue_id, q.computer_room) for q in m.queues]
        for m in response.assignment
    }


def test_computer_room_first_keeps_consumers_in_their_room_and_shares_out_empty_rooms(
    nameservers: Callable[..., NameServerProcess],
) -> None:
    servers = [nameservers(), nameservers()]
    members = [("c-hz-1", "hz"), ("c-hz-2", "hz"), ("c-sh-1", "sh")]

    async def scenario() -> list[pb.GetAssignmentResponse]:
        answers = []
        for server in servers:
            async with client(server.grpc_address) as stub:
                for name, room, queues in [("b-hz", "hz", 4), ("b-sh", "sh", 4), ("b-bj", "bj", 2)]:
                    await stub.RegisterBroker(register_request(name, room, queues))
                # Write-only queues are not consumed, whatever their room.
                await stub.RegisterBroker(
                    register_request("b-hz-wo", "hz", 4, pb.PERMISSION_WRITE_ONLY)
                )
                answers.append(
                    await stub.GetAssignment(assignment_request("computer_room_first", members))
                )
        return answers

    first, second = asyncio.run(scenario())

    assert first == second  # nameservers never talk, yet answer the same
    assignment = held(first)
    assert list(assignment) == ["c-hz-1", "c-hz-2", "c-sh-1"]
    for consumer, room in members:
        own = [q for q in assignment[consumer] if q[2] != "bj"]
        assert own and all(q[2] == room for q in own), (consumer, assignment[consumer])
    assert sorted(q for queues in assignment.values() for q in queues) == sorted(
        [("b-hz", i, "hz") for i in range(4)]
        + [("b-sh", i, "sh") for i in range(4)]
        + [("b-bj", i, "bj") for i in range(2)]
    )
    # The room with no consumers (bj) goes to the members with the fewest own-room queues.
    assert [q[0] for q in assignment["c-hz-1"]].count("b-bj") == 1
    assert [q[0] for q in assignment["c-hz-2"]].count("b-bj") == 1


def test_assignment_for_one_member_and_a_sticky_previous_assignment(
    nameservers: Callable[..., NameServerProcess],
) -> None:
    server = nameservers()
    members = [("c1", "hz"), ("c2", "hz"), ("c3", "hz")]

    async def scenario() -> None:
        async with client(server.grpc_address) as stub:
            await stub.RegisterBroker(register_request("b-hz", "hz", 9))
            request = assignment_request("computer_room_first", members)
            whole = await stub.GetAssignment(request)

            mine = await stub.GetAssignmentFor(
                pb.GetAssignmentForRequest(request=request, consumer_id="c2")
            )
            assert list(mine.queues) == list(whole.assignment[1].queues)

            stranger = await rpc_error(
                stub.GetAssignmentFor(pb.GetAssignmentForRequest(request=request, consumer_id="x"))
            )
            assert stranger.code() is grpc.StatusCode.INVALID_ARGUMENT

            # c3 leaves: with the previous assignment given, only c3's queues move.
            after = assignment_request("computer_room_first", members[:2])
            after.previous.extend(whole.assignment)
            moved = held(await stub.GetAssignment(after))
            before = held(whole)
            for consumer in ("c1", "c2"):
                assert set(before[consumer]) <= set(moved[consumer])
            assert sum(len(q) for q in moved.values()) == 9

    asyncio.run(scenario())


def test_an_assignment_request_and_answer_over_grpcs_4_mb_default_pass(
    nameservers: Callable[..., NameServerProcess],
) -> None:
    # A large group's request carries every member's held queues and its answer every
    # member: 120,000 members make both about 5 MB, past gRPC's 4 MB default limit.
    server = nameservers()
    members = [(f"consumer-{n:06d}-{'x' * 24}", "hz") for n in range(120_000)]
    request = assignment_request("sticky", members)
    request.previous.add(
        consumer_id=members[0][0],
        queues=[pb.MessageQueue(topic="orders", broker_name="b-hz", queue_id=q) for q in range(9)],
    )
    assert request.ByteSize() > 4 * 1024 * 1024

    async def scenario() -> pb.GetAssignmentResponse:
        async with client(server.grpc_address) as stub:
            await stub.RegisterBroker(register_request("b-hz", "hz", 9))
            return await stub.GetAssignment(request, timeout=deadline(60))

    answer = asyncio.run(scenario())

    assert answer.ByteSize() > 4 * 1024 * 1024
    assert len(answer.assignment) == len(members)
    assert len(held(answer)[members[0][0]]) == 1  # 9 queues over 120,000: its quota is one


def test_an_unknown_topic_is_not_found_and_an_unknown_strategy_names_the_known_ones(
    nameservers: Callable[..., NameServerProcess],
) -> None:
    server = nameservers()

    async def scenario() -> list[grpc.aio.AioRpcError]:
        async with client(server.grpc_address) as stub:
            await stub.RegisterBroker(register_request("b-hz", "hz", 4))
            return [
                await rpc_error(stub.GetRoute(pb.GetRouteRequest(topic="nope"))),
                await rpc_error(
                    stub.GetAssignment(assignment_request("average", [("c", "")], "nope"))
                ),
                await rpc_error(stub.GetAssignment(assignment_request("fastest", [("c", "")]))),
            ]

    route, assignment, strategy = asyncio.run(scenario())

    assert route.code() is grpc.StatusCode.NOT_FOUND
    assert "'nope'" in (route.details() or "")
    assert assignment.code() is grpc.StatusCode.NOT_FOUND
    assert strategy.code() is grpc.StatusCode.INVALID_ARGUMENT
    details = strategy.details() or ""
    assert "'fastest'" in details
    for known in (
        "average",
        "balanced_hash",
        "computer_room_first",
        "consistent_hash",
        "round_robin",
        "sticky",
    ):
        assert known in details


# --- the process ---------------------------------------------------------------------------


def test_the_process_serves_http_health_and_exits_cleanly_on_sigterm(
    nameservers: Callable[..., NameServerProcess],
) -> None:
    server = nameservers("--http-port", "0")
    assert server.http_address.startswith("127.0.0.1:")

    with urllib.request.urlopen(f"http://{server.http_address}/health", timeout=5) as response:
        health = json.loads(response.read())

    assert health["status"] == "ok"
    # 0, not -9: it exited on SIGTERM by itself rather than being killed at the deadline.
    assert server.stop(timeout_s=deadline(10.0)) == 0
    assert "stopped" in server.output()


def test_a_second_nameserver_on_a_taken_port_refuses_to_start(
    nameservers: Callable[..., NameServerProcess],
) -> None:
    first = nameservers()

    with pytest.raises(RuntimeError, match=f"cannot listen for gRPC on {first.grpc_address}"):
        nameservers("--grpc-port", str(first.grpc_port))
