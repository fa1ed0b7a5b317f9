"""The dispatcher decodes a long run of records with array operations and a short one a
record at a time: both must build exactly the same queues and index, wherever a round
ends, and a slave's copy of the log must dispatch the same as the master's."""

from __future__ import annotations

import random
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from metaq.broker.delay import DELAY_TOPIC
from metaq.broker.store import MessageStore
from metaq.broker.store.consume_queue import QueueTable
from metaq.broker.store.dispatch import FEW_RECORDS, Dispatcher
from metaq.broker.store.index import FEW_ENTRIES, MessageIndex
from metaq.broker.store.segment import RealDisk
from metaq.broker.transactions import HALF_TOPIC
from metaq.common.record import (
    FLAG_DELAYED,
    FLAG_TRANSACTION,
    PROP_DELAY_LEVEL,
    PROP_REAL_QUEUE,
    PROP_REAL_TOPIC,
    decode,
    encode,
)

OpenStore = Callable[..., MessageStore]


def _record(rng: random.Random) -> bytearray:
    """One of the kinds of record a log holds, with tags and keys now and then."""
    body = rng.randbytes(rng.choice([0, 10, 300, 1000, 3000]))
    tags = rng.choice(["", "", "tag-a", "tag-bb"])
    keys = rng.choice([(), (), ("k1",), ("k1", "order-7", "k1")])
    kind = rng.random()
    if kind < 0.1:
        real = {PROP_REAL_TOPIC: "orders", PROP_REAL_QUEUE: "1"}
        return encode(DELAY_TOPIC, body, queue_id=rng.randrange(3), tags=tags, keys=keys,
                      properties={**real, PROP_DELAY_LEVEL: "2"}, flags=FLAG_DELAYED)  # fmt: skip
    if kind < 0.2:
        real = {PROP_REAL_TOPIC: "orders", PROP_REAL_QUEUE: "0"}
        return encode(HALF_TOPIC, body, tags=tags, keys=keys, properties=real,
                      flags=FLAG_TRANSACTION)  # fmt: skip
    if kind < 0.6:  # one busy queue: long runs, across consume-queue files
        return encode("orders", body, queue_id=0, tags=tags, keys=keys)
    # many quiet queues: runs of one or two records each
    topic = rng.choice(["a", "bb", "a-much-longer-topic-name"])
    return encode(topic, body, queue_id=rng.randrange(40), tags=tags, keys=keys)


@pytest.fixture
def store(open_store: OpenStore) -> MessageStore:
    """A store of several commitlog segments of mixed records and runs of like ones,
    dispatched as it runs."""
    store = open_store()
    rng = random.Random(11)
    for n in range(150):
        store.append([_record(rng) for _ in range(rng.randint(1, 40))])
        if n % 10 == 0:  # a batch of like records, which the dispatcher skips through
            body = rng.randbytes(rng.choice([0, 700]))
            store.append([encode("orders", body) for _ in range(rng.randint(100, 600))])
    store.dispatcher.catch_up()
    assert len(store.commitlog.segments.segments) >= 3
    return store


EACH: int = sys.maxsize
"""``few_records`` that makes every run go a record at a time."""
ARRAYS: int = 0
"""``few_records`` that makes every run, even of one record, go through the arrays."""


def _fresh_dispatcher(store: MessageStore, root: Path, few_records: int) -> Dispatcher:
    """A dispatcher of ``store``'s log into new queues and a new index under ``root``."""
    config = store.config
    queues = QueueTable(root / "queues", config.consume_queue_segment_entries, RealDisk())
    index = MessageIndex(root / "index", config.index_slots, config.index_entries, RealDisk())
    index.load()
    dispatcher = Dispatcher(store.commitlog, queues, index, few_records)
    dispatcher.dispatched = store.commitlog.min_offset
    return dispatcher


def _dispatch_again(
    store: MessageStore, root: Path, limit_bytes: int, few_records: int = FEW_RECORDS
) -> Dispatcher:
    """Dispatch ``store``'s log afresh into queues and an index under ``root``, in rounds
    of ``limit_bytes`` (1: a record a round, so every run is a single record)."""
    dispatcher = _fresh_dispatcher(store, root, few_records)
    while dispatcher.dispatched < store.commitlog.write_offset:
        dispatcher.dispatch(limit_bytes)
    return dispatcher


