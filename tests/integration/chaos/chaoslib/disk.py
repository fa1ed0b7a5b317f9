"""What is on a broker's disk: the message ids its commitlog holds, its bytes, and the
means for a power loss on a real broker process.

Power loss: ``kill -9`` cannot lose data (the kernel's page cache outlives the process),
so a broker meant to lose power runs under :mod:`chaoslib.lossy_broker`, whose store
syncs through :class:`MarkedLossyDisk` — the store's own fault shim (``LossyDisk``)
that also appends, after every real sync, how far that sync made each file durable to a
marks file beside the data directory. After ``kill -9``, :func:`drop_unsynced` zeroes
every store file past its last mark (and files never synced), exactly as a machine that
lost power would forget them. A mark is written after its sync returns and before the
store acts on it, so a send acknowledged under SYNC flush is always inside the marks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from metaq.broker.store.segment import Segment
from metaq.common.errors import InvalidRecord
from metaq.common.record import BLANK_MAGIC, HEADER_SIZE, decode
from metaq.testing.lossy_disk import LossyDisk

MARKS_SUFFIX = ".durable-marks"


def marks_path(data_dir: Path) -> Path:
    return data_dir.with_name(data_dir.name + MARKS_SUFFIX)


class MarkedLossyDisk(LossyDisk):
    """LossyDisk whose durability marks survive the process (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self._marks = os.open(marks_path(root), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        # Files present at start are durable: a power loss before this start was already
        # applied to them.
        lines = "".join(f"{ino} {size} {path}\n" for path, (ino, size) in self.durable.items())
        os.write(self._marks, lines.encode())

    def _record(self, segment: Segment, mark: int) -> None:
        super()._record(segment, mark)
        try:
            inode = os.stat(segment.path).st_ino
        except FileNotFoundError:
            return
        os.write(self._marks, f"{inode} {mark} {segment.path}\n".encode())


def drop_unsynced(data_dir: Path) -> int:
    """Forget what a broker (killed, run under lossy_broker) never synced; bytes zeroed."""
    durable: dict[Path, tuple[int, int]] = {}
    path = marks_path(data_dir)
    if path.exists():
        for line in path.read_text().splitlines():
            inode, mark, name = line.split(" ", 2)
            durable[Path(name)] = (int(inode), int(mark))
    disk = LossyDisk(data_dir)
    disk.durable = durable
    return disk.drop_unsynced()


def _segments(data_dir: Path) -> list[Path]:
    folder = data_dir / "commitlog"
    if not folder.exists():
        return []
    return sorted(p for p in folder.iterdir() if p.name.isdigit())


def commitlog_bytes(data_dir: Path, end: int) -> bytes:
    """The first ``end`` bytes of a broker's commitlog, read from its segment files."""
    out = bytearray()
    for path in _segments(data_dir):
        out += path.read_bytes()
        if len(out) >= end:
            break
    return bytes(out[:end])


def scan(data_dir: Path) -> Iterator[tuple[int, str, bytes]]:
    """(commitlog offset, topic, body) of each record, in log order, up to the log's end:
    a zero size, or the first record that does not decode (a torn or damaged tail)."""
    base = 0
    for path in _segments(data_dir):
        data = path.read_bytes()
        base = int(path.name)
        pos = 0
        while pos + 8 <= len(data):
            size = int.from_bytes(data[pos : pos + 4], "little")
            magic = int.from_bytes(data[pos + 4 : pos + 8], "little")
            if size == 0:
                return
            if magic == BLANK_MAGIC:
                break
            if size < HEADER_SIZE:
                return
            try:
                record = decode(data, pos)
            except InvalidRecord:
                return
            yield base + pos, record.topic, record.body
            pos += size


def stored_ids(data_dir: Path, topics: Sequence[str]) -> list[str]:
    """The workload ids in a broker's commitlog (bodies start with the id)."""
    wanted = set(topics)
    return [body.split(b" ", 1)[0].decode(errors="replace")
            for _, topic, body in scan(data_dir) if topic in wanted]  # fmt: skip


# --- a disk of its own, to fill -------------------------------------------------------------


def mount_small_disk(data_dir: Path, mib: int) -> None:
    """Give ``data_dir`` a filesystem of its own: ext4 in an image file, loop-mounted, so
    filling it fills nothing else. Needs root."""
    image = data_dir.with_name(data_dir.name + ".img")
    image.parent.mkdir(parents=True, exist_ok=True)
    with image.open("wb") as file:
        file.truncate(mib * 1024 * 1024)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(data_dir)], check=True,
                   capture_output=True)  # fmt: skip
    shutil.rmtree(data_dir / "lost+found", ignore_errors=True)


def unmount_small_disk(data_dir: Path) -> None:
    subprocess.run(["umount", str(data_dir)], check=False, capture_output=True)
    data_dir.with_name(data_dir.name + ".img").unlink(missing_ok=True)


def fill_disk(data_dir: Path, used_ratio: float) -> Path:
    """Allocate a filler file until the filesystem is ``used_ratio`` full; return it."""
    usage = shutil.disk_usage(data_dir)
    filler = data_dir / "disk-filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, max(1, int(used_ratio * usage.total) - usage.used))
    finally:
        os.close(fd)
    return filler
