"""The message index: find commitlog offsets by message id or by (topic, key).

Each index file is an on-disk hash table in the manner of RocketMQ's IndexFile: a header,
a slot array holding the newest entry per hash slot, and an entry array where each entry
links to the previous one in its slot. Files fill in order and are named by the commitlog
offset of their first entry, so retention drops whole files that point below the log.
Hashes collide, so a lookup returns candidates that the store checks against the records.
"""

from __future__ import annotations

import contextlib
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from metaq.broker.store.segment import Disk, Segment, open_segment, segment_name

_HEADER: Final = struct.Struct("<qqqqii")
"""begin store time ms, begin commitlog offset, end store time ms, end offset, count, pad."""
_TAIL_AT: Final = 16
_TAIL: Final = struct.Struct("<qqi")
_SLOT: Final = struct.Struct("<I")
_ENTRY: Final = struct.Struct("<Iqii")
"""key hash, commitlog offset, seconds since the file's begin time, previous entry."""
_ENTRY_WORDS: Final = _ENTRY.size // 4
_WORD: Final = np.dtype("<u4")
_ENTRY_DTYPE: Final = np.dtype(
    {"names": ["hash", "offset", "seconds", "previous"],
     "formats": ["<u4", "<i8", "<i4", "<i4"], "offsets": [0, 4, 12, 16]}
)  # fmt: skip
"""An entry as a numpy record (:data:`_ENTRY`, packed), for adding many at once."""

FEW_ENTRIES: Final = 32
"""Fewer entries than this are added one by one: below it the array path's set-up costs
more than the loop (docs/benchmarks.md)."""

MSG_ID_PREFIX: Final = b"\x00"
_ID_SEED: Final = zlib.crc32(MSG_ID_PREFIX)


def key_for_id(msg_id: bytes) -> bytes:
    return MSG_ID_PREFIX + msg_id


def key_for_topic_key(topic: bytes, key: bytes) -> bytes:
    return topic + b"#" + key


def hash_key(key: bytes) -> int:
    """The hash an entry for ``key`` carries: its CRC-32."""
    return zlib.crc32(key)


def hash_id(msg_id: bytes) -> int:
    """``hash_key(key_for_id(msg_id))`` without building the key."""
    return zlib.crc32(msg_id, _ID_SEED)


def _as_list(column: Sequence[int] | npt.NDArray[np.integer]) -> list[int]:
    if isinstance(column, list):
        return column
    return column.tolist() if isinstance(column, np.ndarray) else list(column)


def _id_byte_hashes(width: int) -> tuple[int, npt.NDArray[np.uint32]]:
    """CRC-32 is affine in the message for a fixed length and start: the hash of a
    ``width``-byte id is that of ``width`` zeros XOR, for each position, what its byte
    there changes. Returns the first and a table of the second by (position, byte)."""
    zeros = zlib.crc32(bytes(width), _ID_SEED)
    table = np.empty((width, 256), np.uint32)
    probe = bytearray(width)
    for position in range(width):
        for byte in range(256):
            probe[position] = byte
            table[position, byte] = zlib.crc32(probe, _ID_SEED) ^ zeros
        probe[position] = 0
    return zeros, table


_ID_WIDTH: Final = 16
_ID_ZEROS, _ID_BYTE_HASHES = _id_byte_hashes(_ID_WIDTH)


def hash_ids(ids: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint32]:
    """:func:`hash_id` of each row of ``ids`` (16-byte message ids), as array operations:
    a call per id costs more than the CRC itself."""
    if ids.shape[1:] != (_ID_WIDTH,):
        raise ValueError(f"message ids are {_ID_WIDTH} bytes, not {ids.shape[1:]}")
    by_position = ids.T.copy()
    hashes = np.full(len(ids), _ID_ZEROS, np.uint32)
    for position in range(_ID_WIDTH):
        hashes ^= _ID_BYTE_HASHES[position].take(by_position[position])
    return hashes


