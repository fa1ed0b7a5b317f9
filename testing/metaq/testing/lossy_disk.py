"""A `Disk` that really syncs but, on a simulated power loss, forgets what was never synced."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from metaq.broker.store.segment import RealDisk, Segment

_ZEROS: Final = bytes(1024 * 1024)


class LossyDisk:
    """Records how far each sync made each segment file durable, and can lose the rest.

    Killing the broker (even kill -9) cannot test fsync: the kernel's page cache outlives
    the process, so every byte written into a mapping reaches the file whether or not it
    was synced. Only a power loss forgets unsynced bytes. This shim simulates one: after
    ``store.halt()``, :meth:`drop_unsynced` zeroes every segment file past the point the
    last sync of it covered, and zeroes files never synced at all.

    Make it before the store writes under ``root``: files already there count as durable.
    Reuse it across restarts of a store on the same ``root`` so the marks carry over.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._real = RealDisk()
        self._lock = threading.Lock()
        # path -> (inode, durable bytes). The inode tells a file apart from a later file
        # of the same name (a segment deleted by a recovery cut and created again).
        self.durable: dict[Path, tuple[int, int]] = {}
        for path in self._segment_files():
            stat = path.stat()
            self.durable[path] = (stat.st_ino, stat.st_size)

    def sync(self, segment: Segment) -> None:
        # Read the mark before syncing: bytes written during the sync may not be covered.
        mark = segment.written
        self._real.sync(segment)
        self._record(segment, mark)

    def sync_all(self, segments: Sequence[Segment]) -> None:
        marks = [s.written for s in segments]
        self._real.sync_all(segments)
        for segment, mark in zip(segments, marks, strict=True):
            self._record(segment, mark)

    def _record(self, segment: Segment, mark: int) -> None:
        try:
            inode = os.stat(segment.path).st_ino
        except FileNotFoundError:  # deleted meanwhile; nothing of it can survive
            return
        with self._lock:
            # The latest sync wins, not the largest: after a recovery cut the file holds
            # zeros past ``written``, and a sync makes those zeros the durable content.
            self.durable[segment.path] = (inode, mark)

    def drop_unsynced(self) -> int:
        """Simulate a power loss; call after ``store.halt()``. Returns the bytes overwritten."""
        dropped = 0
        with self._lock:
            for path in self._segment_files():
                fd = os.open(path, os.O_RDWR)
                try:
                    stat = os.fstat(fd)
                    inode, mark = self.durable.get(path, (-1, 0))
                    at = mark if inode == stat.st_ino else 0
                    # Through the file, not a mapping: halt() has closed the mappings, and
                    # pwrite lands in the same page cache any leftover mapping would see.
                    while at < stat.st_size:
                        written = os.pwrite(fd, _ZEROS[: stat.st_size - at], at)
                        at += written
                        dropped += written
                    os.fsync(fd)
                finally:
                    os.close(fd)
        return dropped

    def _segment_files(self) -> list[Path]:
        # Segment files are named by a number; checkpoint, abort marker and lock are not,
        # and are written with their own fsync, so a power loss keeps them.
        return sorted(p for p in self.root.rglob("*") if p.name.isdigit() and p.is_file())
