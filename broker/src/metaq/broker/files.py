"""Small state files (topics, consumer offsets) written atomically as JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from metaq.broker.store.segment import fsync_dir


def write_json_atomically(path: Path, data: Any) -> None:
    """Replace ``path`` with ``data`` as JSON: a crash leaves the old file or the new one.

    Write a temporary file, fsync it, rename it over the old one, fsync the directory.
    """
    body = json.dumps(data, indent=1, sort_keys=True).encode() + b"\n"
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
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
