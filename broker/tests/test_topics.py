"""The topic table: permissions, write-wipe, auto-create, persistence (snapshot and change
log), and the changes the registrar sends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from metaq.broker.topics import NoPermission, TopicTable, UnknownTopic
from metaq.common.errors import ErrorCode, InvalidMessage
from metaq.common.model import Permission, TopicChanges, TopicConfig


def test_created_topics_survive_a_reload(tmp_path: Path) -> None:
    table = TopicTable(tmp_path)
    table.create("orders", read_queues=4, write_queues=2, permission=Permission.READ_WRITE)
    table.create("audit", permission=Permission.WRITE_WIPE, ordered=True)

    again = TopicTable(tmp_path)

    assert again.get("orders") == TopicConfig("orders", 4, 2, Permission.READ_WRITE)
    assert again.get("audit") == TopicConfig("audit", 8, 8, Permission.WRITE_WIPE, True)
    assert again.version == table.version == 2
    assert not (tmp_path / "topics.json.tmp").exists()


def test_update_and_delete_are_persisted_and_bump_the_version(tmp_path: Path) -> None:
    table = TopicTable(tmp_path)
    changes: list[int] = []
    table.listeners.append(lambda _name: changes.append(table.version))
    table.create("orders")

    table.update("orders", write_queues=16)
    table.update("orders", write_queues=16)  # no change, no write
    assert table.delete("orders")
    assert not table.delete("orders")

    assert changes == [1, 2, 3]
    assert TopicTable(tmp_path).get("orders") is None
    with pytest.raises(UnknownTopic):
        table.update("orders", permission=Permission.READ_ONLY)


@pytest.mark.parametrize(
    ("perm", "can_send", "can_pull", "retriable"),
    [
        (Permission.READ_WRITE, True, True, None),
        (Permission.READ_ONLY, False, True, False),
        (Permission.WRITE_ONLY, True, False, False),
        (Permission.WRITE_WIPE, False, True, True),
    ],
)
def test_permissions_decide_sends_and_pulls(
    tmp_path: Path, perm: Permission, can_send: bool, can_pull: bool, retriable: bool | None
) -> None:
    table = TopicTable(tmp_path)
    table.create("t", permission=perm)

    for allowed, operation in ((can_send, table.resolve_send), (can_pull, table.resolve_pull)):
        if allowed:
            assert operation("t", 0).name == "t"
        else:
            with pytest.raises(NoPermission) as caught:
                operation("t", 0)
            assert caught.value.code is ErrorCode.NO_PERMISSION
            assert caught.value.retriable is retriable


def test_write_wipe_tells_producers_to_go_elsewhere(tmp_path: Path) -> None:
    table = TopicTable(tmp_path)
    table.create("t", permission=Permission.WRITE_WIPE)

    with pytest.raises(NoPermission, match=r"write-wiped .* send to another broker"):
        table.resolve_send("t", 0)


def test_queue_ids_are_checked_against_write_and_read_counts(tmp_path: Path) -> None:
    table = TopicTable(tmp_path)
    table.create("t", read_queues=2, write_queues=4)

    assert table.resolve_send("t", 3)
    with pytest.raises(InvalidMessage, match="4 write queues"):
        table.resolve_send("t", 4)
    with pytest.raises(InvalidMessage, match="2 read queues"):
        table.resolve_pull("t", 2)


def test_unknown_topics_are_refused_unless_auto_create_is_on(tmp_path: Path) -> None:
    strict = TopicTable(tmp_path / "strict")
    with pytest.raises(UnknownTopic, match="auto_create_topics is off"):
        strict.resolve_send("fresh", 0)

    lenient = TopicTable(tmp_path / "lenient", auto_create=True, default_queue_count=3)
    lenient.path.parent.mkdir()
    config = lenient.resolve_send("fresh", 2)
    assert config == TopicConfig("fresh", 3, 3)
    # Resolving alone creates nothing: the send handler puts it once the messages are stored.
    assert lenient.get("fresh") is None
    with pytest.raises(InvalidMessage, match="3 write queues"):
        lenient.resolve_send("fresh", 3)
    lenient.put(config)
    assert TopicTable(tmp_path / "lenient").get("fresh") == config


@pytest.mark.parametrize("name", ["", "a/b", "with space", "x" * 128, "ünï"])
def test_illegal_names_are_rejected(tmp_path: Path, name: str) -> None:
    table = TopicTable(tmp_path, auto_create=True)

    with pytest.raises(InvalidMessage, match="illegal topic name"):
        table.create(name)
    with pytest.raises(InvalidMessage, match="illegal topic name"):
        table.resolve_send(name, 0)
    with pytest.raises(InvalidMessage, match="illegal topic name"):
        table.resolve_pull(name, 0)


@pytest.mark.parametrize("queues", [0, 65537])
def test_queue_counts_out_of_range_are_rejected(tmp_path: Path, queues: int) -> None:
    table = TopicTable(tmp_path)

    with pytest.raises(InvalidMessage, match="read_queues must be 1-65536"):
        table.put(TopicConfig("t", queues, 1))
    assert table.get("t") is None


def test_a_damaged_file_stops_the_start_with_its_name(tmp_path: Path) -> None:
    (tmp_path / "topics.json").write_text('{"format": 1, "version": 1, "topics": {"t": {}}}')

    with pytest.raises(ValueError, match=r"topics\.json is damaged"):
        TopicTable(tmp_path)
    (tmp_path / "topics.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"topics\.json is not valid JSON"):
        TopicTable(tmp_path)


def test_the_file_is_readable_json(tmp_path: Path) -> None:
    TopicTable(tmp_path).create("orders", read_queues=2, write_queues=2)

    data = json.loads((tmp_path / "topics.json").read_text())

    assert data["topics"]["orders"] == {
        "read_queues": 2,
        "write_queues": 2,
        "perm": "read-write",
        "ordered": False,
    }


def test_a_table_written_with_the_old_permission_spellings_loads_and_is_kept(
    tmp_path: Path,
) -> None:
    written = {
        "format": 1,
        "version": 4,
        "journal_offset": 7,
        "topics": {
            "r": {"read_queues": 1, "write_queues": 1, "perm": "read", "ordered": False},
            "w": {"read_queues": 2, "write_queues": 2, "perm": "write", "ordered": False},
            "rw": {"read_queues": 3, "write_queues": 3, "perm": "read-write", "ordered": True},
            "wipe": {"read_queues": 4, "write_queues": 4, "perm": "write-wipe", "ordered": False},
        },
    }
    (tmp_path / "topics.json").write_text(json.dumps(written))

    table = TopicTable(tmp_path)
    assert [(t.name, t.permission) for t in table.all()] == [
        ("r", Permission.READ_ONLY),
        ("rw", Permission.READ_WRITE),
        ("w", Permission.WRITE_ONLY),
        ("wipe", Permission.WRITE_WIPE),
    ]
    table.journaled(7)  # rewrites the file as it is
    assert json.loads((tmp_path / "topics.json").read_text())["topics"] == written["topics"]


def test_a_topic_nobody_may_use_is_refused(tmp_path: Path) -> None:
    table = TopicTable(tmp_path)

    with pytest.raises(InvalidMessage, match="permission must be one of read-write, read, write"):
        table.create("t", permission=Permission.NONE)
    assert table.get("t") is None


def _log_lines(data_dir: Path) -> list[bytes]:
    return (data_dir / "topics.log").read_bytes().splitlines(keepends=True)


def test_a_change_appends_one_record_whatever_the_table_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rewriting the whole table made a create at 10,000 topics take 150 ms.
    import metaq.broker.topics as topics_module

    snapshots: list[int] = []
    real = topics_module.write_json_atomically

    def counted(path: Path, data: object) -> None:
        snapshots.append(1)
        real(path, data)

    monkeypatch.setattr(topics_module, "write_json_atomically", counted)
    table = TopicTable(tmp_path)
    table.listeners.append(lambda _name: table.journaled(table.journal_offset + 1))
    for n in range(1000):
        table.create(f"t{n:04d}")
    assert len(snapshots) == 1, "only the first change of a table without a log"
    second, last = (len(line) for line in _log_lines(tmp_path)[2:1000:997])
    assert abs(last - second) <= 8, "the 1,000th topic's record weighs what the 2nd's does"

    table.delete("t0005")
    again = TopicTable(tmp_path)
    assert again.all() == table.all() and len(again.all()) == 999
    assert (
        (again.version, again.journal_offset)
        == (table.version, table.journal_offset)
        == (
            1001,
            1000,
        )
    )


def test_the_log_becomes_a_snapshot_once_longer_than_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("metaq.broker.topics.COMPACT_AFTER", 8)
    table = TopicTable(tmp_path)
    for n in range(30):
        table.create("flip", write_queues=1 + n % 2)  # one topic, changed again and again
    table.create("other")

    assert len(_log_lines(tmp_path)) <= 1 + 8 + 1, "the header and at most 9 records"
    snapshot = json.loads((tmp_path / "topics.json").read_text())
    assert snapshot["snapshot_id"] > 1 and snapshot["version"] > 8
    again = TopicTable(tmp_path)
    assert again.all() == table.all() and again.version == table.version == 31


def test_a_torn_last_record_is_cut_and_the_log_goes_on_after_it(tmp_path: Path) -> None:
    table = TopicTable(tmp_path)
    table.create("kept")
    table.create("also-kept")
    log_path = tmp_path / "topics.log"
    whole = log_path.read_bytes()
    last = _log_lines(tmp_path)[-1]
    log_path.write_bytes(whole + last[: len(last) // 2])  # a crash in the middle of an append

    again = TopicTable(tmp_path)
    assert [t.name for t in again.all()] == ["also-kept", "kept"]
    assert log_path.read_bytes() == whole, "the torn part is cut"
    again.create("after-the-crash")  # appended where the torn part was, not after it
    assert [t.name for t in TopicTable(tmp_path).all()] == ["after-the-crash", "also-kept", "kept"]


def test_a_bad_record_with_whole_ones_after_it_is_damage_not_a_crash(tmp_path: Path) -> None:
    table = TopicTable(tmp_path)
    for name in ("a", "b", "c"):
        table.create(name)
    lines = _log_lines(tmp_path)
    lines[1] = lines[1].replace(b'"b"', b'"x"')  # its CRC no longer matches; c's follows
    (tmp_path / "topics.log").write_bytes(b"".join(lines))

    with pytest.raises(ValueError, match=r"topics\.log is damaged: the line at byte"):
        TopicTable(tmp_path)


def test_a_log_older_than_the_snapshot_is_ignored(tmp_path: Path) -> None:
    table = TopicTable(tmp_path)
    table.create("a")
    table.create("b")
    stale_log = (tmp_path / "topics.log").read_bytes()
    table.delete("a")
    table.replace_all([TopicConfig("c", 1, 1)], journal_offset=9)  # a new snapshot
    # A crash after the new snapshot, before the log started again, leaves the old log.
    (tmp_path / "topics.log").write_bytes(stale_log)

    again = TopicTable(tmp_path)
    assert [t.name for t in again.all()] == ["c"] and again.journal_offset == 9


def test_a_table_file_of_an_older_version_is_read_and_kept_on_the_first_change(
    tmp_path: Path,
) -> None:
    written = {"format": 1, "version": 3, "journal_offset": 5, "topics": {"old": {
        "read_queues": 2, "write_queues": 2, "perm": "read-write", "ordered": False}}}  # fmt: skip
    (tmp_path / "topics.json").write_text(json.dumps(written))

    table = TopicTable(tmp_path)
    assert table.get("old") == TopicConfig("old", 2, 2) and table.version == 3
    table.create("new")
    again = TopicTable(tmp_path)
    assert [t.name for t in again.all()] == ["new", "old"] and again.version == 4


def test_changes_since_a_version_name_what_was_put_and_deleted(tmp_path: Path) -> None:
    table = TopicTable(tmp_path)
    table.create("a")
    start = table.version
    table.create("b")
    table.update("a", write_queues=2)
    table.create("c")
    table.delete("c")

    changes = table.changes_since(start)
    assert changes is not None
    assert sorted(changes.put, key=lambda t: t.name) == [
        TopicConfig("a", 8, 2),
        TopicConfig("b", 8, 8),
    ]
    assert changes.deleted == ("c",)
    assert table.changes_since(table.version) == TopicChanges()
    # A table adopted whole, or a reader from before the start: the whole table.
    assert TopicTable(tmp_path).changes_since(start) is None
    table.replace_all([TopicConfig("z", 1, 1)], journal_offset=3)
    assert table.changes_since(start) is None


def test_changes_too_long_ago_to_remember_ask_for_the_whole_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("metaq.broker.topics.RECENT_CHANGES", 4)
    table = TopicTable(tmp_path)
    start = table.version
    for name in "abcde":
        table.create(name)

    assert table.changes_since(start) is None
    recent = table.changes_since(start + 1)
    assert recent is not None and [t.name for t in recent.put] == ["e", "d", "c", "b"]
