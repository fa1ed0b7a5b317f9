"""The checkpoint file and the abort marker: what recovery may trust after a restart.

The checkpoint says how far the commitlog is known durable, and up to which commitlog
offset the consume queues and index are durable (with the number of queue entries they
held there, so lost queue files are noticed). The abort marker exists while the store
runs; finding it at start means the last run did not shut down cleanly.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from metaq.broker.store.segment import fsync_dir

_FORMAT: Final = struct.Struct("<IIqqqq")
_MAGIC: Final = 0x4D51434B
_VERSION: Final = 1
_CRC: Final = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    commitlog_durable: int
    """Every commitlog byte below this offset was fsynced."""
    dispatched: int
    """Consume-queue and index entries for every record below this offset are durable."""
    queue_entries: int
    """The sum over all consume queues of their max offset at ``dispatched``."""
    written_ms: int


def read_checkpoint(path: Path) -> Checkpoint | None:
    """The checkpoint, or None if it is missing or damaged (recovery then scans fully)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) != _FORMAT.size + _CRC.size:
        return None
    if zlib.crc32(raw[: _FORMAT.size]) != _CRC.unpack_from(raw, _FORMAT.size)[0]:
        return None
    magic, version, durable, dispatched, entries, written_ms = _FORMAT.unpack_from(raw)
    if magic != _MAGIC or version != _VERSION:
        return None
    return Checkpoint(durable, dispatched, entries, written_ms)


def write_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Replace the checkpoint atomically: a crash leaves the old one or the new one."""
    body = _FORMAT.pack(
        _MAGIC,
        _VERSION,
        checkpoint.commitlog_durable,
        checkpoint.dispatched,
        checkpoint.queue_entries,
        checkpoint.written_ms,
    )
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, body + _CRC.pack(zlib.crc32(body)))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


class AbortMarker:
    def __init__(self, path: Path) -> None:
        self.path = path

    def found(self) -> bool:
        return self.path.exists()

    def create(self) -> None:
        self.path.write_bytes(str(os.getpid()).encode())
        fsync_dir(self.path.parent)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        fsync_dir(self.path.parent)
