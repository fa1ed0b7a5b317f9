"""The topics and offsets journal on a real store: records under the limit, replay, one
record per topic change, a whole topic table in parts that a slave adopts together."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from metaq.broker.journal import OFFSETS_JOURNAL, TOPICS_JOURNAL, Journal
from metaq.broker.offsets import ConsumerOffsets
from metaq.broker.store import MessageStore, StoreConfig
from metaq.broker.store.commitlog import Appended
from metaq.broker.topics import TopicTable
from metaq.common.errors import StoreUnavailable
from metaq.common.model import TopicConfig
from metaq.common.record import decode

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


# --- a whole table over the record limit ----------------------------------------------

_LIMIT = 8 * 1024
"""Records of 8 KiB: a few hundred topics take several parts."""


def _many_topics(data_dir: Path, count: int) -> TopicTable:
    data_dir.mkdir(parents=True, exist_ok=True)
    topics = TopicTable(data_dir)
    for n in range(count):
        topics.create(f"topic-{n:04d}-{'x' * 40}")
    return topics


def _written(store: MessageStore, wait_until: Waiter, appended: Appended | None) -> list[bytes]:
    """The topics journal records ``appended`` wrote, once dispatched."""
    assert appended is not None
    first, end = appended.queue_offsets[0], appended.queue_offsets[-1] + 1
    wait_until(lambda: store.max_offset(TOPICS_JOURNAL, 0) >= end, 30, "journal not dispatched")
    records: list[bytes] = []
    while first + len(records) < end:
        result = store.get(TOPICS_JOURNAL, 0, first + len(records), max_messages=end - first)
        try:
            records.extend(bytes(record) for record in result.records)
        finally:
            result.release()
    return records


def _deliver(store: MessageStore, wait_until: Waiter, records: list[bytes]) -> None:
    """Put ``records`` in the slave's log (replication brings them in this order) and wait
    until they are dispatched."""
    end = store.max_offset(TOPICS_JOURNAL, 0) + len(records)
    store.append(records)
    wait_until(lambda: store.max_offset(TOPICS_JOURNAL, 0) == end, 30, "journal not dispatched")


def _slave(store: MessageStore, data_dir: Path) -> tuple[Journal, TopicTable]:
    """A slave holding an older table of its own: two topics, one the master no longer has."""
    journal, topics = _topics_journal(store, data_dir, master=False)
    topics.create("topic-0000-" + "x" * 40)
    topics.create("stray")
    return journal, topics


def _small_record_master(
    open_store: Callable[..., MessageStore], tmp_path: Path
) -> tuple[MessageStore, TopicTable, Journal]:
    """A master of 300 topics whose store takes records of at most ``_LIMIT`` bytes."""
    store = open_store(max_message_bytes=_LIMIT)
    master = _many_topics(tmp_path / "master", 300)
    return store, master, Journal(store, master, ConsumerOffsets(tmp_path / "master"), lambda: True)


def _small_record_slave(
    open_store: Callable[..., MessageStore],
    store_config: Callable[..., StoreConfig],
    tmp_path: Path,
) -> tuple[MessageStore, Journal, TopicTable]:
    """That master's slave (see ``_slave``), on a store with the same record limit."""
    store = open_store(store_config(data_dir=tmp_path / "slave", max_message_bytes=_LIMIT))
    return (store, *_slave(store, tmp_path / "replica"))


def _names(topics: TopicTable) -> list[str]:
    return [t.name for t in topics.all()]


def test_a_table_over_the_record_limit_is_written_in_parts_a_slave_adopts_with_the_last(
    open_store: Callable[..., MessageStore],
    store_config: Callable[..., StoreConfig],
    tmp_path: Path,
    wait_until: Waiter,
) -> None:
    store, master, journal = _small_record_master(open_store, tmp_path)

    parts = _written(store, wait_until, journal.write_topics())
    assert len(parts) >= 3, "300 topics of about 90 B cannot fit one 8 KiB record"
    assert all(len(decode(record).body) <= _LIMIT for record in parts)
    assert master.journal_offset == len(parts) - 1, "the table is as of the last part"

    slave_store, replica, copied = _small_record_slave(open_store, store_config, tmp_path)
    before = copied.all()
    _deliver(slave_store, wait_until, parts[:-1])
    assert replica.apply() == len(parts) - 1
    assert copied.all() == before, "a slave must not take the first parts for the whole table"
    assert replica.consumed_floors()[(TOPICS_JOURNAL, 0)] == 0, "the parts are kept on disk"
    shutil.copytree(tmp_path / "replica", tmp_path / "restarted")  # a crash here
    assert TopicTable(tmp_path / "restarted").all() == before

    _deliver(slave_store, wait_until, parts[-1:])
    assert replica.apply() == 1
    assert copied.all() == master.all(), "the last part brings the whole table, stray gone"
    assert copied.journal_offset == len(parts) - 1
    assert TopicTable(tmp_path / "replica").all() == master.all()
    # Restarted after the first parts, a slave reads the write again from its first part.
    restarted, again = _topics_journal(slave_store, tmp_path / "restarted", master=False)
    assert restarted.apply() == len(parts)
    assert again.all() == master.all()


