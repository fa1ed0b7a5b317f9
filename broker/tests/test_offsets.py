"""Consumer offsets: what is stored, snapshots, reload."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from metaq.broker import held_offsets
from metaq.broker.files import write_json_atomically
from metaq.broker.held_offsets import HeldOffsets, takes_forwarded
from metaq.broker.offsets import ConsumerOffsets, OffsetSnapshotService
from metaq.common.errors import InvalidMessage
from metaq.testing.waiting import holds_for, run_async


def test_the_stored_offset_is_the_next_to_consume_and_replaces_the_last(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path)

    offsets.commit("readers", "orders", 0, 10)
    offsets.commit("readers", "orders", 0, 7)  # a reset backwards is honoured

    assert offsets.get("readers", "orders", 0) == 7
    assert offsets.get("readers", "orders", 1) is None
    assert offsets.get("others", "orders", 0) is None


def test_consumers_commits_forward_are_acknowledged_and_nothing_else_is(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path)
    acked: list[tuple[str, str, int]] = []
    offsets.on_acknowledged = lambda group, topic, n: acked.append((group, topic, n))

    offsets.commit("g", "t", 0, 10)  # the first commit says where the group starts
    offsets.commit("g", "t", 0, 14)
    offsets.commit("g", "t", 1, 3, held=True)  # a slave's: the first on this queue
    offsets.commit("g", "t", 1, 5, held=True)
    offsets.commit("g", "t", 0, 14)  # no move
    offsets.commit("g", "t", 0, 12)  # backwards
    offsets.commit("g", "t", 0, 20, journaled=True)  # the master counted it
    offsets.commit("g", "t", 1, 9, forwarded=True)  # the slave counted it
    offsets.reset("g", "t", {0: 30})  # an operator's, not an acknowledgement

    assert acked == [("g", "t", 4), ("g", "t", 2)]


def test_save_writes_only_when_something_changed(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path)
    assert not offsets.save()

    offsets.commit("g", "t", 3, 42)
    assert offsets.dirty
    assert offsets.save()
    assert not offsets.dirty
    assert not offsets.save()

    reloaded = ConsumerOffsets(tmp_path)
    assert reloaded.items() == [(("g", "t", 3), 42)]
    assert not list(tmp_path.glob("*.tmp"))


def test_a_snapshot_taken_before_more_commits_leaves_them_dirty(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path)
    offsets.commit("g", "t", 0, 1)
    snapshot = offsets.snapshot()
    offsets.commit("g", "t", 0, 2)

    offsets.write(snapshot)

    assert offsets.dirty
    assert ConsumerOffsets(tmp_path).get("g", "t", 0) == 1


def test_the_snapshot_service_writes_on_its_interval_and_at_stop(tmp_path: Path) -> None:
    async def scenario() -> None:
        offsets = ConsumerOffsets(tmp_path)
        service = OffsetSnapshotService(offsets, interval_s=0.01)
        service.start()
        offsets.commit("g", "t", 0, 5)
        deadline = asyncio.get_running_loop().time() + 5
        while offsets.dirty:
            assert asyncio.get_running_loop().time() < deadline, "no snapshot on the interval"
            await asyncio.sleep(0.005)
        assert ConsumerOffsets(tmp_path).get("g", "t", 0) == 5
        offsets.commit("g", "t", 0, 6)
        service.interval_s = 3600
        await service.stop()
        assert ConsumerOffsets(tmp_path).get("g", "t", 0) == 6

    asyncio.run(scenario())


@pytest.mark.parametrize("group", ["", "has space", "x" * 256])
def test_illegal_group_names_are_refused(tmp_path: Path, group: str) -> None:
    with pytest.raises(InvalidMessage, match="illegal consumer group"):
        ConsumerOffsets(tmp_path).commit(group, "t", 0, 1)


def test_a_damaged_file_names_itself(tmp_path: Path) -> None:
    (tmp_path / "consumer_offsets.json").write_text('{"format": 1, "offsets": {"g": 3}}')

    with pytest.raises(ValueError, match=r"consumer_offsets\.json is damaged"):
        ConsumerOffsets(tmp_path)


def test_consumed_floor_is_the_lowest_commit_of_every_group_known_for_the_topic(
    tmp_path: Path,
) -> None:
    offsets = ConsumerOffsets(tmp_path)
    offsets.commit("fast", "orders", 0, 90)
    offsets.commit("slow", "orders", 0, 40)
    offsets.commit("fast", "orders", 1, 70)  # "slow" never committed queue 1: it read none
    offsets.commit("fast", "audit", 0, 5)

    floors = offsets.consumed_floors()

    assert floors == {("orders", 0): 40, ("orders", 1): 0, ("audit", 0): 5}
    assert ("payments", 0) not in floors  # no group known: nothing counts as consumed


def test_the_saved_journal_offset_follows_the_snapshot_on_disk(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path)
    offsets.commit("g", "t", 0, 1)
    offsets.journal_offset = 12

    assert offsets.saved_journal_offset == 0
    offsets.save()
    assert offsets.saved_journal_offset == 12
    assert ConsumerOffsets(tmp_path).saved_journal_offset == 12


def test_a_commit_held_at_a_slave_is_not_overwritten_by_the_masters_journal(
    tmp_path: Path,
) -> None:
    offsets = ConsumerOffsets(tmp_path)
    offsets.commit("g", "t", 0, 10, journaled=True)  # from the master

    offsets.commit("g", "t", 0, 50, held=True)  # a consumer at this slave
    offsets.commit("g", "t", 0, 40, journaled=True)  # an older record arriving late

    assert offsets.get("g", "t", 0) == 50
    assert [(key, h.offset, h.expected) for key, h in offsets.held.items()] == [
        (("g", "t", 0), 50, 10)
    ]
    assert offsets.changes() == [], "a slave journals nothing"


def test_held_commits_survive_a_restart(tmp_path: Path) -> None:
    async def hold() -> None:
        offsets = ConsumerOffsets(tmp_path)
        offsets.commit("g", "t", 0, 10, journaled=True)
        offsets.commit("g", "t", 0, 50, held=True)
        offsets.commit("g", "t", 0, 60, held=True)
        await offsets.held.persist()

    asyncio.run(hold())

    reloaded = ConsumerOffsets(tmp_path)
    assert reloaded.get("g", "t", 0) == 60
    assert [(h.offset, h.expected) for _, h in reloaded.held.items()] == [(60, 10)]


def test_the_masters_answer_replaces_a_held_commit_unless_committed_again_since(
    tmp_path: Path,
) -> None:
    offsets = ConsumerOffsets(tmp_path)
    offsets.commit("g", "t", 0, 50, held=True)
    offsets.commit("g", "t", 1, 50, held=True)
    sent = [(key, h.offset) for key, h in offsets.held.items()]
    offsets.commit("g", "t", 1, 70, held=True)  # while the forward was on its way

    offsets.forwarded(sent, {("g", "t", 0): 80, ("g", "t", 1): 80})

    assert offsets.get("g", "t", 0) == 80, "the master had a newer commit: it stands"
    assert offsets.get("g", "t", 1) == 70
    assert [key for key, _ in offsets.held.items()] == [("g", "t", 1)]


def test_a_demoted_master_holds_the_commits_it_had_not_journaled(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path)
    offsets.commit("g", "t", 0, 5)

    offsets.hold_unjournaled()

    assert offsets.changes() == []
    assert [(key, h.offset, h.expected) for key, h in offsets.held.items()] == [
        (("g", "t", 0), 5, None)
    ]


@pytest.mark.parametrize(
    ("current", "expected", "forwarded", "taken"),
    [
        (None, None, 5, True),  # the master never had an offset for the queue
        (10, 10, 50, True),  # nobody committed at the master since: taken
        (10, 10, 3, True),  # ... even backwards (a reset made at the slave)
        (80, 10, 50, False),  # a consumer moved on at the master: its offset stands
        (30, 10, 50, True),  # the master moved, but the slave's is further on
        (10, None, 50, True),  # a demoted master's unjournaled commit, further on
        (60, None, 50, False),
    ],
)
def test_a_master_takes_a_forwarded_commit_unless_a_consumer_moved_on_there(
    current: int | None, expected: int | None, forwarded: int, taken: bool
) -> None:
    assert takes_forwarded(current, expected, forwarded) is taken


def test_consumers_bring_no_group_past_the_limit_but_the_journal_and_slaves_do(
    tmp_path: Path,
) -> None:
    offsets = ConsumerOffsets(tmp_path, max_groups=2)
    offsets.commit("a", "t", 0, 1)
    offsets.commit("b", "t", 0, 1)
    offsets.commit("a", "t", 1, 1)  # another queue of a known group is fine

    with pytest.raises(InvalidMessage, match="limit \\(max_consumer_groups\\)"):
        offsets.commit("c", "t", 0, 1)
    with pytest.raises(InvalidMessage, match="max_consumer_groups"):
        offsets.commit("c", "t", 0, 1, held=True)
    offsets.commit("c", "t", 0, 1, journaled=True)  # the master already took it
    offsets.commit("d", "t", 0, 1, forwarded=True)  # a slave answered its consumer OK

    assert offsets.groups() == ["a", "b", "c", "d"]
    assert (("d", "t", 0), 1) in offsets.changes(), "a forwarded commit is journaled here"


def test_a_write_of_the_held_commits_never_runs_beside_one_still_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A caller cancelled while its write runs in a worker thread (a shutdown, a demotion)
    # leaves the thread writing; the next write must wait for it, and the older state
    # must not land over the newer one.
    entered = threading.Event()
    release = threading.Event()
    writing: list[int] = []

    def slow_first_write(path: Path, data: Any) -> None:
        writing.append(1)
        try:
            assert len(writing) == 1, "two writers of held_offsets.json at once"
            if not entered.is_set():
                entered.set()
                release.wait(10)
            write_json_atomically(path, data)
        finally:
            writing.pop()

    monkeypatch.setattr(held_offsets, "write_json_atomically", slow_first_write)

    async def scenario() -> None:
        held = HeldOffsets(tmp_path)
        held.hold(("g", "t", 0), 10, None)
        first = asyncio.create_task(held.persist())
        await asyncio.to_thread(entered.wait, 10)
        first.cancel()
        held.hold(("g", "t", 0), 20, None)
        second = asyncio.create_task(held.persist())
        try:
            await asyncio.to_thread(
                holds_for,
                lambda: not second.done(),
                0.5,
                "the second write waits for the first still running",
            )
        finally:
            release.set()
        await second
        assert not held.dirty

    asyncio.run(scenario())

    assert [(k, h.offset) for k, h in HeldOffsets(tmp_path).items()] == [(("g", "t", 0), 20)]
    assert not list(tmp_path.glob("*.tmp"))


def test_a_temporary_file_a_crash_left_is_removed_at_start(tmp_path: Path) -> None:
    write_json_atomically(tmp_path / "held_offsets.json", {"format": 1, "held": []})
    (tmp_path / "held_offsets.json.x1y2.tmp").write_text("{half")

    assert len(HeldOffsets(tmp_path)) == 0
    assert not list(tmp_path.glob("*.tmp"))


def test_a_damaged_held_offsets_file_says_what_moving_it_aside_loses(tmp_path: Path) -> None:
    (tmp_path / "held_offsets.json").write_text('{"format": 1, "held": [["g", "t"]]}')

    with pytest.raises(ValueError, match=r"held_offsets\.json is damaged.*move it aside"):
        HeldOffsets(tmp_path)


def test_a_table_slow_to_write_is_written_at_most_a_tenth_of_the_time(tmp_path: Path) -> None:
    now = [100.0]

    class SlowToWrite(ConsumerOffsets):
        writes = 0

        def write(self, snapshot: Any) -> None:
            super().write(snapshot)
            SlowToWrite.writes += 1
            now[0] += 1.0  # a write that takes a second: a huge table

    async def scenario() -> None:
        offsets = SlowToWrite(tmp_path)
        service = OffsetSnapshotService(offsets, 0.1, clock=lambda: now[0])
        offsets.commit("g", "t", 0, 1)
        await service.run_once()
        offsets.commit("g", "t", 0, 2)
        now[0] += 5.0  # five seconds on: within ten times the last write's second
        await service.run_once()
        assert SlowToWrite.writes == 1
        now[0] += 5.0
        await service.run_once()
        assert SlowToWrite.writes == 2

    run_async(scenario())
