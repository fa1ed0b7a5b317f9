"""The log that replication copies: what a master reads from and a slave writes to.

Replication moves opaque bytes. It never parses records; it only needs the log's bounds,
whole-record chunks from the master, verbatim writes on the slave, and a way to cut a
slave's tail. The broker's message store implements this; ``metaq.testing.memory_log``
implements it in memory for the state machines' tests.
"""

from __future__ import annotations

from typing import Protocol

from metaq.common.framing import Buffer


class ReplicaLog(Protocol):
    @property
    def segment_bytes(self) -> int:
        """Segment size: master and slave must agree, or their logs could not be identical."""
        ...

    @property
    def min_offset(self) -> int:
        """The oldest offset still held (retention moves it)."""
        ...

    @property
    def end_offset(self) -> int:
        """Where the next byte goes."""
        ...

    def read(self, offset: int, max_bytes: int) -> Buffer:
        """Bytes from ``offset``: whole records, within one segment, at most ``max_bytes``
        unless the first record alone is larger; empty at the end of the log."""
        ...

    def write(self, offset: int, data: Buffer) -> None:
        """Append bytes a master read, verbatim; ``offset`` must be the end of the log."""
        ...

    def truncate(self, offset: int) -> None:
        """Cut everything from ``offset`` on (a slave's diverged tail)."""
        ...

    def reset(self, offset: int) -> None:
        """Make an empty log start at ``offset`` (a new slave of a master whose oldest data
        is past 0)."""
        ...

    @property
    def held_offset(self) -> int:
        """How far the log is held as its flush mode counts holding: durably under SYNC
        flush, in memory under ASYNC. A slave acknowledges up to here."""
        ...

    async def hold(self, offset: int) -> None:
        """Return once ``held_offset`` reached ``offset`` (or the wait is pointless)."""
        ...
