"""The dispatcher: reads the commitlog in order and builds consume queues and the index.

One dispatcher per store, in commitlog order, after the append is acknowledged (seed Q&A
2-3). It reads records back from the log rather than taking them from the appender, so
the same code rebuilds queues after a crash and on a slave that received raw log bytes.
"""

from __future__ import annotations

import itertools
import logging
import resource
import threading
import zlib
from collections.abc import Callable, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from metaq.broker.store.commitlog import CommitLog
from metaq.broker.store.consume_queue import ENTRY_DTYPE, ConsumeQueue, QueueTable
from metaq.broker.store.index import (
    MessageIndex,
    hash_id,
    hash_ids,
    hash_key,
    key_for_topic_key,
)
from metaq.broker.store.producers import ProducerTable
from metaq.broker.store.retention import DESCRIPTOR_ERRNOS
from metaq.broker.store.segment import Segment
from metaq.broker.store.service import Service
from metaq.common.log_limit import Repeated
from metaq.common.record import (
    BLANK_MAGIC,
    FLAG_SEQUENCED,
    HEADER_SIZE,
    MAX_SEQUENCE,
    SEQUENCED_ID,
    header_view,
)
from metaq.common.record_dtype import header_dtype

log = logging.getLogger(__name__)

_ROUND_BYTES: Final = 4 * 1024 * 1024
FEW_RECORDS: Final = 256
"""A run of fewer records than this is decoded a record at a time: one-message sends
make runs of one, and the array path's fixed set-up (dozens of numpy calls) costs more
than the loop until a run of like records is a few hundred long (docs/benchmarks.md)."""
_SMALL_RUN: Final = 8
"""A queue with fewer entries than this in a run takes them one put at a time: with
thousands of queues a run has one or two entries each, and the arrays cost more."""


_HEADER_FIELDS: Final = (
    "size", "flags", "queue_offset", "store_timestamp_ms", "queue_id", "msg_id",
    "topic_len", "tags_len", "keys_len",
)  # fmt: skip
"""What dispatch reads of a header: as array columns for a run, as a struct per record."""
_HEADER_DTYPE: Final = header_dtype(*_HEADER_FIELDS)
_FIELDS: Final = header_view(*_HEADER_FIELDS)
_SIZE_MAGIC: Final = header_view("size", "magic")
_SIZE_MAGIC_DTYPE: Final = header_dtype("size", "magic")
_LIKE_BEFORE_SKIP: Final = 8
"""Records of one size in a row before the walk looks further ahead for more."""
_LIKE_RUN: Final = 64
_LIKE_WAIT_MAX: Final = 4096
_LIKE_LOOKAHEAD: Final = 65_536
_HEADER_ITEM: Final = np.dtype(f"V{HEADER_SIZE}")

_STARVED_RETRY_S: Final = (0.01, 1.0)
"""First and longest wait before a round that found no file descriptor is tried again."""

IndexEntries = tuple[
    Sequence[int] | npt.NDArray[np.uint32], Sequence[int] | npt.NDArray[np.int64],
    Sequence[int] | npt.NDArray[np.int64],
]  # fmt: skip
"""Index entries as columns: key hash, commitlog offset, store time ms."""

DispatchListener = Callable[[set[tuple[bytes, int]]], None]
"""Told which (topic, queue id) pairs got new entries in a round; long polling uses it."""


