"""Small state files (topics, consumer offsets) written atomically as JSON, and the
append-only change logs beside a snapshot."""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from metaq.broker.store.segment import fsync_dir
from metaq.common.errors import MetaqError

log = logging.getLogger(__name__)

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


class ChangeLog:
    """An append-only file of JSON records, one a line behind its CRC-32: the changes made
    to a state since its last snapshot (:func:`write_json_atomically`), so that a change
    costs one small write whatever the size of the state.

    Every append is fsynced before it returns. A crash can leave a torn last line (part
    of the last append); :meth:`read` cuts it. A bad line with a whole one after it is
    damage, not a crash: refused with a ValueError naming the file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records = 0
        """Records in the file (counted from :meth:`read`, which comes first)."""

    def read(self) -> list[Any]:
        """Every whole record, in order; a torn tail is cut from the file (at start, before
        any append)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self.records = 0
            return []
        records: list[Any] = []
        position = 0
        while position < len(raw):
            end = raw.find(b"\n", position)
            record = _parse_line(raw[position:end]) if end >= 0 else _TORN
            if record is _TORN:
                # Whole lines after this one (the unterminated end is not one).
                after = raw[position:].split(b"\n")[1:-1]
                if any(_parse_line(line) is not _TORN for line in after):
                    raise ValueError(
                        f"{self.path} is damaged: the line at byte {position} is not a whole "
                        "record, yet whole records follow it; restore the data directory "
                        "from a backup (or a slave's copy)"
                    )
                log.warning(
                    "%s: cutting %d bytes of a change a crash left half-written",
                    self.path,
                    len(raw) - position,
                )
                with open(self.path, "r+b") as file:
                    file.truncate(position)
                    os.fsync(file.fileno())
                break
            records.append(record)
            position = end + 1
        self.records = len(records)
        return records

    def append(self, record: Any) -> None:
        """Add ``record`` and fsync; on an error the file is as it was before."""
        self._write([record], truncate=False)

    def reset(self, records: list[Any]) -> None:
        """Replace the whole file by ``records`` (after a new snapshot)."""
        self._write(records, truncate=True)

    def _write(self, records: list[Any], *, truncate: bool) -> None:
        lines = b"".join(_line(record) for record in records)
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if truncate:
                os.ftruncate(fd, 0)
            start = os.fstat(fd).st_size
            try:
                view = memoryview(lines)
                while view:
                    view = view[os.write(fd, view) :]
                os.fdatasync(fd)
            except BaseException:
                # A half-written line with whole ones appended after it would read as
                # damage: take it back (best effort; a torn tail is cut at the next start).
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
                if truncate:
                    self.records = 0
                raise
        finally:
            os.close(fd)
        if created:
            fsync_dir(self.path.parent)
        self.records = (0 if truncate else self.records) + len(records)


_TORN: Final = object()


def _line(record: Any) -> bytes:
    body = json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def _parse_line(line: bytes) -> Any:
    """The record of one line (without its newline), or _TORN when it is not a whole one."""
    if len(line) < 10 or line[8:9] != b" ":
        return _TORN
    body = line[9:]
    try:
        if int(line[:8], 16) != zlib.crc32(body):
            return _TORN
        return json.loads(body)
    except ValueError:
        return _TORN
