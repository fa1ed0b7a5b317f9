"""Replication and failover with real processes: kill -9, SIGSTOP, a lost slave, a
divergent old master, a lost controller leader.

Each test runs one broker group under a steady producer sending one message at a time
with unique bodies, and afterwards reads everything back from the group's master: every
message the group acknowledged (status OK) must be there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from metaq.common.errors import ErrorCode
from metaq.common.record import encode
from metaq.common.v1 import control_pb2 as pb
from metaq.replication.epochs import EpochHistory
from metaq.testing import DataClient
from metaq.testing.cluster import Group, controller_state
from metaq.testing.data_client import BrokerError
from metaq.testing.replica_group import (
    TOPIC,
    History,
    commitlog_bytes,
    health,
    produce,
    read_all,
    start_group,
)
from metaq.testing.waiting import run_async, secret_env, wait_until, wait_until_async

pytestmark = pytest.mark.slow
T = TypeVar("T")

# Fast failure detection for tests; the defaults are the production values.
FAST = ("--set", "replica_lag_max_ms=2000", "--set", "replication_timeout_ms=1000")


async def with_producer(group: Group, history: History, during: Callable[[], Awaitable[T]]) -> T:
    """Run ``during`` while a producer sends; stop the producer after it."""
    stop = asyncio.Event()
    task = asyncio.create_task(produce(group.nameserver_addresses, history, stop))
    try:
        return await during()
    finally:
        stop.set()
        await task


async def acked_count_reaches(history: History, count: int, timeout_s: float = 20.0) -> None:
    async def reached() -> bool:
        return len(history.acked) >= count

    try:
        await wait_until_async(reached, timeout_s, f"{count} sends are acknowledged")
    except AssertionError:
        raise AssertionError(
            f"{len(history.acked)} sends acknowledged, not {count}, within {timeout_s} s; "
            f"last failures: {history.failures[-3:]}; other statuses: {history.other_status[-3:]}"
        ) from None


def lost(group: Group, master_id: int, history: History) -> list[bytes]:
    """Acknowledged messages the master does not hold. The newest may still be on their
    way into the consume queues (dispatch runs after the append), so a message counts as
    lost only if it is still missing after a few seconds."""
    missing: list[bytes] = []

    def none_missing() -> bool:
        stored = set(run_async(read_all(group.brokers[master_id])))
        missing[:] = [body for body in history.acked if body not in stored]
        return not missing

    with contextlib.suppress(AssertionError):
        wait_until(none_missing, 5.0, "every acknowledged message is readable")
    return missing


def test_sync_kill9_of_the_master_loses_nothing_and_the_old_master_rejoins(
    tmp_path: Path,
) -> None:
    group = start_group(tmp_path, brokers=3, mode="sync", min_in_sync=2, extra=FAST)
    try:
        old = group.master()
        history = History()

        async def kill_master() -> int:
            await acked_count_reaches(history, 200)
            group.brokers[old].kill()
            killed = time.monotonic()
            new = await asyncio.to_thread(group.master, 15.0, other_than=old)
            await acked_count_reaches(history, len(history.acked) + 100)
            resumed = next(t for t in history.ack_times if t > killed)
            assert resumed - killed < 10, "the producer resumed on the new master"
            return new

        new = run_async(with_producer(group, history, kill_master), timeout_s=60)

        assert new != old
        assert lost(group, new, history) == []
        # The old master comes back as a slave and copies the new master's log exactly.
        group.start_broker(old)
        group.wait_caught_up(old)
        assert health(group.brokers[old])["role"] == "slave"
        end = health(group.brokers[new])["commitlog_write_offset"]
        assert commitlog_bytes(group.brokers[old], end) == commitlog_bytes(group.brokers[new], end)
    finally:
        group.stop()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_master_paused_past_detection_acknowledges_nothing_after_it_was_replaced(
    tmp_path: Path, mode: str
) -> None:
    group = start_group(tmp_path, brokers=2, mode=mode, min_in_sync=1, extra=FAST)
    try:
        old = group.master()
        history = History()
        paused_at: list[float] = []

        async def pause_master() -> int:
            await acked_count_reaches(history, 100)
            group.brokers[old].pause()
            paused_at.append(time.monotonic())
            new = await asyncio.to_thread(group.master, 15.0, other_than=old)
            await acked_count_reaches(history, len(history.acked) + 50)
            group.brokers[old].resume()
            # It learns it was replaced, becomes a slave and follows the new master.
            await asyncio.to_thread(
                wait_until,
                lambda: health(group.brokers[old])["role"] == "slave",
                15.0,
                "the old master stepped down",
            )
            await acked_count_reaches(history, len(history.acked) + 50)
            return new

        new = run_async(with_producer(group, history, pause_master), timeout_s=60)

        missing = set(lost(group, new, history))
        acked_after_pause = [
            body for body, at in zip(history.acked, history.ack_times, strict=True)
            if at > paused_at[0]
        ]  # fmt: skip
        # Async replication may lose what the slave had not copied before the pause;
        # nothing acknowledged after it (the lease ran out) may be lost in either mode.
        assert missing.isdisjoint(acked_after_pause)
        if mode == "sync":
            assert not missing
        group.wait_caught_up(old)
        end = health(group.brokers[new])["commitlog_write_offset"]
        assert commitlog_bytes(group.brokers[old], end) == commitlog_bytes(group.brokers[new], end)
    finally:
        group.stop()


def test_without_enough_in_sync_copies_sends_are_refused_never_acknowledged(
    tmp_path: Path,
) -> None:
    group = start_group(tmp_path, brokers=2, mode="sync", min_in_sync=2, extra=FAST)
    try:
        master = group.master()
        slave = 1 - master
        history = History()

        async def lose_the_slave() -> tuple[int, float]:
            await acked_count_reaches(history, 50)
            group.brokers[slave].kill()
            acked_at_kill = len(history.acked)
            refused = len(history.failures) + len(history.other_status)
            await asyncio.to_thread(
                wait_until,
                lambda: any("NOT_ENOUGH_REPLICAS" in f or "in-sync copies" in f
                            for _, f in history.failures[refused:]),
                15.0,
                "sends are refused for want of in-sync copies",
            )  # fmt: skip
            acked_while_down = len(history.acked) - acked_at_kill
            assert acked_while_down <= 1, "at most the send in flight at the kill was acked"
            await asyncio.to_thread(group.start_broker, slave)
            back = time.monotonic()
            await acked_count_reaches(history, len(history.acked) + 20)
            return acked_while_down, back

        _, back = run_async(with_producer(group, history, lose_the_slave), timeout_s=60)

        resumed = next(t for t in history.ack_times if t > back)
        assert resumed - back < 15
        assert lost(group, group.master(), history) == []
    finally:
        group.stop()


def test_async_kill9_loses_at_most_the_tail_the_slave_had_not_copied(tmp_path: Path) -> None:
    group = start_group(tmp_path, brokers=2, mode="async", min_in_sync=1, extra=FAST)
    try:
        old = group.master()
        history = History()

        async def kill_master() -> int:
            await acked_count_reaches(history, 300)
            group.brokers[old].kill()
            return await asyncio.to_thread(group.master, 15.0, other_than=old)

        new = run_async(with_producer(group, history, kill_master), timeout_s=60)

        missing = lost(group, new, history)
        # Where the new master's epoch starts is where its copy of the old log ended.
        copied = EpochHistory(group.brokers[new].data_dir / "epochs.json").entries[-1]
        tail = commitlog_bytes(group.brokers[old], 1 << 30)[copied.start_offset :]
        for body in missing:
            assert body in tail, f"{body!r} was lost but was not in the uncopied tail"
        print(f"async failover lost {len(missing)} of {len(history.acked)} acknowledged")
    finally:
        group.stop()


def test_a_divergent_tail_on_the_old_master_is_cut_when_it_rejoins(tmp_path: Path) -> None:
    group = start_group(
        tmp_path, brokers=2, mode="async", min_in_sync=1,
        extra=("--set", "replica_lag_max_ms=20000"),
    )  # fmt: skip
    try:
        old = group.master()
        slave = 1 - old
        history = History()

        async def diverge() -> None:
            await acked_count_reaches(history, 50)
            group.brokers[slave].pause()  # it stops copying; the master goes on alone
            await acked_count_reaches(history, len(history.acked) + 50)
            group.brokers[old].kill()
            group.brokers[slave].resume()
            await asyncio.to_thread(group.master, 15.0, other_than=old)
            await acked_count_reaches(history, len(history.acked) + 50)

        run_async(with_producer(group, history, diverge), timeout_s=60)
        new = group.master()
        assert new == slave
        old_end = _log_end(group, old)
        fork = EpochHistory(group.brokers[new].data_dir / "epochs.json").entries[-1].start_offset
        assert old_end > fork, "the old master holds a tail the new master never had"

        group.start_broker(old)
        group.wait_caught_up(old)

        end = health(group.brokers[new])["commitlog_write_offset"]
        assert commitlog_bytes(group.brokers[old], end) == commitlog_bytes(group.brokers[new], end)
        old_epochs = EpochHistory(group.brokers[old].data_dir / "epochs.json").entries
        assert old_epochs[-1].start_offset == fork
    finally:
        group.stop()


def _log_end(group: Group, broker_id: int) -> int:
    """Where a stopped broker's log ends: the first zero size field."""
    data = commitlog_bytes(group.brokers[broker_id], 1 << 30)
    pos = 0
    while pos + 4 <= len(data):
        size = int.from_bytes(data[pos : pos + 4], "little")
        if size == 0:
            break
        pos += size
    return pos