class HashSummary:
    """The hashes of a full index file, in memory: sorted, and as a bitmap in front.

    A new id is ruled out by one bit (the bitmap has 16 to 32 bits an entry, up to 8 MiB,
    so about one new id in 16 gets through) and a binary search, where its hash chain in
    the file would take several reads. 4 bytes an entry sorted plus 2-4 bytes of bitmap:
    2.6 MB for a file of the default 400,000 entries.
    """

    def __init__(self, hashes: npt.NDArray[np.uint32], capacity: int) -> None:
        self.sorted = np.sort(hashes)
        # At most 2**26 bits (8 MiB): a larger file lets more ids through to the search.
        bits = min(26, max(3, (16 * capacity - 1).bit_length()))
        self._shift = np.uint32(32 - bits)
        present = np.zeros(1 << bits, np.bool_)
        present[self.sorted >> self._shift] = True
        self._bitmap = np.packbits(present, bitorder="little")

    def candidates(self, hashes: npt.NDArray[np.uint32]) -> npt.NDArray[np.intp]:
        """The positions in ``hashes`` (fastest sorted) of those this file holds."""
        bit = hashes >> self._shift
        positions = np.flatnonzero((self._bitmap[bit >> 3] >> (bit & 7)) & 1)
        if positions.size:
            wanted = hashes[positions]
            at = self.sorted.searchsorted(wanted)
            at[at == len(self.sorted)] = 0
            positions = positions[self.sorted[at] == wanted]
        return positions


