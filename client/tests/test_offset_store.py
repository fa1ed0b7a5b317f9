"""The broadcasting consumer's local offset file survives restarts and refuses damage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from metaq.client.offset_store import LocalOffsetStore


def test_saved_offsets_are_read_back_by_a_new_store(tmp_path: Path) -> None:
    path = tmp_path / "offsets" / "group.json"
    store = LocalOffsetStore(path)
    store.update("orders", "broker-a", 0, 17)
    store.update("orders", "broker-b", 3, 4)

    assert store.save()

    again = LocalOffsetStore(path)
    assert again.get("orders", "broker-a", 0) == 17
    assert again.get("orders", "broker-b", 3) == 4
    assert again.get("orders", "broker-b", 2) is None


def test_save_writes_only_when_something_changed(tmp_path: Path) -> None:
    store = LocalOffsetStore(tmp_path / "o.json")
    assert not store.save()
    store.update("t", "a", 0, 1)
    assert store.save()
    store.update("t", "a", 0, 1)
    assert not store.dirty
    assert not store.save()


def test_save_leaves_no_temporary_files_behind(tmp_path: Path) -> None:
    store = LocalOffsetStore(tmp_path / "o.json")
    for offset in range(5):
        store.update("t", "a", 0, offset)
        store.save()

    assert [p.name for p in tmp_path.iterdir()] == ["o.json"]
    assert json.loads((tmp_path / "o.json").read_text())["offsets"] == {"t": {"a": {"0": 4}}}


def test_a_damaged_file_is_refused_with_its_name(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    path.write_text('{"format": 1, "offsets": {"t": {"a": {"0": "x"}}}}')

    with pytest.raises(ValueError, match=r"o\.json is damaged"):
        LocalOffsetStore(path)


def test_a_negative_offset_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="negative"):
        LocalOffsetStore(tmp_path / "o.json").update("t", "a", 0, -1)
