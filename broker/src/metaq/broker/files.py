"""Small state files (topics, consumer offsets) written atomically as JSON."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metaq.broker.store.segment import fsync_dir
from metaq.common.errors import MetaqError

_TMP_SUFFIX = ".tmp"


def write_json_atomically(path: Path, data: Any) -> None:
    """Replace ``path`` with ``data`` as JSON: a crash leaves the old file or the new one.

    Write a temporary file, fsync it, rename it over the old one, fsync the directory.
    Compact: an indent makes ``json`` encode in Python rather than C, ten times slower,
    which a table of 10,000 topics rewritten at every change could not afford.
    """
    body = json.dumps(data, separators=(",", ":"), sort_keys=True).encode() + b"\n"
    # A name of its own: a second writer never truncates or renames this one's file.
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=_TMP_SUFFIX, dir=path.parent)
    try:
        try:
            os.fchmod(fd, 0o644)
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def read_json(path: Path) -> Any | None:
    """The parsed file, or None when it does not exist; raises ValueError naming the file
    when it exists but is not JSON (an operator must look: it is never silently reset)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ValueError(
            f"{path} is not valid JSON ({exc}); restore it or move it aside to start empty"
        ) from None


def load_json_state(
    path: Path, file_format: int, apply: Callable[[Any], None], if_damaged: str
) -> None:
    """Read a state file :func:`write_json_atomically` wrote and ``apply`` its data; do
    nothing when it does not exist. A file of another format, or one ``apply`` cannot
    take (it raises KeyError, TypeError, ValueError, AttributeError or a MetaqError), is
    refused with a ValueError naming it, saying what is wrong and ``if_damaged`` (what
    to do). Called at start, before any writer: it removes temporary files a crash left.
    """
    for stale in glob.glob(glob.escape(str(path)) + ".*" + _TMP_SUFFIX):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stale)
    data = read_json(path)
    if data is None:
        return
    try:
        if data["format"] != file_format:
            raise ValueError(f"format {data['format']} is not {file_format}")
        apply(data)
    except (KeyError, TypeError, ValueError, AttributeError, MetaqError) as exc:
        raise ValueError(f"{path} is damaged: {exc!r}; {if_damaged}") from None
