"""The failover controller in real ``metaq-nameserver`` processes, one and three (Raft).

Brokers are :class:`FakeBroker` s speaking the real Session stream with ``controlled``
set, acting on each GroupControl as a controlled broker must. Every wait polls a
condition against a deadline.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1 import control_pb2_grpc
from metaq.testing.nameserver_fakes import FakeBroker, Received
from metaq.testing.nameserver_process import (
    NameServerProcess,
    signed_channel,
    start_controller_group,
    start_nameserver,
)
from metaq.testing.waiting import deadline, run_async, wait_until_async

if TYPE_CHECKING:
    from metaq.common.v1.control_pb2_grpc import NameServerAsyncStub

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="real processes on loopback")

SCENARIO_S = 60.0
SETTLE_S = 15.0


@pytest.fixture
def nameservers(tmp_path: Path) -> Iterator[list[NameServerProcess]]:
    """Every nameserver a test starts goes in here and is stopped at teardown."""
    started: list[NameServerProcess] = []
    yield started
    for server in started:
        server.stop()


@contextlib.asynccontextmanager
async def client(address: str) -> AsyncIterator[NameServerAsyncStub]:
    async with signed_channel(address) as channel:
        yield control_pb2_grpc.NameServerStub(channel)


@contextlib.asynccontextmanager
async def brokers(*started: FakeBroker) -> AsyncIterator[None]:
    try:
        for broker in started:
            await broker.start()
        yield
    finally:
        for broker in started:
            await broker.close()


async def state_of(address: str) -> pb.GetControllerStateResponse:
    async with client(address) as stub:
        return await stub.GetControllerState(pb.GetControllerStateRequest(), timeout=2)


async def route_brokers(address: str, topic: str = "orders") -> list[tuple[int, int]]:
    async with client(address) as stub:
        route = (await stub.GetRoute(pb.GetRouteRequest(topic=topic))).route
    return [(b.broker_id, b.role) for b in route.groups[0].brokers]


async def leader_among(servers: Sequence[NameServerProcess], timeout_s: float) -> int:
    """The index of the nameserver whose controller leads, once exactly one says so."""
    found: list[int] = []

    async def one_leads() -> bool:
        found.clear()
        for index, server in enumerate(servers):
            with contextlib.suppress(grpc.aio.AioRpcError):
                if (await state_of(server.grpc_address)).is_leader:
                    found.append(index)
        return len(found) == 1

    await wait_until_async(one_leads, timeout_s, "one controller leads")
    return found[0]


def is_master(broker_id: int, epoch: int) -> Callable[[pb.GroupControl], bool]:
    return lambda c: (c.master_id, c.epoch) == (broker_id, epoch)


async def wait_for_isr(
    broker: FakeBroker, epoch: int, in_sync: tuple[int, ...], timeout_s: float
) -> None:
    await broker.wait_for_control(
        lambda c: c.epoch == epoch and tuple(c.in_sync_ids) == in_sync,
        timeout_s,
        f"in sync {in_sync} committed at epoch {epoch}",
    )


async def wait_for_state(
    address: str, epoch: int, master_id: int, in_sync: tuple[int, ...], timeout_s: float
) -> None:
    async def holds() -> bool:
        return [
            (g.epoch, g.master_id, tuple(g.in_sync_ids)) for g in (await state_of(address)).groups
        ] == [(epoch, master_id, in_sync)]

    await wait_until_async(holds, timeout_s, f"{address} knows epoch {epoch}, in sync {in_sync}")


# --- one nameserver ------------------------------------------------------------------------


def test_bootstrap_makes_the_configured_master_master_and_routes_follow(
    tmp_path: Path, nameservers: list[NameServerProcess]
) -> None:
    server = start_nameserver(tmp_path / "ns")
    nameservers.append(server)
    address = server.grpc_address
    # Broker 1 is further ahead, but broker 0 is the one deployed as master.
    master = FakeBroker([address], "broker-a", 0, configured_master=True, epoch=2)
    slave = FakeBroker([address], "broker-a", 1, epoch=2, commitlog_max_offset=10_000)

    async def scenario() -> tuple[pb.GetControllerStateResponse, pb.GetClusterInfoResponse]:
        async with brokers(master, slave):
            for broker in (master, slave):
                await broker.wait_for_control(is_master(0, 3), SETTLE_S, "bootstrap")

            async def master_in_routes() -> bool:
                return await route_brokers(address) == [
                    (0, pb.BROKER_ROLE_MASTER),
                    (1, pb.BROKER_ROLE_SLAVE),
                ]

            await wait_until_async(master_in_routes, SETTLE_S, "broker 0 is master in routes")
            async with client(address) as stub:
                info = await stub.GetClusterInfo(pb.GetClusterInfoRequest())
            return await state_of(address), info

    state, info = run_async(scenario(), SCENARIO_S)

    (group,) = state.groups
    assert (group.broker_name, group.epoch, group.master_id) == ("broker-a", 3, 0)
    assert list(group.in_sync_ids) == [0]
    assert group.master_data_address == master.data_address
    assert state.is_leader and state.leader == "local"
    assert info.clusters[0].groups[0].control == group
    answer = slave.received[-1].event.registered
    assert answer.master_data_address == master.data_address
    assert "bootstrap: broker broker-a/0 is master because it is the configured master" in (
        server.output()
    )


def test_when_the_masters_session_ends_the_in_sync_slave_is_elected_and_told_unasked(
    tmp_path: Path, nameservers: list[NameServerProcess]
) -> None:
    server = start_nameserver(tmp_path / "ns")
    nameservers.append(server)
    address = server.grpc_address
    master = FakeBroker([address], "broker-a", 0, configured_master=True, in_sync_ids=(0, 1))
    slave = FakeBroker([address], "broker-a", 1, commitlog_max_offset=500)
    # Far ahead, but never reported in sync by the master: never elected.
    outsider = FakeBroker([address], "broker-a", 2, commitlog_max_offset=10**9)

    async def scenario() -> tuple[float, int, int]:
        async with brokers(master, slave, outsider):
            await wait_for_isr(slave, 1, (0, 1), SETTLE_S)
            slave.pause()  # from here on every event it gets is unasked
            beats = slave.heartbeats_sent
            received = len(slave.received)
            closed_at = time.monotonic()
            await master.close()  # as if killed: its connection drops

            told = await slave.wait_for_control(is_master(1, 2), SETTLE_S, "slave elected")
            pushed = len(slave.received) - received
            assert slave.heartbeats_sent == beats
            slave.resume()

            async def slave_in_routes() -> bool:
                return (await route_brokers(address))[0] == (1, pb.BROKER_ROLE_MASTER)

            await wait_until_async(slave_in_routes, SETTLE_S, "broker 1 is master in routes")
            return told.at - closed_at, pushed, len(outsider.controls())

    took_s, pushed, outsider_told = run_async(scenario(), SCENARIO_S)

    assert took_s < deadline(0.5), f"the slave learned of its election {took_s:.3f} s after"
    assert pushed >= 1
    assert outsider_told >= 2  # every broker of the group is told, not only the new master
    state = run_async(state_of(address))
    assert [(g.epoch, g.master_id, list(g.in_sync_ids)) for g in state.groups] == [(2, 1, [1])]
    assert "failover: master broker-a/0 left" in server.output()


def test_an_old_master_that_returns_is_no_master_in_routes(
    tmp_path: Path, nameservers: list[NameServerProcess]
) -> None:
    server = start_nameserver(tmp_path / "ns")
    nameservers.append(server)
    address = server.grpc_address
    master = FakeBroker([address], "broker-a", 0, configured_master=True, in_sync_ids=(0, 1))
    slave = FakeBroker([address], "broker-a", 1)
    # The old master comes back still believing it is master at epoch 1 (it missed the news).
    stale = FakeBroker([address], "broker-a", 0, follow=False)

    async def scenario() -> list[tuple[int, int]]:
        async with brokers(master, slave):
            await wait_for_isr(slave, 1, (0, 1), SETTLE_S)
            await master.close()
            await slave.wait_for_control(is_master(1, 2), SETTLE_S, "slave elected")
            stale.role, stale.epoch = pb.BROKER_ROLE_MASTER, 1
            async with brokers(stale):
                told = await stale.wait_for_control(is_master(1, 2), SETTLE_S, "told it lost")
                assert told.event.registered.master_data_address == slave.data_address

                async def both_listed() -> bool:
                    listed = await route_brokers(address)
                    return len(listed) == 2 and listed[0][0] == 1

                # Both listed, and the new master has taken over (its next heartbeat).
                await wait_until_async(both_listed, SETTLE_S, "both brokers in routes")
                return await route_brokers(address)

    assert run_async(scenario(), SCENARIO_S) == [
        (1, pb.BROKER_ROLE_MASTER),
        (0, pb.BROKER_ROLE_SLAVE),
    ]


# --- three nameservers, one Raft group -------------------------------------------------------


def test_a_failover_still_happens_after_the_raft_leaders_nameserver_is_killed(
    tmp_path: Path, nameservers: list[NameServerProcess]
) -> None:
    servers = start_controller_group(tmp_path, 3, "--bootstrap-grace-ms", "1000")
    nameservers.extend(servers)
    addresses = [s.grpc_address for s in servers]
    master = FakeBroker(addresses, "broker-a", 0, configured_master=True, in_sync_ids=(0, 1))
    slave = FakeBroker(addresses, "broker-a", 1)

    async def scenario() -> tuple[int, list[pb.GetControllerStateResponse]]:
        async with brokers(master, slave):
            await wait_for_isr(slave, 1, (0, 1), SETTLE_S)
            leader = await leader_among(servers, SETTLE_S)
            servers[leader].kill()  # kill -9
            survivors = [s for i, s in enumerate(servers) if i != leader]
            await leader_among(survivors, SETTLE_S)

            await master.close()

            await slave.wait_for_control(is_master(1, 2), SETTLE_S, "slave elected")

            async def both_agree() -> bool:
                states = [await state_of(s.grpc_address) for s in survivors]
                return all([g.epoch for g in s.groups] == [2] for s in states)

            await wait_until_async(both_agree, SETTLE_S, "the survivors agree on epoch 2")
            return leader, [await state_of(s.grpc_address) for s in survivors]

    leader, states = run_async(scenario(), SCENARIO_S)

    for state in states:
        (group,) = state.groups
        assert (group.epoch, group.master_id, list(group.in_sync_ids)) == (2, 1, [1])
        assert state.leader != servers[leader].raft_address
    assert sum(state.is_leader for state in states) == 1


def test_only_the_raft_leaders_answers_grant_the_master_its_lease(
    tmp_path: Path, nameservers: list[NameServerProcess]
) -> None:
    servers = start_controller_group(tmp_path, 3)
    nameservers.extend(servers)
    addresses = [s.grpc_address for s in servers]
    master = FakeBroker(addresses, "broker-a", 0, configured_master=True)

    async def scenario() -> tuple[int, dict[str, set[bool]]]:
        async with brokers(master):
            await master.wait_for_control(is_master(0, 1), SETTLE_S, "bootstrap")
            leader = await leader_among(servers, SETTLE_S)
            seen = len(master.received)
            target = master.heartbeats_sent + 3

            # A follower answers without the group's control until it has applied the
            # bootstrap from the Raft log, which may come after the leader's answer.
            async def answered() -> bool:
                return master.heartbeats_sent >= target and {
                    r.nameserver
                    for r in master.received[seen:]
                    if r.event.answers and r.event.registered.HasField("control")
                } == set(addresses)

            await wait_until_async(answered, SETTLE_S, "every nameserver answered with control")
            granted: dict[str, set[bool]] = {}
            for r in master.received[seen:]:
                if r.event.answers and r.event.registered.HasField("control"):
                    granted.setdefault(r.nameserver, set()).add(r.event.registered.lease_granted)
            return leader, granted

    leader, granted = run_async(scenario(), SCENARIO_S)

    assert granted == {a: {a == addresses[leader]} for a in addresses}


def test_only_the_leader_asks_for_the_masters_full_beat_and_a_new_leader_asks_at_once(
    tmp_path: Path, nameservers: list[NameServerProcess]
) -> None:
    servers = start_controller_group(tmp_path, 3, "--standby-heartbeat-interval-ms", "1200")
    nameservers.extend(servers)
    addresses = [s.grpc_address for s in servers]
    master = FakeBroker(addresses, "broker-a", 0, configured_master=True, in_sync_ids=(0, 1))
    slave = FakeBroker(addresses, "broker-a", 1)

    def asked(broker: FakeBroker, since: int) -> dict[str, set[int]]:
        """The beat each nameserver asked for in its answers to ``broker``'s heartbeats."""
        wanted: dict[str, set[int]] = {}
        for r in broker.received[since:]:
            if r.event.answers and r.event.registered.HasField("control"):
                wanted.setdefault(r.nameserver, set()).add(r.event.registered.heartbeat_interval_ms)
        return wanted

    async def scenario() -> tuple[int, dict[str, set[int]], dict[str, set[int]], int]:
        async with brokers(master, slave):
            await wait_for_isr(slave, 1, (0, 1), SETTLE_S)
            leader = await leader_among(servers, SETTLE_S)
            seen = (len(master.received), len(slave.received))
            target = master.heartbeats_sent + 5

            # A follower answers without the group's control until it has applied the
            # bootstrap from the Raft log: wait until every one answered with it.
            async def answered() -> bool:
                pairs = zip((master, slave), seen, strict=True)
                return master.heartbeats_sent >= target and all(
                    len(asked(b, since)) == 3 for b, since in pairs
                )

            await wait_until_async(answered, SETTLE_S, "every nameserver answered both")
            of_master, of_slave = asked(master, seen[0]), asked(slave, seen[1])

            master.pause()  # from here on what the master gets is unasked
            pushed = len(master.received)
            servers[leader].kill()
            survivors = [s for i, s in enumerate(servers) if i != leader]
            new_leader = survivors[await leader_among(survivors, SETTLE_S)].grpc_address

            def told() -> Received | None:
                return next(
                    (
                        r
                        for r in master.received[pushed:]
                        if r.nameserver == new_leader
                        and not r.event.answers
                        and r.event.registered.heartbeat_interval_ms == 0
                    ),
                    None,
                )

            async def was_told() -> bool:
                return told() is not None

            await wait_until_async(was_told, SETTLE_S, "the new leader asked for the full beat")
            master.resume()
            return leader, of_master, of_slave, addresses.index(new_leader)

    leader, of_master, of_slave, new_leader = run_async(scenario(), SCENARIO_S)

    # The leader wants the master's beat at the broker's own rate; the followers, and the
    # leader for the slave, the standby beat.
    assert of_master == {a: {0 if i == leader else 1200} for i, a in enumerate(addresses)}
    assert of_slave == {a: {1200} for a in addresses}
    # The new leader asked the (paused) master for its full beat unasked, as it led.
    assert new_leader != leader