class Dispatcher:
    def __init__(
        self, commitlog: CommitLog, queues: QueueTable, index: MessageIndex,
        few_records: int = FEW_RECORDS, producers: ProducerTable | None = None,
    ) -> None:  # fmt: skip
        self.commitlog = commitlog
        self.queues = queues
        self.index = index
        self.producers = producers if producers is not None else ProducerTable()
        """Fed the sequences of idempotent producers' records as they are dispatched."""
        self.dispatched = 0
        self.listeners: list[DispatchListener] = []
        self.few_records = few_records
        """Runs of fewer records than this are decoded a record at a time."""
        # Held while a round runs, so a checkpoint reads a consistent dispatched offset.
        self.lock = threading.Lock()

    @property
    def backlog_bytes(self) -> int:
        return self.commitlog.write_offset - self.dispatched

    def dispatch(self, limit_bytes: int = _ROUND_BYTES) -> int:
        """Dispatch records up to the commitlog's end (at most ``limit_bytes``); count them."""
        with self.lock:
            touched, count = self._dispatch_locked(limit_bytes)
        self._tell(touched)
        return count

    def try_dispatch(self, limit_bytes: int = _ROUND_BYTES) -> bool:
        """Dispatch as :meth:`dispatch` does unless another thread is dispatching now;
        False (nothing done) if one is."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            touched, _ = self._dispatch_locked(limit_bytes)
        finally:
            self.lock.release()
        self._tell(touched)
        return True

    def _dispatch_locked(self, limit_bytes: int) -> tuple[set[ConsumeQueue], int]:
        touched: set[ConsumeQueue] = set()
        count = 0
        end = min(self.commitlog.write_offset, self.dispatched + limit_bytes)
        offset = self.dispatched
        # Index entries are gathered for one put at the end of the round.
        index_runs: list[IndexEntries] = []
        while offset < end:
            segment = self.commitlog.segments.find(offset)
            if segment is None:
                raise RuntimeError(f"commitlog offset {offset} has no segment to dispatch")
            starts, pos = _record_starts(segment, offset - segment.start, end - segment.start)
            if starts:
                run = self._dispatch_each if len(starts) < self.few_records else self._dispatch_run
                index_runs.append(run(segment, starts, touched))
                count += len(starts)
            offset = segment.start + pos
        if len(index_runs) == 1:
            self.index.put_many(*index_runs[0])
        elif index_runs:
            self.index.put_many(
                *(np.concatenate(column) for column in zip(*index_runs, strict=True))
            )
        self.dispatched = offset
        return touched, count

    def _dispatch_each(
        self, segment: Segment, starts: list[int], touched: set[ConsumeQueue]
    ) -> tuple[list[int], list[int], list[int]]:
        """:meth:`_dispatch_run` a record at a time: the same queue and index entries."""
        view = segment.view
        unpack = _FIELDS.unpack_from
        queues = self.queues
        rows = queues.rows
        hashes: list[int] = []
        offsets: list[int] = []
        times: list[int] = []
        for pos in starts:
            (size, flags, queue_offset, store_ms, queue_id, msg_id, topic_len, tags_len,
             keys_len) = unpack(view, pos)  # fmt: skip
            at = pos + HEADER_SIZE
            topic = view[at : at + topic_len].tobytes()
            row = rows.get(topic)
            queue = row[queue_id] if row is not None and 0 <= queue_id < len(row) else None
            if queue is None:
                queue = queues.get_or_create(topic, queue_id)
            touched.add(queue)
            at += topic_len
            tag_code = zlib.crc32(view[at : at + tags_len]) if tags_len else 0
            offset = segment.start + pos
            queue.put(queue_offset, offset, size, tag_code)
            if flags & FLAG_SEQUENCED:
                producer, place = SEQUENCED_ID.unpack(msg_id)
                seq = place & MAX_SEQUENCE
                self.producers.record(
                    (producer >> 16, topic, queue_id), producer & 0xFFFF, seq, seq,
                    queue_offset, store_ms,
                )  # fmt: skip
            hashes.append(hash_id(msg_id))
            offsets.append(offset)
            times.append(store_ms)
            if keys_len:
                at += tags_len
                for key in view[at : at + keys_len].tobytes().split(b" "):
                    hashes.append(hash_key(key_for_topic_key(topic, key)))
                    offsets.append(offset)
                    times.append(store_ms)
        return hashes, offsets, times

    def _dispatch_run(
        self, segment: Segment, starts: list[int], touched: set[ConsumeQueue]
    ) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Put the records at ``starts`` of ``segment`` into their queues; return their
        index entries (key hash, commitlog offset, store time), in commitlog order."""
        at = np.array(starts, np.int64)
        heads = _at_every_byte(segment, _HEADER_ITEM)[at].view(_HEADER_DTYPE)
        count = len(starts)
        offsets = at + segment.start
        store_ms = heads["store_timestamp_ms"].astype(np.int64)
        topic_len = heads["topic_len"].astype(np.int64)
        tags_len = heads["tags_len"]
        keys_len = heads["keys_len"]
        topics, topic_of = _topics(segment, at + HEADER_SIZE, topic_len)
        tag_codes = np.zeros(count, np.int64)
        view = segment.view
        for n in np.flatnonzero(tags_len).tolist():
            tags_at = starts[n] + HEADER_SIZE + int(topic_len[n])
            tag_codes[n] = zlib.crc32(view[tags_at : tags_at + int(tags_len[n])])
        # Group the records by queue, in commitlog order within each.
        queue_ids = heads["queue_id"]
        keys = (topic_of.astype(np.int64) << 32) | queue_ids.view(np.uint32)
        order = np.argsort(keys, kind="stable")
        bounds = [0, *(np.flatnonzero(np.diff(keys[order])) + 1).tolist(), count]
        queue_offsets = heads["queue_offset"]
        sizes = heads["size"]
        sequenced = (heads["flags"] & FLAG_SEQUENCED) != 0
        any_sequenced = bool(sequenced.any())
        queues = self.queues
        rows = queues.rows
        for first, last in itertools.pairwise(bounds):
            members = order[first:last]
            head = int(members[0])
            topic = topics[int(topic_of[head])]
            queue_id = int(queue_ids[head])
            row = rows.get(topic)
            queue = row[queue_id] if row is not None and 0 <= queue_id < len(row) else None
            if queue is None:
                queue = queues.get_or_create(topic, queue_id)
            touched.add(queue)
            run = queue_offsets[members]
            if any_sequenced:
                self._record_sequences(
                    topic, queue_id, members[sequenced[members]], heads, queue_offsets,
                    store_ms,
                )  # fmt: skip
            if len(members) < _SMALL_RUN or not (np.diff(run) == 1).all():
                for n in members.tolist():
                    queue.put(int(queue_offsets[n]), int(offsets[n]), int(sizes[n]),
                              int(tag_codes[n]))  # fmt: skip
                continue
            entries = np.empty(len(members), ENTRY_DTYPE)
            entries["offset"] = offsets[members]
            entries["size"] = sizes[members]
            entries["tag"] = tag_codes[members]
            queue.put_many(int(run[0]), entries)
        id_hashes = hash_ids(heads["msg_id"])
        keyed = np.flatnonzero(keys_len).tolist()
        if not keyed:
            return id_hashes, offsets, store_ms
        # Each record's id entry is followed by an entry per key, as a lookup expects.
        key_hashes: list[list[int]] = []
        for n in keyed:
            topic = topics[int(topic_of[n])]
            keys_at = starts[n] + HEADER_SIZE + int(topic_len[n]) + int(tags_len[n])
            names = bytes(view[keys_at : keys_at + int(keys_len[n])]).split(b" ")
            key_hashes.append([hash_key(key_for_topic_key(topic, k)) for k in names])
        per_record = np.ones(count, np.int64)
        per_record[keyed] += [len(h) for h in key_hashes]
        id_at = np.cumsum(per_record) - per_record
        hashes = np.empty(int(per_record.sum()), np.uint32)
        hashes[id_at] = id_hashes
        for n, found in zip(keyed, key_hashes, strict=True):
            hashes[id_at[n] + 1 : id_at[n] + 1 + len(found)] = found
        return hashes, np.repeat(offsets, per_record), np.repeat(store_ms, per_record)

    def _record_sequences(
        self, topic: bytes, queue_id: int, members: npt.NDArray[np.intp],
        heads: npt.NDArray[np.void], queue_offsets: npt.NDArray[np.int64],
        store_ms: npt.NDArray[np.int64],
    ) -> None:  # fmt: skip
        """Feed the producer table the sequenced records ``members`` of one queue, a call
        per stretch of one producer's consecutive sequences at consecutive offsets."""
        if not len(members):
            return
        words = np.frombuffer(heads["msg_id"][members].tobytes(), ">u8").reshape(-1, 2)
        producers = words[:, 0]
        seqs = (words[:, 1] & np.uint64(MAX_SEQUENCE)).astype(np.int64)
        offsets = queue_offsets[members].astype(np.int64)
        breaks = (
            (producers[1:] != producers[:-1])
            | (np.diff(seqs) != 1)
            | (np.diff(offsets) != 1)
        )  # fmt: skip
        bounds = [0, *(np.flatnonzero(breaks) + 1).tolist(), len(members)]
        record = self.producers.record
        for first, end in itertools.pairwise(bounds):
            producer = int(producers[first])
            record(
                (producer >> 16, topic, queue_id), producer & 0xFFFF, int(seqs[first]),
                int(seqs[end - 1]), int(offsets[first]), int(store_ms[members[end - 1]]),
            )  # fmt: skip

    def _tell(self, touched: set[ConsumeQueue]) -> None:
        if touched and self.listeners:
            keys = {queue.key for queue in touched}
            for listener in self.listeners:
                listener(keys)

    def catch_up(self) -> int:
        """Dispatch everything appended so far (start-up and shutdown)."""
        total = 0
        while self.dispatched < self.commitlog.write_offset:
            total += self.dispatch()
        return total


