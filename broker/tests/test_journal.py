"""The topics and offsets journal on a real store: records under the limit, replay, one
record per topic change."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from metaq.broker.journal import OFFSETS_JOURNAL, TOPICS_JOURNAL, Journal
from metaq.broker.offsets import ConsumerOffsets
from metaq.broker.store import MessageStore
from metaq.broker.store.commitlog import Appended
from metaq.broker.topics import TopicTable
from metaq.common.errors import StoreUnavailable
from metaq.common.model import TopicConfig

Waiter = Callable[[Callable[[], bool], float, str], None]


def _dispatched(store: MessageStore, wait_until: Waiter, appended: Appended | None) -> int:
    """Wait until the journal records appended are in their queue; return how many there are."""
    assert appended is not None
    end = appended.queue_offsets[-1] + 1
    wait_until(lambda: store.max_offset(OFFSETS_JOURNAL, 0) == end, 30, "journal not dispatched")
    return end


def _journal(
    store: MessageStore, data_dir: Path, *, master: bool = True
) -> tuple[Journal, ConsumerOffsets]:
    data_dir.mkdir(parents=True, exist_ok=True)
    offsets = ConsumerOffsets(data_dir)
    return Journal(store, TopicTable(data_dir), offsets, lambda: master), offsets


def test_a_hundred_thousand_groups_are_journaled_in_records_under_the_limit(
    open_store: Callable[..., MessageStore], tmp_path: Path, wait_until: Waiter
) -> None:
    # 1 MiB records, 4 MiB segments: the whole table is several times one record.
    store = open_store(max_message_bytes=1 << 20, commitlog_segment_bytes=4 << 20)
    journal, offsets = _journal(store, tmp_path / "master")
    groups = 100_000
    for n in range(groups):
        offsets.commit(f"group-{n:06d}-{'x' * 40}", "orders", n % 8, n)

    records = _dispatched(store, wait_until, journal.write_offsets(full=True))
    assert records > 4, "a table this size cannot fit one record"
    assert offsets.changes() == [], "every commit counts as journaled"
    # Incremental writes after the full one split the same way.
    for n in range(groups):
        offsets.commit(f"group-{n:06d}-{'x' * 40}", "orders", n % 8, n + 1)
    assert _dispatched(store, wait_until, journal.write_offsets()) >= 2 * records

    # A slave (or a restart) replaying the journal ends with every group's newest offset.
    replica, copied = _journal(store, tmp_path / "replica", master=False)
    assert replica.apply() == store.max_offset(OFFSETS_JOURNAL, 0)
    assert len(copied.items()) == groups
    assert copied.get(f"group-{groups - 1:06d}-{'x' * 40}", "orders", (groups - 1) % 8) == groups


def test_a_chunk_of_long_names_is_halved_until_it_fits(
    open_store: Callable[..., MessageStore], tmp_path: Path, wait_until: Waiter
) -> None:
    store = open_store(max_message_bytes=16 * 1024)
    journal, offsets = _journal(store, tmp_path / "master")
    for n in range(200):
        offsets.commit(f"{n:03d}{'g' * 250}", "t" * 120, 0, n)

    _dispatched(store, wait_until, journal.write_offsets(full=True))

    replica, copied = _journal(store, tmp_path / "replica", master=False)
    assert replica.apply() > 1
    assert copied.items() == offsets.items()


def test_a_failed_journal_write_leaves_the_commits_for_the_next_tick(
    open_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    disk = {"used": 0.0}
    store = open_store(disk_usage=lambda _path: disk["used"])
    journal, offsets = _journal(store, tmp_path / "master")
    offsets.commit("g", "t", 0, 5)
    disk["used"] = 0.99
    store.guard.refresh_disk()

    with pytest.raises(StoreUnavailable):
        journal.write_offsets()
    assert offsets.changes() == [(("g", "t", 0), 5)]

    disk["used"] = 0.0
    store.guard.refresh_disk()
    assert journal.write_offsets() is not None
    assert offsets.changes() == []


def test_a_new_term_whose_full_write_fails_retries_it_on_the_next_tick(
    open_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    disk = {"used": 0.99}
    store = open_store(disk_usage=lambda _path: disk["used"])
    store.guard.refresh_disk()
    journal, offsets = _journal(store, tmp_path / "master")
    offsets.commit("g", "t", 0, 5)

    journal.write_all()  # what a promotion runs: it must not raise
    assert offsets.changes(full=False) == [(("g", "t", 0), 5)]

    disk["used"] = 0.0
    store.guard.refresh_disk()
    journal.tick()
    assert offsets.changes() == []
    assert journal.write_offsets() is None


def test_a_journal_failing_every_tick_is_reported_once_then_when_it_works_again(
    open_store: Callable[..., MessageStore], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = {"used": 0.99}
    store = open_store(disk_usage=lambda _path: disk["used"])
    store.guard.refresh_disk()
    journal, offsets = _journal(store, tmp_path / "master")
    offsets.commit("g", "t", 0, 5)

    with caplog.at_level(logging.INFO, "metaq.broker.journal"):
        for _ in range(50):  # five seconds of ticks on a full disk
            journal.tick()
        disk["used"] = 0.0
        store.guard.refresh_disk()
        journal.tick()

    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("journaling the topics and offsets failed: ")
    assert lines[1].startswith("journaling the topics and offsets failed no longer")


def test_a_new_master_not_writable_yet_writes_the_whole_state_once_it_is(
    open_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    store = open_store()
    writable = {"now": False}
    data_dir = tmp_path / "master"
    data_dir.mkdir()
    offsets = ConsumerOffsets(data_dir)
    journal = Journal(store, TopicTable(data_dir), offsets, lambda: writable["now"])
    offsets.commit("g", "t", 0, 5, held=True)  # taken while it was a slave

    journal.write_all()  # promoted, but the controller's lease is not there yet
    assert len(offsets.held) == 1

    writable["now"] = True
    journal.tick()
    assert len(offsets.held) == 0, "the whole table, held commits included, is journaled"
    assert store.commitlog.write_offset > 0


def test_a_deleted_group_is_forgotten_by_a_slave_replaying_the_journal(
    open_store: Callable[..., MessageStore], tmp_path: Path, wait_until: Waiter
) -> None:
    store = open_store()
    journal, offsets = _journal(store, tmp_path / "master")
    offsets.commit("doomed", "orders", 0, 5)
    offsets.commit("kept", "orders", 0, 7)
    journal.write_offsets()
    assert offsets.delete_group("doomed") == 1
    _dispatched(store, wait_until, journal.write_deleted_group("doomed"))

    replica, copied = _journal(store, tmp_path / "replica", master=False)
    replica.apply()
    assert copied.items() == [(("kept", "orders", 0), 7)]
    assert copied.groups() == ["kept"]


def _topics_journal(
    store: MessageStore, data_dir: Path, *, master: bool
) -> tuple[Journal, TopicTable]:
    data_dir.mkdir(parents=True, exist_ok=True)
    topics = TopicTable(data_dir)
    journal = Journal(store, topics, ConsumerOffsets(data_dir), lambda: master)
    topics.listeners.append(journal.topic_changed)
    return journal, topics


def test_each_topic_change_is_one_record_of_that_topic_and_a_slave_applies_each(
    open_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    store = open_store()
    _, topics = _topics_journal(store, tmp_path / "master", master=True)
    sizes = []
    for n in range(300):
        topics.create(f"topic-{n:03d}")
        sizes.append(store.commitlog.write_offset)
    topics.update("topic-007", write_queues=2)
    topics.delete("topic-008")
    # The 300th create appends what the 2nd did (the whole table was 300 times more).
    first, last = sizes[1] - sizes[0], sizes[-1] - sizes[-2]
    assert abs(last - first) <= 8, (first, last)
    assert store.max_offset(TOPICS_JOURNAL, 0) == 302

    replica, copied = _topics_journal(store, tmp_path / "replica", master=False)
    assert replica.apply() == 302
    assert copied.all() == topics.all() and copied.journal_offset == 301
    assert copied.get("topic-007") == TopicConfig("topic-007", 8, 2)
    assert copied.get("topic-008") is None
    # Restarted, the slave has it all from its own files and applies nothing twice.
    again = TopicTable(tmp_path / "replica")
    assert again.all() == topics.all() and again.journal_offset == 301
    assert Journal(store, again, ConsumerOffsets(tmp_path / "replica"), lambda: False).apply() == 0


def test_the_whole_table_a_master_writes_replaces_what_a_slave_held(
    open_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    store = open_store()
    journal, topics = _topics_journal(store, tmp_path / "master", master=True)
    topics.create("orders")
    replica, copied = _topics_journal(store, tmp_path / "replica", master=False)
    replica.apply()
    copied.create("stray")  # say, left from when this broker was a master the group left

    journal.write_all()  # a new term: the whole state
    topics.create("audit")
    assert replica.apply() == 2
    assert [t.name for t in copied.all()] == ["audit", "orders"]
    assert [t.name for t in TopicTable(tmp_path / "replica").all()] == ["audit", "orders"]