def test_a_hundred_thousand_topics_are_a_whole_table_a_slave_applies(
    open_store: Callable[..., MessageStore], tmp_path: Path, wait_until: Waiter
) -> None:
    limit = 4 << 20  # the default record limit
    store = open_store(max_message_bytes=limit, commitlog_segment_bytes=32 << 20)
    (tmp_path / "master").mkdir()
    master = TopicTable(tmp_path / "master")
    master.replace_all([TopicConfig(f"bench-topic-{n:06d}", 8, 8) for n in range(100_000)], -1)
    journal = Journal(store, master, ConsumerOffsets(tmp_path / "master"), lambda: True)

    records = _written(store, wait_until, journal.write_topics())
    assert sum(len(decode(r).body) for r in records) > limit, "more than one record holds"
    assert all(len(decode(r).body) <= limit // 4 for r in records), "each well under it"

    replica, copied = _topics_journal(store, tmp_path / "replica", master=False)
    assert replica.apply() == len(records)
    assert copied.all() == master.all()


def test_a_split_write_cut_short_leaves_the_slave_on_the_next_whole_table(
    open_store: Callable[..., MessageStore],
    store_config: Callable[..., StoreConfig],
    tmp_path: Path,
    wait_until: Waiter,
) -> None:
    store, master, journal = _small_record_master(open_store, tmp_path)
    cut = _written(store, wait_until, journal.write_topics())
    for n in range(0, 300, 2):
        master.delete(f"topic-{n:04d}-{'x' * 40}")
    master.create("later")
    later = _written(store, wait_until, journal.write_topics())
    assert len(cut) >= 3 and len(later) >= 2

    slave_store, replica, copied = _small_record_slave(open_store, store_config, tmp_path)
    before = copied.all()
    # The first write's last part never came (its master died); a new write followed.
    _deliver(slave_store, wait_until, cut[:-1] + later[:-1])
    replica.apply()
    assert copied.all() == before
    _deliver(slave_store, wait_until, later[-1:])
    replica.apply()
    assert copied.all() == master.all()
    assert "later" in _names(copied) and "topic-0000-" + "x" * 40 not in _names(copied)


def test_parts_without_their_first_are_skipped_until_a_whole_table_comes(
    open_store: Callable[..., MessageStore],
    store_config: Callable[..., StoreConfig],
    tmp_path: Path,
    wait_until: Waiter,
) -> None:
    store, master, journal = _small_record_master(open_store, tmp_path)
    parts = _written(store, wait_until, journal.write_topics())
    for n in range(1, 300):
        master.delete(f"topic-{n:04d}-{'x' * 40}")
    master.create("small")
    whole = _written(store, wait_until, journal.write_topics())
    assert len(whole) == 1 and "topics" in json.loads(decode(whole[0]).body), (
        "a table that fits one record keeps the one-record form"
    )

    slave_store, replica, copied = _small_record_slave(open_store, store_config, tmp_path)
    before = copied.all()
    # Retention took the first part before this slave started reading.
    _deliver(slave_store, wait_until, parts[1:])
    assert replica.apply() == len(parts) - 1
    assert copied.all() == before
    assert replica.consumed_floors()[(TOPICS_JOURNAL, 0)] == len(parts) - 1
    _deliver(slave_store, wait_until, whole)
    replica.apply()
    assert _names(copied) == ["small", "topic-0000-" + "x" * 40]


def test_a_change_between_parts_is_applied_at_once_and_kept_by_the_whole_table(
    open_store: Callable[..., MessageStore],
    store_config: Callable[..., StoreConfig],
    tmp_path: Path,
    wait_until: Waiter,
) -> None:
    store, master, journal = _small_record_master(open_store, tmp_path)
    parts = _written(store, wait_until, journal.write_topics())
    master.create("between")
    created = _written(store, wait_until, journal.topic_changed("between"))
    gone = "topic-0299-" + "x" * 40  # in the last part
    master.delete(gone)
    deleted = _written(store, wait_until, journal.topic_changed(gone))

    slave_store, replica, copied = _small_record_slave(open_store, store_config, tmp_path)
    _deliver(slave_store, wait_until, parts[:1] + created + deleted + parts[1:])
    replica.apply()
    assert copied.all() == master.all()
    assert "between" in _names(copied) and gone not in _names(copied)