def test_switchover_through_a_follower_and_its_refusals(
    tmp_path: Path, nameservers: list[NameServerProcess]
) -> None:
    servers = start_controller_group(tmp_path, 3)
    nameservers.extend(servers)
    addresses = [s.grpc_address for s in servers]
    master = FakeBroker(addresses, "broker-a", 0, configured_master=True, in_sync_ids=(0, 1))
    slave = FakeBroker(addresses, "broker-a", 1, in_sync_ids=(0, 1))
    outsider = FakeBroker(addresses, "broker-a", 2)

    async def switch(address: str, broker_id: int, epoch: int) -> pb.SwitchoverResponse:
        async with client(address) as stub:
            return await stub.Switchover(
                pb.SwitchoverRequest(
                    broker_name="broker-a", broker_id=broker_id, expected_epoch=epoch
                ),
                timeout=10,
            )

    async def refusal(address: str, broker_id: int, epoch: int) -> grpc.aio.AioRpcError:
        try:
            await switch(address, broker_id, epoch)
        except grpc.aio.AioRpcError as exc:
            return exc
        raise AssertionError("the switchover was expected to be refused")

    async def scenario() -> None:
        async with brokers(master, slave, outsider):
            await wait_for_isr(slave, 1, (0, 1), SETTLE_S)
            leader = await leader_among(servers, SETTLE_S)
            follower = servers[(leader + 1) % 3].grpc_address
            # The follower answers from its own copy of the Raft log: wait until it holds
            # the group's state, or it refuses for not knowing the group at all.
            await wait_for_state(follower, 1, 0, (0, 1), SETTLE_S)

            not_in_sync = await refusal(follower, 2, 1)
            stale_epoch = await refusal(follower, 1, 0)
            already = await refusal(follower, 0, 1)
            for error in (not_in_sync, stale_epoch, already):
                assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "not in the in-sync set [0, 1]" in (not_in_sync.details() or "")
            assert "is at epoch 1, not the expected 0" in (stale_epoch.details() or "")
            assert "already the master" in (already.details() or "")

            moved = await switch(follower, 1, 1)
            assert (moved.control.epoch, moved.control.master_id) == (2, 1)
            assert list(moved.control.in_sync_ids) == [1]
            await slave.wait_for_control(is_master(1, 2), SETTLE_S, "the switch is pushed")
            await master.wait_for_control(is_master(1, 2), SETTLE_S, "the old master is told")
            # The new master reports both in sync again, and a switch back is possible.
            await wait_for_state(follower, 2, 1, (0, 1), SETTLE_S)

            # Without a majority nothing can be committed, and the caller is told so.
            for index in range(3):
                if servers[index].grpc_address != follower:
                    servers[index].kill()
            lonely = await refusal(follower, 0, 2)
            assert lonely.code() is grpc.StatusCode.UNAVAILABLE, lonely.details()

    run_async(scenario(), SCENARIO_S)


def test_a_taken_raft_address_fails_start_up_with_the_reason(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"

        with pytest.raises(RuntimeError, match=f"cannot listen for Raft on {address}"):
            start_nameserver(
                tmp_path / "ns",
                "--controller-address",
                address,
                "--controller-peers",
                "127.0.0.1:1",
            )