def _at_every_byte(segment: Segment, dtype: np.dtype[np.void]) -> npt.NDArray[np.void]:
    """The file as an item of ``dtype`` starting at every byte (they overlap): picking
    items out of it at record offsets is one copy of each, however unaligned."""
    count = segment.size - dtype.itemsize + 1
    return np.ndarray((count,), dtype, segment.view, 0, (1,))


def _record_starts(segment: Segment, pos: int, stop: int) -> tuple[list[int], int]:
    """Where each record from ``pos`` to ``stop`` in ``segment`` begins, and where the
    next round goes on: the segment's end once a blank (or no room for a record) ends it.

    Records vary in size, so this walks from record to record; but where several in a
    row have had the same size (a batch of like messages), it checks the sizes at the
    places the next ones would start, all at once, and skips over those that have it.
    """
    starts: list[int] = []
    append = starts.append
    unpack = _SIZE_MAGIC.unpack_from
    view = segment.view
    stop = min(stop, segment.size)
    # Too little room for any record past this: the rest is a blank (or nothing).
    last = segment.size - HEADER_SIZE
    previous = same = 0
    wait = _LIKE_BEFORE_SKIP
    while pos < stop:
        if pos > last:
            return starts, segment.size
        size, magic = unpack(view, pos)
        if magic == BLANK_MAGIC or size == 0:
            return starts, segment.size
        append(pos)
        pos += size
        if size != previous:
            previous, same = size, 0
            continue
        same += 1
        if same < wait:
            continue
        run = _like_run(segment, pos, min(stop, last + 1), size)
        starts.extend(range(pos, pos + run * size, size))
        pos += run * size
        # Where sizes vary, a look ahead finds little: try less often.
        wait = _LIKE_BEFORE_SKIP if run >= _LIKE_RUN else min(2 * wait, _LIKE_WAIT_MAX)
        same = 0
    return starts, pos