def test_failover_still_happens_after_the_controller_leader_is_killed(tmp_path: Path) -> None:
    group = start_group(tmp_path, brokers=2, nameservers=3, mode="sync", min_in_sync=1,
                        extra=FAST)  # fmt: skip
    try:
        leader = next(ns for ns in group.nameservers if _controller(ns.grpc_address).is_leader)
        leader.kill()
        survivors = [ns for ns in group.nameservers if ns is not leader]
        wait_until(
            lambda: any(_controller(ns.grpc_address).is_leader for ns in survivors),
            20.0,
            "a new controller leader is elected",
        )
        old = group.master()
        group.brokers[old].kill()
        new = group.master(15.0, other_than=old)
        state = _controller(survivors[0].grpc_address)
        control = next(g for g in state.groups if g.broker_name == "broker-g")
        assert control.master_id == new
        assert control.epoch >= 2
        print(json.dumps({"new_master": new, "epoch": control.epoch}))
    finally:
        group.stop()


def _controller(address: str) -> pb.GetControllerStateResponse:
    return run_async(controller_state(address))


def test_a_planned_switchover_moves_the_master_and_loses_nothing(tmp_path: Path) -> None:
    group = start_group(tmp_path, brokers=2, mode="async", min_in_sync=1, extra=FAST)
    try:
        old = group.master()
        target = 1 - old
        history = History()

        async def switch() -> subprocess.CompletedProcess[str]:
            await acked_count_reaches(history, 100)
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "metaq.client.cli", "cluster", "switchover",
                 "--group", "broker-g", "--to", str(target), "--json"],
                capture_output=True, text=True, timeout=60, check=False,
                env=secret_env({"METAQ_NAMESERVERS": ",".join(group.nameserver_addresses)}),
            )  # fmt: skip
            await acked_count_reaches(history, len(history.acked) + 100)
            return done

        done = run_async(with_producer(group, history, switch), timeout_s=60)

        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["master_id"] == target
        assert group.master() == target
        assert lost(group, target, history) == []
        listing = subprocess.run(
            [sys.executable, "-m", "metaq.client.cli", "cluster", "list"],
            capture_output=True, text=True, timeout=30, check=True,
            env={**os.environ, "METAQ_NAMESERVERS": ",".join(group.nameserver_addresses)},
        )  # fmt: skip
        assert "IN SYNC" in listing.stdout
        print(f"switchover took {answer['elapsed_ms']} ms")
    finally:
        group.stop()


def test_a_send_waiting_in_a_paused_masters_socket_is_refused_once_it_was_replaced(
    tmp_path: Path,
) -> None:
    # Async replication: nothing but the master's lease stops it from acknowledging.
    group = start_group(tmp_path, brokers=2, mode="async", min_in_sync=1, extra=FAST)
    try:
        old = group.master()
        broker = group.brokers[old]

        async def scenario() -> None:
            client = await DataClient.connect(broker.data_host, broker.data_port)
            try:
                await client.send(TOPIC, 0, [encode(TOPIC, b"before the pause", queue_id=0)])
                broker.pause()
                # Sent while it is stopped: it waits in the socket until SIGCONT.
                pending = asyncio.ensure_future(
                    client.send(TOPIC, 0, [encode(TOPIC, b"after the pause", queue_id=0)])
                )
                await asyncio.to_thread(group.master, 15.0, other_than=old)
                broker.resume()
                with pytest.raises(BrokerError) as refused:
                    await asyncio.wait_for(pending, 15)
                assert refused.value.code is ErrorCode.NOT_MASTER
            finally:
                await client.close()

        run_async(scenario())
    finally:
        group.stop()
