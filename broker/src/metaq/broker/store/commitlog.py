"""The commitlog: every message of every topic, appended to one segmented log.

Appends are sequential writes into pre-faulted mapped segments; a record never spans two
segments (the unused end of a segment is marked blank). Queue offsets are assigned here,
at append time, so the dispatcher that builds consume queues only copies them.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

# The same CRC-32 as zlib's, computed with carry-less multiplies: several times faster on
# a 1 KiB record, where zlib's was a large share of the loop thread's time per message
# (docs/benchmarks.md, "Figures behind design choices").
from zlib_ng.zlib_ng import crc32

from metaq.broker.store.config import StoreConfig
from metaq.broker.store.queue_offsets import QueueOffsets
from metaq.broker.store.segment import Disk, Segment, SegmentQueue
from metaq.common.errors import CorruptLog, InvalidMessage
from metaq.common.record import (
    BLANK_MAGIC,
    CRC_AT,
    CRC_START,
    FIELDS,
    HEADER_SIZE,
    MAGIC,
    MAX_QUEUES_PER_TOPIC,
    STAMP,
    STAMP_AT,
    check_topic,
    header_view,
)

log = logging.getLogger(__name__)

_LENGTHS: Final = ("topic_len", "tags_len", "keys_len", "props_len", "body_len")
# The fields append checks.
_CHECK: Final = header_view("size", "magic", "queue_id", *_LENGTHS)
_CRC: Final = FIELDS["crc"].packer
_OFFSET: Final = FIELDS["commitlog_offset"].packer
_OFFSET_AT: Final = FIELDS["commitlog_offset"].offset
# A blank's header: its size and BLANK_MAGIC where a record has its size and magic.
_BLANK: Final = header_view("size", "magic")
_MAGIC_BYTES: Final = FIELDS["magic"].packer.pack(MAGIC)
_CONTENT_PROBLEMS: Final = frozenset(
    {"CRC mismatch", "record is stamped with another commitlog offset (stale bytes)"}
)
"""Problems of a record whose header is sound: the walk can step over it."""
# What check_batch reads of a record in one unpack, the topic (of the batch's length) too.
_BATCH_FIELDS: Final = ("size", "magic", "flags", "queue_id", "msg_id", *_LENGTHS)


class Appended(NamedTuple):
    """Where a batch landed: its commitlog span and each record's queue offset."""

    start: int
    end: int
    commitlog_offsets: list[int]
    queue_offsets: list[int]
    store_timestamp_ms: int


@dataclass(slots=True)
class RecordBatch:
    """Records of one topic-queue back to back in one buffer, as a SEND carries them.

    Made only by :meth:`CommitLog.check_batch`, which has checked every record, so the
    append copies the buffer into the log in one piece and stamps the records in place:
    no object per record on the way in. Not frozen: a frozen dataclass is slower to
    build, a cost every one-message send would pay.
    """

    data: memoryview
    sizes: list[int]
    ends: list[int]
    """Where each record ends in ``data``."""
    msg_ids: list[bytes]
    flags: int
    """The records' flags ORed: does any ask for special handling?"""
    topic: bytes
    queue_id: int
    flags_all: int = 0
    """The records' flags ANDed: do all carry a flag (sequenced ids, say)?"""


@dataclass(frozen=True, slots=True)
class RecoveredTail:
    """Where recovery found the end of the valid log, and what it found there."""

    end: int
    reason: str