class IndexFile:
    def __init__(self, segment: Segment, slots: int, capacity: int) -> None:
        self.segment = segment
        self.slots = slots
        self.capacity = capacity
        self._entries_at = _HEADER.size + slots * _SLOT.size
        (self.begin_ms, self.begin_offset, self.end_ms, self.end_offset, self.count, _) = (
            _HEADER.unpack_from(segment.view, 0)
        )
        self._summary: HashSummary | None = None

    @staticmethod
    def size_for(slots: int, capacity: int) -> int:
        return _HEADER.size + slots * _SLOT.size + (capacity + 1) * _ENTRY.size

    @property
    def full(self) -> bool:
        return bool(self.count >= self.capacity)

    @property
    def unsummarised(self) -> bool:
        """Full, and its :class:`HashSummary` for :meth:`held` not made yet."""
        return self.full and self._summary is None

    def put_many(
        self, hashes: npt.NDArray[np.uint32], offsets: npt.NDArray[np.int64],
        times: npt.NDArray[np.int64], at: int,
    ) -> int:  # fmt: skip
        """Add entries from position ``at`` of the arrays on until this file is full;
        return the position after the last one added.

        Each entry links to the one before it in its slot, which may be one added in the
        same call: the entries are grouped by slot (stably, so in order within a slot)
        and each takes its predecessor in the group, the first the slot's old value. The
        dispatcher adds an entry per message and per key, so this is array operations,
        not a loop per entry.
        """
        view = self.segment.view
        if self.count == 0 and at < len(hashes):
            begin_ms, begin_offset = int(times[at]), int(offsets[at])
            self.begin_ms, self.begin_offset = begin_ms, begin_offset
            _HEADER.pack_into(view, 0, begin_ms, begin_offset, begin_ms, begin_offset, 0, 0)
        end: int = min(len(hashes), at + self.capacity - self.count)
        if end <= at:
            return at
        n = end - at
        key_hashes = hashes[at:end]
        # Entry numbers start at 1 so that slot value 0 means an empty slot.
        numbers = np.arange(self.count + 1, self.count + 1 + n, dtype=np.uint32)
        slot_of = key_hashes % np.uint32(self.slots)
        slot_numbers = np.frombuffer(view, _WORD, self.slots, _HEADER.size)
        order = np.argsort(slot_of, kind="stable")
        sorted_slots = slot_of[order]
        same_slot = sorted_slots[1:] == sorted_slots[:-1]
        previous_sorted = slot_numbers[sorted_slots]
        previous_sorted[1:][same_slot] = numbers[order][:-1][same_slot]
        first_at = self._entries_at + (self.count + 1) * _ENTRY.size
        entries = np.frombuffer(view, _ENTRY_DTYPE, n, first_at)
        entries["hash"] = key_hashes
        entries["offset"] = offsets[at:end]
        entries["seconds"] = (times[at:end] - self.begin_ms) // 1000
        entries["previous"][order] = previous_sorted
        last_in_slot = np.append(~same_slot, True)
        slot_numbers[sorted_slots[last_in_slot]] = numbers[order][last_in_slot]
        self.count += n
        self.end_ms, self.end_offset = int(times[end - 1]), int(offsets[end - 1])
        return end

    def put_each(self, hashes: list[int], offsets: list[int], times: list[int], at: int) -> int:
        """:meth:`put_many` one entry at a time, for a few entries: builds the same file."""
        view = self.segment.view
        if self.count == 0 and at < len(hashes):
            self.begin_ms, self.begin_offset = times[at], offsets[at]
            _HEADER.pack_into(view, 0, times[at], offsets[at], times[at], offsets[at], 0, 0)
        end: int = min(len(hashes), at + self.capacity - self.count)
        if end <= at:
            return at
        slots, begin_ms, number = self.slots, self.begin_ms, self.count
        slot_unpack, slot_pack, entry_pack = _SLOT.unpack_from, _SLOT.pack_into, _ENTRY.pack_into
        slots_at, slot_size = _HEADER.size, _SLOT.size
        entries_at, entry_size = self._entries_at, _ENTRY.size
        for n in range(at, end):
            key_hash = hashes[n]
            slot_at = slots_at + (key_hash % slots) * slot_size
            previous = slot_unpack(view, slot_at)[0]
            # Entry numbers start at 1 so that slot value 0 means an empty slot.
            number += 1
            entry_pack(view, entries_at + number * entry_size, key_hash, offsets[n],
                       (times[n] - begin_ms) // 1000, previous)  # fmt: skip
            slot_pack(view, slot_at, number)
        self.count = number
        self.end_ms, self.end_offset = times[end - 1], offsets[end - 1]
        return end

    def write_header(self) -> None:
        """Persist the counters; done before each checkpoint's sync, not per entry.

        After a crash the header may be behind the entries, but the checkpoint never
        claims more than the header held, and re-dispatch re-adds what it lacks.
        """
        _TAIL.pack_into(self.segment.view, _TAIL_AT, self.end_ms, self.end_offset, self.count)
        self.segment.written = self._entries_at + (self.count + 1) * _ENTRY.size

    def lookup(self, key: bytes, begin_ms: int, end_ms: int, limit: int) -> list[int]:
        if self.count == 0 or self.end_ms < begin_ms or self.begin_ms > end_ms:
            return []
        view = self.segment.view
        key_hash = hash_key(key)
        number = _SLOT.unpack_from(view, _HEADER.size + (key_hash % self.slots) * _SLOT.size)[0]
        found: list[int] = []
        while 0 < number <= self.count and len(found) < limit:
            entry_hash, offset, seconds, previous = _ENTRY.unpack_from(
                view, self._entries_at + number * _ENTRY.size
            )
            stamp = self.begin_ms + seconds * 1000
            if entry_hash == key_hash and begin_ms - 1000 <= stamp <= end_ms:
                found.append(offset)
            if previous >= number:  # an entry torn by a crash; chains only point back
                break
            number = previous
        return found

    def held(
        self, hashes: npt.NDArray[np.uint32], begin_ms: int, *, may_summarise: bool
    ) -> npt.NDArray[np.intp]:
        """The positions in ``hashes`` (fastest sorted) of those with an entry stored at
        ``begin_ms`` or later in this file.

        A retried SEND asks this for each of its ids, and a new id would walk its slot's
        whole chain (about ``count / slots`` entries) in every file of the de-dup window.
        A full file no longer changes, so it keeps a :class:`HashSummary` (made when
        ``may_summarise`` allows, since building one for a full file takes milliseconds)
        that rules out nearly every new id; only the few whose hash it holds walk their
        chain. The chains left are walked together, one step of every chain per round of
        array operations, so the cost in Python is per round, not per id.
        """
        nothing = np.empty(0, np.intp)
        if self.count == 0 or self.end_ms < begin_ms:
            self._summary = None  # out of the window for good: free the memory
            return nothing
        count, slots, buffer = self.count, self.slots, self.segment.view
        # An entry is five words: hash, offset (two), seconds, previous entry.
        words = np.frombuffer(buffer, _WORD, (count + 1) * _ENTRY_WORDS, self._entries_at)
        if may_summarise and self.unsummarised:
            self._summary = HashSummary(words[_ENTRY_WORDS::_ENTRY_WORDS], self.capacity)
        if self._summary is None:
            positions = np.arange(len(hashes))
        else:
            positions = self._summary.candidates(hashes)
            if not positions.size:
                return nothing
        earliest_seconds = (begin_ms - 1000 - self.begin_ms) // 1000
        slot_numbers = np.frombuffer(buffer, _WORD, slots, _HEADER.size)
        wanted = hashes[positions]
        numbers = slot_numbers[wanted % slots]
        # 0 < number <= count, in unsigned words: a torn entry's number may be anything.
        live = numbers - 1 < count
        positions, wanted, numbers = positions[live], wanted[live], numbers[live]
        found: list[npt.NDArray[np.intp]] = []
        while numbers.size:
            at = numbers.astype(np.intp) * _ENTRY_WORDS
            previous = words[at + 4]
            # 0 < previous < number: chains only point back, a torn one may not.
            live = previous - 1 < numbers - 1
            same = words[at] == wanted
            if same.any():
                same &= words[at + 3].view("<i4") >= earliest_seconds
                found.append(positions[same])
                live &= ~same  # found: the rest of its chain cannot add to the answer
            positions, wanted, numbers = positions[live], wanted[live], previous[live]
        return np.concatenate(found) if found else nothing


class MessageIndex:
    def __init__(self, directory: Path, slots: int, capacity: int, disk: Disk) -> None:
        self.directory = directory
        self.slots = slots
        self.capacity = capacity
        self.disk = disk
        self.files: list[IndexFile] = []

    def load(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        size = IndexFile.size_for(self.slots, self.capacity)
        for path in sorted(p for p in self.directory.iterdir() if p.name.isdigit()):
            segment = open_segment(path, int(path.name), size, preallocate=False, keep_fd=False)
            index = IndexFile(segment, self.slots, self.capacity)
            segment.written = segment.synced = IndexFile.size_for(self.slots, index.count)
            self.files.append(index)

    def put_many(
        self, hashes: Sequence[int] | npt.NDArray[np.uint32],
        offsets: Sequence[int] | npt.NDArray[np.int64],
        times: Sequence[int] | npt.NDArray[np.int64],
    ) -> None:  # fmt: skip
        """Add entries (key hash, commitlog offset, store time ms) in commitlog order."""
        if len(hashes) < FEW_ENTRIES:
            # A one-message send's round: numpy's set-up would cost more than the loop.
            hash_list, offset_list, time_list = _as_list(hashes), _as_list(offsets), _as_list(times)
            at = 0
            while at < len(hash_list):
                if not self.files or self.files[-1].full:
                    self._roll(offset_list[at])
                at = self.files[-1].put_each(hash_list, offset_list, time_list, at)
            return
        key_hashes = np.asarray(hashes, np.uint32)
        at_offsets = np.asarray(offsets, np.int64)
        at_times = np.asarray(times, np.int64)
        at = 0
        while at < len(key_hashes):
            if not self.files or self.files[-1].full:
                self._roll(int(at_offsets[at]))
            at = self.files[-1].put_many(key_hashes, at_offsets, at_times, at)

    def _roll(self, commitlog_offset: int) -> None:
        if self.files:
            self.files[-1].write_header()
        # Named by its first entry's offset, unless one message's keys filled the whole last
        # file: then just past that file's name (names only order files; headers hold offsets).
        start = max(commitlog_offset, self.files[-1].segment.start + 1 if self.files else 0)
        path = self.directory / segment_name(start)
        size = IndexFile.size_for(self.slots, self.capacity)
        segment = open_segment(path, start, size, preallocate=False, keep_fd=False)
        self.files.append(IndexFile(segment, self.slots, self.capacity))

    def lookup(self, key: bytes, limit: int, begin_ms: int = 0, end_ms: int = 2**62) -> list[int]:
        """Candidate commitlog offsets for ``key``, newest first, without duplicates."""
        seen: set[int] = set()
        out: list[int] = []
        for index in reversed(self.files):
            for offset in index.lookup(key, begin_ms, end_ms, limit):
                if offset not in seen:
                    seen.add(offset)
                    out.append(offset)
            if len(out) >= limit:
                break
        return out[:limit]

    def maybe_stored(self, msg_ids: list[bytes], begin_ms: int) -> list[int]:
        """The positions in ``msg_ids`` of the ids that might be stored at ``begin_ms`` or
        later: their hash has an entry then, which may be another id's (look them up to
        be sure). An id left out is certainly not stored."""
        hashes = np.fromiter((hash_id(m) for m in msg_ids), np.uint32, len(msg_ids))
        # Searched in order, a full file's sorted hashes are read front to back, which is
        # much faster than in the ids' order once the files outgrow the CPU's cache.
        order = np.argsort(hashes)
        hashes = hashes[order]
        found: set[int] = set()
        budget = 1  # a file a call: those a restart loads are summarised over the next sends
        for index in reversed(self.files):
            summarise = budget > 0 and index.unsummarised
            budget -= summarise
            found.update(order[index.held(hashes, begin_ms, may_summarise=summarise)].tolist())
        return sorted(found)

    def segments(self) -> list[Segment]:
        """The files to sync for a checkpoint, with their headers brought up to date."""
        for index in self.files:
            index.write_header()
        return [f.segment for f in self.files]

    def drop_since_checkpoint(self, dispatched: int) -> int | None:
        """Delete the files a crash may have left inconsistent; return where to re-index.

        Slots are rewritten in place, so a file still taking entries after the last
        checkpoint can have slots naming entries that never reached the disk (or that
        its stale header does not count). That is the newest file begun before
        ``dispatched`` and every file after it; they are rebuilt from the commitlog.
        """
        keep = len(self.files)
        while keep and (self.files[keep - 1].count == 0 or (
            self.files[keep - 1].begin_offset >= dispatched
        )):  # fmt: skip
            keep -= 1
        if keep:
            keep -= 1
        doomed = self.files[keep:]
        if not doomed:
            return None
        first = doomed[0]
        restart = first.begin_offset if first.count else dispatched
        del self.files[keep:]
        for index in doomed:
            with contextlib.suppress(FileNotFoundError):
                index.segment.path.unlink()
            index.segment.close()
        return min(restart, dispatched)

    def delete_before(self, commitlog_min: int) -> None:
        """Drop files whose every entry points below the commitlog's minimum."""
        while len(self.files) > 1 and self.files[1].begin_offset <= commitlog_min:
            doomed = self.files.pop(0)
            with contextlib.suppress(FileNotFoundError):
                doomed.segment.path.unlink()
            doomed.segment.close()

    def close(self) -> None:
        for index in self.files:
            index.write_header()
            index.segment.close()
        self.files = []
