"""The topic table: permissions, write-wipe, auto-create, persistence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from metaq.broker.topics import NoPermission, TopicTable, UnknownTopic
from metaq.common.errors import ErrorCode, InvalidMessage
from metaq.common.model import Permission, TopicConfig


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
    table.listeners.append(lambda: changes.append(table.version))
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


def test_a_change_journaled_by_a_listener_rewrites_the_table_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The table is written whole: at 10,000 topics each write is most of a create's cost.
    import metaq.broker.topics as topics_module

    writes: list[int] = []
    real = topics_module.write_json_atomically

    def counted(path: Path, data: object) -> None:
        writes.append(1)
        real(path, data)

    monkeypatch.setattr(topics_module, "write_json_atomically", counted)
    table = TopicTable(tmp_path)
    table.listeners.append(lambda: table.journaled(41))
    table.create("orders")

    assert len(writes) == 1
    saved = json.loads((tmp_path / "topics.json").read_text())
    assert saved["journal_offset"] == 41 and "orders" in saved["topics"]
    # Journaled outside a change (a new master writing its whole state): written then.
    table.journaled(42)
    assert len(writes) == 2
    assert TopicTable(tmp_path).journal_offset == 42