def _dispatch_in_rounds_of(
    store: MessageStore, root: Path, records: int, few_records: int
) -> Dispatcher:
    """Dispatch ``store``'s log afresh in rounds of exactly ``records`` records."""
    log = store.commitlog
    starts = [offset for offset, _ in log.records(log.min_offset, log.write_offset)]
    dispatcher = _fresh_dispatcher(store, root, few_records)
    for at in range(0, len(starts), records):
        after = starts[at + records] if at + records < len(starts) else log.write_offset
        assert dispatcher.dispatched == starts[at]
        assert dispatcher.dispatch(after - starts[at]) == len(starts[at : at + records])
    return dispatcher


def _close(*dispatchers: Dispatcher) -> None:
    for dispatcher in dispatchers:
        dispatcher.queues.close()
        dispatcher.index.close()


def _queue_contents(queues: QueueTable) -> dict[tuple[bytes, int], tuple[int, int, bytes]]:
    out = {}
    for key, queue in queues.queues.items():
        entries = queue.entry_array(queue.min_offset, queue.max_offset)
        out[key] = (queue.min_offset, queue.max_offset, entries.tobytes())
    return out


def _index_contents(index: MessageIndex) -> list[tuple[int, bytes]]:
    segments = index.segments()  # brings each file's header up to date
    return [(s.start, bytes(s.view)) for s in segments]


def _expected_entries(
    store: MessageStore,
) -> dict[tuple[bytes, int], dict[int, tuple[int, int, int]]]:
    """What each queue must hold, from the records decoded by the record codec."""
    expected: dict[tuple[bytes, int], dict[int, tuple[int, int, int]]] = {}
    log = store.commitlog
    for offset, raw in log.records(log.min_offset, log.write_offset):
        record = decode(raw)
        tag = zlib.crc32(record.tags.encode()) if record.tags else 0
        queue = expected.setdefault((record.topic.encode(), record.queue_id), {})
        queue[record.queue_offset] = (offset, record.size, tag)
    return expected


@pytest.mark.parametrize("few_records", [ARRAYS, FEW_RECORDS, EACH])
@pytest.mark.parametrize("limit_bytes", [1, 7_001, 1 << 20])
def test_batch_dispatch_builds_what_one_record_at_a_time_builds(
    store: MessageStore, tmp_path: Path, limit_bytes: int, few_records: int
) -> None:
    one_by_one = _dispatch_again(store, tmp_path / "one", 1, EACH)
    batched = _dispatch_again(store, tmp_path / "batched", limit_bytes, few_records)
    try:
        assert batched.dispatched == one_by_one.dispatched == store.commitlog.write_offset
        assert _queue_contents(batched.queues) == _queue_contents(one_by_one.queues)
        assert _queue_contents(store.queues) == _queue_contents(one_by_one.queues)
        assert _index_contents(batched.index) == _index_contents(one_by_one.index)
        assert len(one_by_one.index.files) > 1
    finally:
        _close(one_by_one, batched)


def test_rounds_near_the_threshold_mix_topics_queues_tags_and_keys(store: MessageStore) -> None:
    """What the next test relies on: rounds of a few records, and rounds just under the
    threshold, hold several topics and queues, tags and keys, so either path meets all
    of them within one round."""
    log = store.commitlog
    records = [decode(raw) for _, raw in log.records(log.min_offset, log.write_offset)]
    for size in (3, FEW_RECORDS - 1):
        rounds = [records[n : n + size] for n in range(0, len(records), size)]
        assert any(
            len({r.topic for r in round_}) >= 2
            and len({(r.topic, r.queue_id) for r in round_}) >= 3
            and any(r.tags for r in round_)
            and any(len(r.keys) > 1 for r in round_)
            for round_ in rounds
        )


