"""An in-memory ReplicaLog, for testing replication without a store."""

from __future__ import annotations

import struct
from typing import Final

from metaq.common.framing import Buffer

_SIZE: Final = struct.Struct("<I")


def record(payload: bytes) -> bytes:
    """A fake record: a 4-byte length (counting itself) and the payload."""
    return _SIZE.pack(4 + len(payload)) + payload


class MemoryLog:
    """Records are ``record()`` blobs; segments are ``segment_bytes`` long and a record
    never crosses one (the rest of a segment is padded with zeros, like a blank end)."""

    def __init__(self, segment_bytes: int = 1 << 20, *, durable_lag: bool = False) -> None:
        self.segment_bytes = segment_bytes
        self.data = bytearray()
        self.min_offset = 0
        # With durable_lag, held_offset moves only when sync() is called (a SYNC-flush
        # slave whose fsync has not happened yet).
        self._durable_lag = durable_lag
        self._held = 0

    @property
    def end_offset(self) -> int:
        return self.min_offset + len(self.data)

    def append(self, payload: bytes) -> int:
        """A master's append; returns the record's offset."""
        rec = record(payload)
        room = self.segment_bytes - self.end_offset % self.segment_bytes
        if len(rec) > room:
            self.data += bytes(room)
        offset = self.end_offset
        self.data += rec
        return offset

    def read(self, offset: int, max_bytes: int) -> Buffer:
        if offset < self.min_offset or offset > self.end_offset:
            raise ValueError(f"offset {offset} is outside [{self.min_offset}, {self.end_offset}]")
        segment_end = (offset // self.segment_bytes + 1) * self.segment_bytes
        limit = min(self.end_offset, segment_end)
        pos = offset
        while pos < limit:
            (size,) = _SIZE.unpack_from(self.data, pos - self.min_offset)
            if size == 0:  # padding to the segment's end
                pos = limit
                break
            if pos + size - offset > max_bytes and pos > offset:
                break
            pos += size
        return bytes(self.data[offset - self.min_offset : pos - self.min_offset])

    def write(self, offset: int, data: Buffer) -> None:
        if offset != self.end_offset:
            raise ValueError(f"write at {offset} but the log ends at {self.end_offset}")
        self.data += data
        if not self._durable_lag:
            self._held = self.end_offset

    def truncate(self, offset: int) -> None:
        del self.data[offset - self.min_offset :]
        self._held = min(self._held, offset)

    def reset(self, offset: int) -> None:
        if self.data:
            raise ValueError("reset needs an empty log")
        self.min_offset = self._held = offset

    @property
    def held_offset(self) -> int:
        return self._held

    def sync(self) -> None:
        self._held = self.end_offset

    async def hold(self, offset: int) -> None:
        if not self._durable_lag:
            return
        self.sync()
