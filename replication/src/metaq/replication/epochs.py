"""Epoch histories: which master wrote which part of a log, and where two logs part.

Each election gives a broker group a higher epoch. A master starting an epoch records
``(epoch, its log end)``; slaves copy the entries of the data they receive. Two logs
agree wherever the same epoch wrote them, so comparing histories finds where a slave's
log left the master's (Kafka's leader-epoch truncation, KIP-101 and KIP-279) without
comparing bytes: the tail past that point holds records only an old master ever had,
none of them acknowledged under sync replication, and is cut before the slave follows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple


class Epoch(NamedTuple):
    epoch: int
    start_offset: int


class EpochHistory:
    """A log's epoch entries, oldest first; epochs and starts never decrease.

    With a ``path`` the history is kept in a small JSON file, rewritten atomically and
    synced on every change (changes happen at elections, not per message).
    """

    def __init__(self, path: Path | None = None, entries: Iterable[Epoch] = ()) -> None:
        self._path = path
        self.entries: list[Epoch] = list(entries)
        if path is not None and path.exists():
            self.entries = _load(path)

    @property
    def last_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else 0

    def begin(self, epoch: int, start_offset: int) -> None:
        """This broker starts writing as master of ``epoch`` at ``start_offset``."""
        if self.entries and self.entries[-1].epoch == epoch:
            return
        self._check(Epoch(epoch, start_offset))
        self.entries.append(Epoch(epoch, start_offset))
        self._save()

    def adopt(self, master: Sequence[Epoch], end_offset: int) -> None:
        """After data up to ``end_offset`` arrived from a master with history ``master``,
        take its entries for that data."""
        known = self.last_epoch
        new = [e for e in master if e.epoch > known and e.start_offset < end_offset]
        if not new:
            return
        for entry in new:
            self._check(entry)
            self.entries.append(entry)
        self._save()

    def truncate(self, offset: int) -> None:
        """The log was cut at ``offset``: drop the entries of epochs with no data left."""
        kept = [e for e in self.entries if e.start_offset < offset]
        if kept != self.entries:
            self.entries = kept
            self._save()

    def trim_to(self, end_offset: int) -> None:
        """After recovery: drop entries starting past the log's end (a crash can cut the
        log below where an epoch began). An entry starting exactly at the end stays: a
        master records its epoch before it has written in it."""
        kept = [e for e in self.entries if e.start_offset <= end_offset]
        if kept != self.entries:
            self.entries = kept
            self._save()

    def _check(self, entry: Epoch) -> None:
        if self.entries:
            last = self.entries[-1]
            if entry.epoch <= last.epoch or entry.start_offset < last.start_offset:
                raise ValueError(
                    f"epoch entry {tuple(entry)} does not follow {tuple(last)}: epochs "
                    "and their start offsets must grow"
                )

    def _save(self) -> None:
        if self._path is None:
            return
        data = json.dumps([list(e) for e in self.entries]).encode()
        tmp = self._path.with_name(self._path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self._path)
        dir_fd = os.open(self._path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _load(path: Path) -> list[Epoch]:
    try:
        raw = json.loads(path.read_bytes())
        entries = [Epoch(int(epoch), int(start)) for epoch, start in raw]
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"epoch history {path} is unreadable ({exc}); restore it from a backup, or "
            "delete it together with the broker's data to resync it as a new slave"
        ) from None
    return entries


def divergence(mine: Sequence[Epoch], my_end: int, master: Sequence[Epoch], master_end: int) -> int:
    """Where a slave's log stops agreeing with its master's: its end when it agrees.

    Find the newest epoch both histories can speak for (the master's newest epoch not
    above the slave's last); both logs hold that epoch's records up to where either
    moved on to a later epoch, so they agree up to the nearer of those two points. Data
    written before any election (no history) counts as epoch 0.
    """
    if my_end == 0:
        return 0
    mine, master = _from_zero(mine), _from_zero(master)
    last = mine[-1].epoch
    i = max(i for i, e in enumerate(master) if e.epoch <= last)
    epoch = master[i].epoch
    master_epoch_end = master[i + 1].start_offset if i + 1 < len(master) else master_end
    later = [e.start_offset for e in mine if e.epoch > epoch]
    my_epoch_end = later[0] if later else my_end
    return min(my_end, master_epoch_end, my_epoch_end)


def _from_zero(history: Sequence[Epoch]) -> list[Epoch]:
    if history and history[0].epoch == 0:
        return list(history)
    return [Epoch(0, 0), *history]
