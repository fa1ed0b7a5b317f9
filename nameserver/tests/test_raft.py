"""The controller's Raft state in-process (a group of one): commits, no-ops, the journal."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from metaq.common.model import GroupControl
from metaq.nameserver.control import Refused
from metaq.nameserver.decisions import Proposal
from metaq.nameserver.raft import LOCAL_NODE, ControllerUnavailable, ControlRaft, Snapshot
from metaq.testing.waiting import run_async, wait_until_async

TIMEOUT_S = 5.0


async def started(raft: ControlRaft, seen: list[Snapshot]) -> None:
    loop = asyncio.get_running_loop()
    raft.start(lambda snapshot: loop.call_soon_threadsafe(seen.append, snapshot))

    async def leading() -> bool:
        return raft.is_leader

    await wait_until_async(leading, TIMEOUT_S, "the controller of one leads itself")


def bootstrap(master: int, epoch: int) -> Proposal:
    return Proposal("bootstrap", "broker-a", epoch, master, (master,), "test bootstrap")


def in_sync(epoch: int, ids: tuple[int, ...]) -> Proposal:
    return Proposal("set_isr", "broker-a", epoch, ids[0], ids, "test in-sync set")


def elect(master: int, expected_epoch: int) -> Proposal:
    return Proposal("elect", "broker-a", expected_epoch, master, (master,), "test failover")


def test_a_controller_of_one_commits_and_refuses_stale_proposals_without_a_change() -> None:
    raft = ControlRaft()
    seen: list[Snapshot] = []

    async def scenario() -> list[object]:
        await started(raft, seen)
        try:
            return [
                await raft.propose(bootstrap(0, 3), TIMEOUT_S),
                await raft.propose(bootstrap(1, 9), TIMEOUT_S),  # a second bootstrap
                await raft.propose(in_sync(3, (0, 1, 2)), TIMEOUT_S),
                await raft.propose(elect(1, 3), TIMEOUT_S),
                await raft.propose(elect(2, 3), TIMEOUT_S),  # decided on epoch 3: stale
            ]
        finally:
            await raft.stop()

    first, second, widened, third, fourth = run_async(scenario())

    assert (raft.address, raft.networked) == (LOCAL_NODE, False)
    assert first == GroupControl("broker-a", 3, 0, (0,), "test bootstrap")
    assert isinstance(second, Refused)
    assert widened == GroupControl("broker-a", 3, 0, (0, 1, 2), "test in-sync set")
    assert third == GroupControl("broker-a", 4, 1, (1,), "test failover")
    assert isinstance(fourth, Refused) and "is at epoch 4, not 3" in fourth.why
    # Each committed change was published, in order, and nothing for the no-ops.
    changes = [s["broker-a"] for s in seen if "broker-a" in s]
    assert [(c.epoch, c.master_id, c.in_sync_ids) for c in dict.fromkeys(changes)] == [
        (3, 0, (0,)),
        (3, 0, (0, 1, 2)),
        (4, 1, (1,)),
    ]


# pysyncobj 0.3.17 reads the journal's meta file without closing it (journal.py, getMeta).
@pytest.mark.filterwarnings(
    r"ignore:Exception ignored in.*raft-journal\.bin\.meta:pytest.PytestUnraisableExceptionWarning"
)
def test_the_journal_in_the_controller_dir_survives_a_restart(tmp_path: Path) -> None:
    async def run(proposals: list[Proposal]) -> Snapshot:
        raft = ControlRaft(directory=tmp_path / "controller")
        seen: list[Snapshot] = [{}]
        await started(raft, seen)
        try:
            for proposal in proposals:
                assert isinstance(await raft.propose(proposal, TIMEOUT_S), GroupControl)

            # The journal is replayed entry by entry: wait for the last one.
            async def replayed() -> bool:
                control = seen[-1].get("broker-a")
                return control is not None and control.epoch == 2

            await wait_until_async(replayed, TIMEOUT_S, "the whole state is published")
            return seen[-1]
        finally:
            await raft.stop()

    before = run_async(run([bootstrap(0, 1), in_sync(1, (0, 1)), elect(1, 1)]))
    after = run_async(run([]))

    assert after == before
    assert after["broker-a"].epoch == 2
    assert (tmp_path / "controller" / "raft-journal.bin").exists()


def test_a_restart_from_a_dump_publishes_the_state_it_holds(tmp_path: Path) -> None:
    directory = tmp_path / "controller"
    dump = directory / "raft-dump.bin"

    async def write_and_dump() -> None:
        raft = ControlRaft(directory=directory)
        await started(raft, [])
        try:
            for epoch in (1, 2):
                group = Proposal("bootstrap", f"g{epoch}", epoch, 0, (0,), "test")
                assert isinstance(await raft.propose(group, TIMEOUT_S), GroupControl)
            raft.compact()

            async def dumped() -> bool:
                return dump.exists()

            await wait_until_async(dumped, TIMEOUT_S, "the dump is written")
        finally:
            await raft.stop()

    async def restart() -> Snapshot:
        raft = ControlRaft(directory=directory)
        seen: list[Snapshot] = [{}]
        await started(raft, seen)
        try:

            async def restored() -> bool:
                return len(seen[-1]) == 2

            await wait_until_async(restored, TIMEOUT_S, "the dumped state is published")
            return seen[-1]
        finally:
            await raft.stop()

    run_async(write_and_dump())
    # Only the dump is left: the state can come from nowhere else.
    for journal in directory.glob("raft-journal.bin*"):
        journal.unlink()
    restored = run_async(restart())

    assert {name: c.epoch for name, c in restored.items()} == {"g1": 1, "g2": 2}


def test_a_proposal_to_a_stopped_controller_is_unavailable() -> None:
    async def scenario() -> None:
        with pytest.raises(ControllerUnavailable, match="not running"):
            await ControlRaft().propose(bootstrap(0, 1), TIMEOUT_S)

    run_async(scenario())


def test_peers_need_an_address_of_our_own() -> None:
    with pytest.raises(ValueError, match="needs its own Raft address"):
        ControlRaft(peers=("127.0.0.1:7001",), password="x" * 64)


def test_peers_need_a_password() -> None:
    with pytest.raises(ValueError, match="needs a Raft password"):
        ControlRaft("127.0.0.1:7000", peers=("127.0.0.1:7001",))