class CommitLog:
    def __init__(
        self,
        config: StoreConfig,
        disk: Disk,
        may_allocate: Callable[[int], bool] | None = None,
    ) -> None:
        self.config = config
        self.segments = SegmentQueue(
            config.commitlog_dir,
            config.commitlog_segment_bytes,
            # Blocks are always reserved: a store into a mapped page the filesystem
            # cannot back is SIGBUS. prefault_segments only decides the zeros.
            preallocate=True,
            prefault=config.prefault_segments,
            keep_fd=True,
            disk=disk,
            may_allocate=may_allocate,
        )
        self.disk = disk
        self.write_offset = 0
        # Next queue offset per (topic, queue id); restored from the consume queues.
        self.queue_offsets = QueueOffsets()
        self._lock = threading.Lock()
        self._legal_topics: set[bytes] = set()
        # Records whose header is sound but whose content fails its CRC, by offset, with
        # their size: never served, and repaired from the master when there is one.
        self.damaged: dict[int, int] = {}
        self._batch_fields: dict[int, struct.Struct] = {}

    @property
    def min_offset(self) -> int:
        return self.segments.min_offset

    def load(self) -> None:
        gaps = self.segments.load()
        if gaps:
            raise CorruptLog(
                str(self.config.commitlog_dir),
                gaps[0],
                "a commitlog segment file is missing between two present ones",
            )

    # --- append -----------------------------------------------------------------------

    def _check(self, record: bytes | bytearray | memoryview) -> tuple[bytes, int, int]:
        """Validate one record as received; return its topic, queue id and size."""
        if len(record) < HEADER_SIZE:
            raise InvalidMessage(
                f"a record of {len(record)} bytes is shorter than the {HEADER_SIZE}-byte header"
            )
        size, magic, queue_id, topic_len, tags_len, keys_len, props_len, body_len = (
            _CHECK.unpack_from(record)
        )
        if magic != MAGIC:
            raise InvalidMessage(
                f"record magic {magic:#010x} is not format {MAGIC & 0xFFFF}; upgrade the client"
            )
        if size != len(record) or size != (
            HEADER_SIZE + topic_len + tags_len + keys_len + props_len + body_len
        ):
            raise InvalidMessage(f"record size {size} disagrees with its {len(record)} bytes")
        if body_len > self.config.max_message_bytes:
            raise InvalidMessage(
                f"message body is {body_len} bytes; the limit is "
                f"{self.config.max_message_bytes} (store.max_message_bytes): split or compress it"
            )
        if props_len > self.config.max_properties_bytes:
            raise InvalidMessage(
                f"message properties are {props_len} bytes; the limit is "
                f"{self.config.max_properties_bytes}"
            )
        if not 0 <= queue_id < MAX_QUEUES_PER_TOPIC:
            raise InvalidMessage(f"queue id {queue_id} is outside 0..{MAX_QUEUES_PER_TOPIC - 1}")
        topic = bytes(record[HEADER_SIZE : HEADER_SIZE + topic_len])
        if topic not in self._legal_topics:
            try:
                check_topic(topic.decode())
            except UnicodeDecodeError:
                raise InvalidMessage("topic name is not UTF-8") from None
            self._legal_topics.add(topic)
        return topic, queue_id, size

    def check_batch(self, data: memoryview, topic: bytes, queue_id: int) -> RecordBatch | None:
        """Check a SEND's records of ``topic`` and ``queue_id`` in one pass over ``data``.

        Returns None for anything but well-formed records of that topic and queue within
        the limits: the caller then takes the per-record path, whose checks say exactly
        what is wrong. A record's flags are not judged here (see ``RecordBatch.flags``).
        """
        if topic not in self._legal_topics or not 0 <= queue_id < MAX_QUEUES_PER_TOPIC:
            return None
        topic_len = len(topic)
        fields = self._batch_fields.get(topic_len)
        if fields is None:
            fields = self._batch_fields[topic_len] = header_view(
                *_BATCH_FIELDS, topic_len=topic_len
            )
        unpack = fields.unpack_from
        fixed = HEADER_SIZE + topic_len
        max_body = self.config.max_message_bytes
        max_props = self.config.max_properties_bytes
        sizes: list[int] = []
        ends: list[int] = []
        msg_ids: list[bytes] = []
        flags_seen = 0
        flags_all = -1
        pos = 0
        n = len(data)
        try:
            while pos < n:
                size, magic, flags, queue, msg_id, tl, gl, kl, pl, bl, record_topic = unpack(
                    data, pos
                )
                if (
                    size != fixed + gl + kl + pl + bl
                    or magic != MAGIC
                    or queue != queue_id
                    or tl != topic_len
                    or record_topic != topic
                    or bl > max_body
                    or pl > max_props
                ):
                    return None
                flags_seen |= flags
                flags_all &= flags
                pos += size
                sizes.append(size)
                ends.append(pos)
                msg_ids.append(msg_id)
        except struct.error:  # a header cut short
            return None
        if pos != n or not sizes:
            return None
        return RecordBatch(data, sizes, ends, msg_ids, flags_seen, topic, queue_id, flags_all)

    def append(self, records: Sequence[bytes | bytearray | memoryview] | RecordBatch) -> Appended:
        """Append a batch as one unit: all records are checked before any is written.

        Returns once the bytes are in the page cache; durability is the flusher's job.
        """
        if isinstance(records, RecordBatch):
            return self._append_batch(records)
        checked = [self._check(r) for r in records]
        with self._lock:
            now_ms = time.time_ns() // 1_000_000
            start = self.write_offset
            offset = start
            host = self.config.store_host
            take = self.queue_offsets.take
            cl_offsets: list[int] = []
            q_offsets: list[int] = []
            segment = self.segments.segment_for_write(offset)
            view = segment.view
            pos = offset - segment.start
            self._open_ahead(segment, pos, [size for _, _, size in checked])
            for record, (topic, queue_id, size) in zip(records, checked, strict=True):
                if pos + size > segment.size:
                    self._seal_segment(segment, pos)
                    offset = segment.end
                    segment = self.segments.segment_for_write(offset)
                    view = segment.view
                    pos = 0
                queue_offset = take(topic, queue_id)
                end = pos + size
                view[pos:end] = record
                STAMP.pack_into(view, pos + STAMP_AT, offset, queue_offset, now_ms, host)
                _CRC.pack_into(view, pos + CRC_AT, crc32(view[pos + CRC_START : end]))
                cl_offsets.append(offset)
                q_offsets.append(queue_offset)
                pos = end
                offset += size
            segment.written = pos
            self.write_offset = offset
        return Appended(start, offset, cl_offsets, q_offsets, now_ms)

    def _append_batch(self, batch: RecordBatch) -> Appended:
        """Append checked records of one queue: one copy per segment the batch lands in,
        then each record stamped and its CRC written where it lies."""
        data, sizes, ends = batch.data, batch.sizes, batch.ends
        topic, queue_id = batch.topic, batch.queue_id
        host = self.config.store_host
        stamp = STAMP.pack_into
        put_crc = _CRC.pack_into
        crc_at = CRC_AT
        crc = crc32
        with self._lock:
            now_ms = time.time_ns() // 1_000_000
            start = offset = self.write_offset
            first_queue_offset = queue_offset = self.queue_offsets.get((topic, queue_id), 0)
            cl_offsets: list[int] = []
            add = cl_offsets.append
            segment = self.segments.segment_for_write(offset)
            pos = offset - segment.start
            if pos + ends[-1] > segment.size:
                self._open_ahead(segment, pos, sizes)
            done = 0  # records written
            at = 0  # where they end in data
            while True:
                # The records that fit in this segment; a record never spans two.
                upto = bisect.bisect_right(ends, at + segment.size - pos, done)
                if upto == done and pos == 0:
                    raise InvalidMessage(
                        f"a record of {sizes[done]} bytes does not fit in a commitlog segment"
                    )
                until = ends[upto - 1] if upto > done else at
                view = segment.view
                view[pos : pos + until - at] = data[at:until]
                base = segment.start
                for size in sizes[done:upto]:
                    stamp(view, pos + STAMP_AT, base + pos, queue_offset, now_ms, host)
                    end = pos + size
                    put_crc(view, pos + crc_at, crc(view[pos + CRC_START : end]))
                    add(base + pos)
                    queue_offset += 1
                    pos = end
                done, at = upto, until
                if done == len(sizes):
                    break
                self._seal_segment(segment, pos)
                offset = segment.end
                segment = self.segments.segment_for_write(offset)
                pos = 0
            segment.written = pos
            self.queue_offsets.set(topic, queue_id, queue_offset)
            self.write_offset = end_offset = segment.start + pos
        queue_offsets = list(range(first_queue_offset, queue_offset))
        return Appended(start, end_offset, cl_offsets, queue_offsets, now_ms)

    def _open_ahead(self, segment: Segment, pos: int, sizes: Sequence[int]) -> None:
        """Open every further segment a batch starting at ``pos`` will reach, before any
        of it is written: when one cannot be made (the disk is full), the batch fails
        whole, with no record of it in the log for a later recovery to bring back."""
        if pos + sum(sizes) <= segment.size:
            return
        for size in sizes:
            if pos + size > segment.size:
                segment = self.segments.segment_for_write(segment.end)
                pos = 0
            pos += size

    def _seal_segment(self, segment: Segment, pos: int) -> None:
        """Mark the rest of a full segment blank so readers skip to the next one."""
        if segment.size - pos >= _BLANK.size:
            _BLANK.pack_into(segment.view, pos, segment.size - pos, BLANK_MAGIC)
        segment.written = segment.size
        # Retention ages a segment by when it stopped taking writes.
        os.utime(segment.path)

    # --- replication ------------------------------------------------------------------

    def read_chunk(self, offset: int, max_bytes: int) -> memoryview:
        """Log bytes from ``offset`` for a slave: whole records (and a segment's blank end),
        never past the segment's end, at most ``max_bytes`` unless the first record alone
        is larger. Empty at the end of the log or below the oldest segment."""
        segment = self.segments.find(offset)
        if segment is None:
            return memoryview(b"")
        view = segment.view
        pos = offset - segment.start
        stop = min(self.write_offset, segment.end) - segment.start
        if stop - pos <= max_bytes:
            return view[pos:stop]
        at = pos
        while at < stop:
            if segment.size - at < _BLANK.size:
                step = segment.size - at
            else:
                size, magic = _BLANK.unpack_from(view, at)
                step = segment.size - at if magic == BLANK_MAGIC else size
            if at + step - pos > max_bytes and at > pos:
                break
            at += step
        return view[pos:at]

    def write_raw(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write bytes a master read, verbatim, at the end of this (slave's) log.

        Through the file rather than the mapping: the kernel copies into the page cache
        with the GIL released and without a page fault per page, so a slave catching up
        needs no pre-faulted files (readers' mappings see the same pages).
        """
        with self._lock:
            if offset != self.write_offset:
                raise ValueError(f"raw write at {offset}, but the log ends at {self.write_offset}")
            segment = self.segments.segment_for_write(offset, prefault=False)
            pos = offset - segment.start
            end = pos + len(data)
            if end > segment.size:
                raise InvalidMessage(
                    f"{len(data)} replicated bytes at {offset} cross the end of segment "
                    f"{segment.path.name}; master and slave segment sizes must agree"
                )
            fd = segment.fd
            if fd is None:
                segment.view[pos:end] = data
            else:
                with memoryview(data) as rest:
                    at = pos
                    while rest:
                        n = os.pwrite(fd, rest, at)
                        rest, at = rest[n:], at + n
            segment.written = end
            self.write_offset = offset + len(data)

    def reset(self, offset: int) -> None:
        """Make an empty log start at ``offset`` (a segment boundary)."""
        with self._lock:
            if self.segments.segments or self.write_offset:
                raise ValueError("only an empty commitlog can be moved to another start")
            if offset % self.segments.segment_bytes:
                raise ValueError(f"offset {offset} is not a segment boundary")
            self.write_offset = offset
            self.segments.segment_for_write(offset)

    def truncate(self, offset: int) -> None:
        """Cut the log at ``offset`` (a record boundary): a slave's diverged tail."""
        with self._lock:
            self.segments.truncate(offset)
            self.set_end(offset)
            self._forget_damage_from(offset)

    # --- read -------------------------------------------------------------------------

    def slice(self, offset: int, size: int) -> memoryview | None:
        """Zero-copy view of stored bytes, or None if that part of the log is gone."""
        if offset + size > self.write_offset:
            return None
        segment = self.segments.find(offset)
        if segment is None:
            return None
        pos = offset - segment.start
        try:
            return segment.view[pos : pos + size]
        except ValueError:  # retired and released between find and slice
            return None

    def records(self, start: int, end: int) -> Iterator[tuple[int, memoryview]]:
        """Walk whole records in ``[start, end)``, skipping blank segment ends."""
        offset = start
        while offset < end:
            segment = self.segments.find(offset)
            if segment is None:
                return
            view = segment.view
            pos = offset - segment.start
            if segment.size - pos < _BLANK.size:
                offset = segment.end
                continue
            size, magic = _BLANK.unpack_from(view, pos)
            if magic == BLANK_MAGIC:
                offset = segment.end
                continue
            if size == 0:
                return
            yield offset, view[pos : pos + size]
            offset += size

    # --- recovery ---------------------------------------------------------------------

    def recover(self, start: int, durable: int, *, keep_damaged: bool = False) -> RecoveredTail:
        """Validate records from ``start`` to the end of the data and cut a torn tail.

        ``durable`` is where the checkpoint says fsynced data ended. Damage past it is
        what a crash leaves and is cut. Damage before it is cut only when no intact
        record follows (the last record); otherwise it is real corruption: raise, unless
        ``keep_damaged`` (a replica, which can fetch the record again) and only the
        record's content is bad: then it goes into :attr:`damaged` and the walk goes on.
        """
        offset = self._first_segment_start(start)
        while True:
            segment = self.segments.find(offset)
            if segment is None:
                return self._cut(offset, "end of the last segment")
            pos = offset - segment.start
            if segment.size - pos < _BLANK.size:
                offset = segment.end
                continue
            view = segment.view
            # Only size and magic: a blank can be 8 bytes, too short for a record's CRC.
            size, magic = _BLANK.unpack_from(view, pos)
            if magic == BLANK_MAGIC and size == segment.size - pos:
                offset = segment.end
                continue
            if size == 0 and magic == 0:
                return self._cut(offset, "end of data")
            problem = self._problem(segment, pos, size, magic)
            if problem is None:
                offset += size
                continue
            if offset < durable and self._intact_record_after(offset + 1):
                if keep_damaged and problem in _CONTENT_PROBLEMS:
                    self._note_damage(segment, offset, size, problem)
                    offset += size
                    continue
                raise CorruptLog(str(segment.path), offset, problem)
            return self._cut(offset, problem)

    def check(self, start: int, end: int) -> int:
        """Check every record in ``[start, end)`` against its CRC; return where it stopped.

        Starts at a record boundary and stops at one, at the first at or past ``end``.
        Damaged content goes into :attr:`damaged`; a header that makes no sense (the walk
        cannot find the next record) raises CorruptLog.
        """
        offset = start
        while offset < min(end, self.write_offset):
            segment = self.segments.find(offset)
            if segment is None:
                return offset
            pos = offset - segment.start
            if segment.size - pos < _BLANK.size:
                offset = segment.end
                continue
            size, magic = _BLANK.unpack_from(segment.view, pos)
            if magic == BLANK_MAGIC and size == segment.size - pos:
                offset = segment.end
                continue
            problem = self._problem(segment, pos, size, magic)
            if problem in _CONTENT_PROBLEMS:
                self._note_damage(segment, offset, size, problem)
            elif problem is not None:
                raise CorruptLog(str(segment.path), offset, problem)
            offset += size
        return offset

    def _note_damage(self, segment: Segment, offset: int, size: int, problem: str) -> None:
        if offset not in self.damaged:
            log.error(
                "damaged record in %s at commitlog offset %d (%d bytes): %s; it is not "
                "served, and is fetched again from the master",
                segment.path,
                offset,
                size,
                problem,
            )
        self.damaged[offset] = size

    def repair(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Overwrite a damaged record with the master's copy and make it durable.

        Logs of a group are byte-identical, so the master's bytes at the same offset are
        the record as written; they must be a whole sound record of the same size.
        """
        with self._lock:
            size = self.damaged.get(offset)
            if size is None:
                return
            segment = self.segments.find(offset)
            if segment is None:  # retention removed it meanwhile
                del self.damaged[offset]
                return
            if len(data) < size:
                raise CorruptLog(str(segment.path), offset, "the master's copy is shorter")
            copy = bytes(data[:size])
            pos = offset - segment.start
            view = segment.view
            before = bytes(view[pos : pos + size])
            view[pos : pos + size] = copy
            problem = self._problem(segment, pos, *_BLANK.unpack_from(view, pos))
            if problem is not None:
                view[pos : pos + size] = before
                raise CorruptLog(str(segment.path), offset, f"the master's copy: {problem}")
            self.disk.sync(segment)
            del self.damaged[offset]
        log.warning("repaired the record at commitlog offset %d from the master", offset)

    def _first_segment_start(self, start: int) -> int:
        segment = self.segments.find(start)
        if segment is None:
            return self.segments.min_offset
        return segment.start

    def _problem(self, segment: Segment, pos: int, size: int, magic: int) -> str | None:
        if magic != MAGIC:
            return f"bad magic {magic:#010x}"
        if not HEADER_SIZE <= size <= segment.size - pos:
            return f"impossible record size {size}"
        _, _, _, tl, tgl, kl, pl, bl = _CHECK.unpack_from(segment.view, pos)
        if size != HEADER_SIZE + tl + tgl + kl + pl + bl:
            return "record size disagrees with its field lengths"
        crc = _CRC.unpack_from(segment.view, pos + CRC_AT)[0]
        if crc32(segment.view[pos + CRC_START : pos + size]) != crc:
            return "CRC mismatch"
        if _OFFSET.unpack_from(segment.view, pos + _OFFSET_AT)[0] != segment.start + pos:
            return "record is stamped with another commitlog offset (stale bytes)"
        return None

    def _intact_record_after(self, offset: int) -> bool:
        """Whether any well-formed record with a good CRC starts after ``offset``."""
        segment = self.segments.find(offset)
        while segment is not None:
            pos = max(offset - segment.start, 0)
            mapping = segment.mapping
            assert mapping is not None  # commitlog files stay mapped until closed
            while True:
                hit = mapping.find(_MAGIC_BYTES, pos + 4)
                if hit < 0:
                    break
                at = hit - 4
                size, magic = _BLANK.unpack_from(segment.view, at)
                if self._problem(segment, at, size, magic) is None:
                    return True
                pos = at + 1
            segment = self.segments.find(segment.end)
            offset = segment.start if segment is not None else offset
        return False

    def _cut(self, offset: int, reason: str) -> RecoveredTail:
        # Zero everything after the cut, not just the damaged record: a stale record
        # further on could otherwise line up with a later append and come back to life.
        self.segments.truncate(offset)
        self.set_end(offset)
        self._forget_damage_from(offset)
        return RecoveredTail(offset, reason)

    def _forget_damage_from(self, offset: int) -> None:
        self.damaged = {at: size for at, size in self.damaged.items() if at < offset}

    def set_end(self, offset: int) -> None:
        """Adopt ``offset`` as the end of the log on disk (after load or recovery)."""
        for segment in self.segments.segments:
            segment.written = segment.synced = max(0, min(segment.size, offset - segment.start))
        self.write_offset = offset
