"""Three controller Raft members in one process, on loopback, all restarted at once.

Raft is safe across restarts only if a member comes back with the ``currentTerm`` and
``votedFor`` it had (Raft §5, "persistent state on all servers"). A member that came back at
term 0 with a journal whose entries carry a higher term could win an election at a low
term, have its new entries committed, and then lose to a member with a stale log whose
last term looks newer: committed entries overwritten. These tests stop and start all
three members together, twice, with a decision committed each time, and check what each
member comes back with and what the group then holds.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest
from pysyncobj.journal import FileJournal  # type: ignore[import-untyped]

from metaq.common.model import GroupControl
from metaq.nameserver.decisions import Proposal
from metaq.nameserver.raft import ControllerUnavailable, ControlRaft, Snapshot
from metaq.testing.nameserver_process import free_ports
from metaq.testing.waiting import run_async, wait_until_async

SETTLE_S = 20.0
PASSWORD = "p" * 64

# pysyncobj 0.3.17 reads the journal's meta file without closing it (journal.py, getMeta).
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Exception ignored in.*raft-journal\.bin\.meta:pytest.PytestUnraisableExceptionWarning"
)


@dataclass(frozen=True)
class Persisted:
    """What a stopped member left on disk and in memory when it stopped."""

    term: int
    voted_for: str | None
    last_log_term: int


def term_and_vote(raft: ControlRaft) -> tuple[int, str | None]:
    """The member's live ``currentTerm`` and ``votedFor`` (pysyncobj's private fields)."""
    log = raft._log
    assert log is not None
    return log._SyncObj__raftCurrentTerm, log._SyncObj__votedForNodeId


def last_log_term(directory: Path) -> int:
    """The term of the last entry in a stopped member's journal, read from the file."""
    journal = FileJournal(str(directory / "raft-journal.bin"))
    try:
        return int(journal[len(journal) - 1][2])
    finally:
        journal._destroy()


def members(tmp_path: Path, addresses: list[str]) -> list[ControlRaft]:
    return [
        ControlRaft(address, addresses, tmp_path / f"ns{i}", PASSWORD)
        for i, address in enumerate(addresses)
    ]


async def leader_of(rafts: list[ControlRaft]) -> ControlRaft:
    async def one_leads() -> bool:
        return sum(r.is_leader for r in rafts) == 1

    await wait_until_async(one_leads, SETTLE_S, "one member leads")
    return next(r for r in rafts if r.is_leader)


async def propose(rafts: list[ControlRaft], proposal: Proposal) -> GroupControl:
    """Commit ``proposal`` through whichever member leads, retrying while leadership moves."""
    outcome: list[object] = []

    async def committed() -> bool:
        leader = await leader_of(rafts)
        try:
            outcome.append(await leader.propose(proposal, 2.0))
        except ControllerUnavailable:
            return False
        return True

    await wait_until_async(committed, SETTLE_S, f"{proposal.kind} committed")
    result = outcome[-1]
    assert isinstance(result, GroupControl), result
    return result


async def all_hold(seen: list[list[Snapshot]], epoch: int) -> list[int]:
    """Wait until every member published ``epoch``; return each one's epoch."""

    def epochs() -> list[int]:
        return [s[-1]["broker-a"].epoch if s and "broker-a" in s[-1] else 0 for s in seen]

    async def agreed() -> bool:
        return epochs() == [epoch] * len(seen)

    await wait_until_async(agreed, SETTLE_S, f"every member holds epoch {epoch}")
    return epochs()


def test_members_restarted_together_keep_their_term_and_vote_and_the_decisions(
    tmp_path: Path,
) -> None:
    addresses = [f"127.0.0.1:{port}" for port in free_ports(3)]

    async def run() -> tuple[
        list[list[Persisted]], list[list[tuple[int, str | None]]], list[list[int]]
    ]:
        persisted: list[list[Persisted]] = []
        restored: list[list[tuple[int, str | None]]] = []
        epochs: list[list[int]] = []
        loop = asyncio.get_running_loop()
        expected_epoch = 1
        all_ = (0, 1, 2)
        for round_ in range(3):
            rafts = members(tmp_path, addresses)
            seen: list[list[Snapshot]] = [[] for _ in rafts]
            for raft, mine in zip(rafts, seen, strict=True):
                raft.start(lambda s, mine=mine: loop.call_soon_threadsafe(mine.append, s))
            # Read at once: before any election of this run could have moved the term.
            restored.append([term_and_vote(r) for r in rafts])
            try:
                if round_ > 0:
                    # What was committed before the restart is there again, everywhere.
                    await all_hold(seen, expected_epoch)
                if round_ == 0:
                    await propose(rafts, Proposal("bootstrap", "broker-a", 1, 0, (0,), "t"))
                # The master is round_ - 1 (0 in the first round), alone in sync: widen.
                widen = Proposal(
                    "set_isr", "broker-a", expected_epoch, max(round_ - 1, 0), all_, "t"
                )
                await propose(rafts, widen)
                if round_ > 0:
                    master = round_ % 3
                    failover = Proposal("elect", "broker-a", expected_epoch, master, all_, "t")
                    assert (await propose(rafts, failover)).epoch == expected_epoch + 1
                    expected_epoch += 1
                epochs.append(await all_hold(seen, expected_epoch))
                # Move leadership once so the journals end on a term above 1: the case
                # where a member back at term 0 would rank a stale log above a fresh one.
                leader = await leader_of(rafts)
                others = [r for r in rafts if r is not leader]
                await leader.stop()
                await leader_of(others)
                master = round_ % 3
                shrink = Proposal("set_isr", "broker-a", expected_epoch, master, (master,), "t")
                await propose(others, shrink)
                terms = [term_and_vote(r) for r in others]
            finally:
                # All at once: no member outlives the others by a tick.
                await asyncio.gather(*(r.stop() for r in rafts))
            by_address = dict(zip((r.address for r in others), terms, strict=True))
            persisted.append(
                [
                    Persisted(
                        *by_address.get(address, (0, None)),
                        last_log_term(tmp_path / f"ns{i}"),
                    )
                    for i, address in enumerate(addresses)
                ]
            )
        return persisted, restored, epochs

    persisted, restored, epochs = run_async(run(), 180.0)

    for before, after in zip(persisted[:-1], restored[1:], strict=True):
        # The members that outlived the leader end their journals on a term above 1.
        assert sum(left.last_log_term > 1 for left in before) >= 2, before
        for left, (term, voted_for) in zip(before, after, strict=True):
            # Never behind its own journal, so its log's terms stay monotonic.
            assert term >= left.last_log_term
            # Never behind the term it had: the vote it cast there is remembered, so it
            # cannot vote for a second candidate in that term.
            assert term >= left.term
            if left.term and term == left.term:
                assert voted_for == left.voted_for
    # The decisions only moved forward, and every member held each one.
    assert epochs == [[1, 1, 1], [2, 2, 2], [3, 3, 3]]