def _like_run(segment: Segment, pos: int, stop: int, size: int) -> int:
    """How many records of ``size`` bytes follow one another from ``pos``, each starting
    before ``stop``."""
    count = min(-(-(stop - pos) // size), _LIKE_LOOKAHEAD)
    if count <= 0:
        return 0
    found = _at_every_byte(segment, _SIZE_MAGIC_DTYPE)[np.arange(pos, pos + count * size, size)]
    like = (found["size"] == size) & (found["magic"] != BLANK_MAGIC)
    return count if like.all() else int(like.argmin())


def _topics(
    segment: Segment, at: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
) -> tuple[list[bytes], npt.NDArray[np.intp]]:
    """The distinct topics of the names at ``at`` (of ``lengths`` bytes) in ``segment``,
    and for each name the position of its topic among them. Neighbours mostly share a
    topic, so names are compared with the one before and each change looked up."""
    width = int(lengths.max())
    if width == int(lengths.min()):
        names = _at_every_byte(segment, np.dtype(f"V{width}"))[at]
    else:
        # Each name zero-padded to the longest, its length in front (names have no
        # NULs, but the length keeps even those apart).
        columns = np.arange(width)
        padded = np.zeros((len(at), width + 2), np.uint8)
        padded[:, :2] = lengths.astype("<u2")[:, None].view(np.uint8)
        inside = columns < lengths[:, None]
        data = np.frombuffer(segment.view, np.uint8)
        padded[:, 2:][inside] = data[(at[:, None] + columns)[inside]]
        names = padded.view(f"V{width + 2}")[:, 0]
    changes = [0, *(np.flatnonzero(names[1:] != names[:-1]) + 1).tolist()]
    known: dict[bytes, int] = {}
    topics: list[bytes] = []
    run_topics: list[int] = []
    for n in changes:
        name = bytes(segment.view[int(at[n]) : int(at[n] + lengths[n])])
        number = known.get(name)
        if number is None:
            number = known[name] = len(topics)
            topics.append(name)
        run_topics.append(number)
    runs = np.diff([*changes, len(at)])
    return topics, np.repeat(np.array(run_topics, np.intp), runs)


class DispatchService(Service):
    """Runs the dispatcher whenever appends wake it, and lets appenders wait for room.

    A round that cannot open a file for want of a descriptor (EMFILE, ENFILE: a new
    queue's first file, the next index file) is tried again, waiting a little longer each
    time up to a second, until it goes through: ``starved`` holds the error meanwhile,
    the log says so once (then once a minute, and when it ends), and the store reports
    it. A round leaves nothing half done that a retry could break: ``dispatched`` moves
    only when a round completes, and entries put again land where they already are.
    """

    name = "dispatch"

    def __init__(self, dispatcher: Dispatcher) -> None:
        # Appends wake it; the interval is only a backstop, and each timed wake-up takes
        # the GIL from the event loop for a round that usually finds nothing.
        super().__init__(interval_s=1.0)
        self.dispatcher = dispatcher
        self._progress = threading.Condition()
        self.starved: OSError | None = None
        """Why the dispatcher waits for a file descriptor now; None while it goes on."""
        self._starving = Repeated(log, "dispatch waiting for a file descriptor")

    def run_once(self) -> None:
        wait_s = _STARVED_RETRY_S[0]
        while not self.stopping and (
            self.dispatcher.dispatched < self.dispatcher.commitlog.write_offset
        ):
            try:
                self.dispatcher.dispatch()
            except OSError as exc:
                if exc.errno not in DESCRIPTOR_ERRNOS:
                    raise
                self._starved(exc)
                self.pause(wait_s)
                wait_s = min(2 * wait_s, _STARVED_RETRY_S[1])
                continue
            if self.starved is not None:
                self.starved = None
                self._starving.ended()
            with self._progress:
                self._progress.notify_all()

    def _starved(self, exc: OSError) -> None:
        if self.starved is None:
            self.starved = exc
            with self._progress:  # appenders waiting for room learn why there is none
                self._progress.notify_all()
        limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        self._starving.happened(
            f"{exc} (open-file limit {limit}); messages are stored but not readable until "
            "one frees up or the limit is raised; retrying"
        )

    def wait_for_room(self, backlog_bytes: int, timeout_s: float) -> bool:
        """Block until the undispatched backlog is under ``backlog_bytes`` (back-pressure)."""
        self.wakeup()
        with self._progress:
            return self._progress.wait_for(
                lambda: (
                    self.dispatcher.backlog_bytes < backlog_bytes
                    or self.error is not None
                    or self.starved is not None
                ),
                timeout_s,
            )

    def on_failure(self, exc: BaseException) -> None:
        with self._progress:
            self._progress.notify_all()
