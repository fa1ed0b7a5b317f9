"""The confirmed offset a slave keeps on disk: written soon after it moves, read back at
start, and refused with advice when damaged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from metaq.broker.confirmed_mark import FILE_NAME, ConfirmedMark
from metaq.testing.waiting import run_async, wait_until_async


def test_a_noted_offset_is_on_disk_soon_and_read_back_at_start(tmp_path: Path) -> None:
    async def scenario() -> None:
        mark = ConfirmedMark(tmp_path)
        assert mark.offset == 0
        mark.note(4096)

        async def written() -> bool:
            # Read the file itself: opening a second mark on a directory in use would
            # remove the writer's temporary file, as a start does after a crash.
            path = tmp_path / FILE_NAME
            return path.exists() and json.loads(path.read_text())["offset"] == 4096

        await wait_until_async(written, 10, "the offset is written")
        mark.note(8192)
        mark.note(1024)  # an older word never moves it back
        await mark.close()

    run_async(scenario())
    assert ConfirmedMark(tmp_path).offset == 8192


def test_a_damaged_file_is_refused_with_what_to_do(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_text(json.dumps({"format": 1, "offset": "lots"}))
    with pytest.raises(ValueError, match="delete it"):
        ConfirmedMark(tmp_path)