@pytest.mark.parametrize(
    "records", [1, 3, FEW_RECORDS - 1, FEW_RECORDS, FEW_RECORDS + 1, 4 * FEW_RECORDS]
)
def test_record_at_a_time_and_arrays_build_the_same_across_the_threshold(
    store: MessageStore, tmp_path: Path, records: int
) -> None:
    each = _dispatch_in_rounds_of(store, tmp_path / "each", records, EACH)
    arrays = _dispatch_in_rounds_of(store, tmp_path / "arrays", records, ARRAYS)
    chosen = _dispatch_in_rounds_of(store, tmp_path / "chosen", records, FEW_RECORDS)
    try:
        expected_queues = _queue_contents(store.queues)
        expected_index = _index_contents(store.index)
        for dispatcher in (each, arrays, chosen):
            assert dispatcher.dispatched == store.commitlog.write_offset
            assert _queue_contents(dispatcher.queues) == expected_queues
            assert _index_contents(dispatcher.index) == expected_index
    finally:
        _close(each, arrays, chosen)


def test_queues_hold_every_record_as_the_codec_reads_it(store: MessageStore) -> None:
    expected = _expected_entries(store)
    assert {key[0] for key in expected} >= {DELAY_TOPIC.encode(), HALF_TOPIC.encode()}
    assert len(expected[(b"orders", 0)]) > 2 * store.config.consume_queue_segment_entries
    for key, entries in expected.items():
        queue = store.queues.queues[key]
        assert (queue.min_offset, queue.max_offset) == (0, len(entries))
        held = [tuple(e) for e in queue.entry_array(0, queue.max_offset).tolist()]
        assert held == [entries[n] for n in range(len(entries))]


def test_every_key_and_id_is_found_through_the_index(store: MessageStore) -> None:
    log = store.commitlog
    for offset, raw in log.records(log.min_offset, log.write_offset):
        record = decode(raw)
        assert store.index.lookup(b"\x00" + record.msg_id, 10)[0] == offset
        for key in record.keys:
            found = store.index.lookup(record.topic.encode() + b"#" + key.encode(), 1000)
            assert offset in found


def test_a_replicated_log_is_byte_identical_and_dispatches_the_same(
    store: MessageStore, open_store: OpenStore, tmp_path: Path
) -> None:
    slave = open_store(data_dir=tmp_path / "slave")
    rng = random.Random(3)
    master_log = store.commitlog
    offset = master_log.min_offset
    while offset < master_log.write_offset:
        chunk = bytes(master_log.read_chunk(offset, rng.choice([1, 5_000, 64_000, 1 << 20])))
        slave.append_replicated(offset, chunk)
        offset += len(chunk)
    slave.dispatcher.catch_up()
    assert slave.commitlog.write_offset == master_log.write_offset
    for mine, theirs in zip(slave.commitlog.segments.segments, master_log.segments.segments,
                            strict=True):  # fmt: skip
        assert mine.path.name == theirs.path.name
        assert mine.path.read_bytes() == theirs.path.read_bytes()
    assert _queue_contents(slave.queues) == _queue_contents(store.queues)
    assert _index_contents(slave.index) == _index_contents(store.index)


@pytest.mark.parametrize("as_lists", [False, True])
@pytest.mark.parametrize("chunk", [FEW_ENTRIES - 1, FEW_ENTRIES, 700])
def test_index_entries_added_together_link_as_added_one_by_one(
    tmp_path: Path, chunk: int, as_lists: bool
) -> None:
    rng = np.random.default_rng(4)
    count = 3_000
    # Few slots, so chains run through entries added in the same call.
    hashes = rng.integers(0, 2**32, count, dtype=np.uint32)
    offsets = np.arange(count, dtype=np.int64) * 100
    times = 1_700_000_000_000 + np.arange(count, dtype=np.int64) * 7
    together = MessageIndex(tmp_path / "together", 16, 1_000, RealDisk())
    one_by_one = MessageIndex(tmp_path / "one", 16, 1_000, RealDisk())
    together.load()
    one_by_one.load()
    try:
        for start in range(0, count, chunk):
            columns = [c[start : start + chunk] for c in (hashes, offsets, times)]
            together.put_many(*(c.tolist() if as_lists else c for c in columns))
        for n in range(count):
            one_by_one.put_many([int(hashes[n])], [int(offsets[n])], [int(times[n])])
        assert _index_contents(together) == _index_contents(one_by_one)
        assert len(together.files) == 3
    finally:
        together.close()
        one_by_one.close()
