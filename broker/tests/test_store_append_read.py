"""Appending to the commitlog and reading back through the consume queues."""

from __future__ import annotations

import random
import struct
import sys
import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metaq.broker.store import FlushMode, GetStatus, MessageStore, reads
from metaq.broker.store.commitlog import Appended
from metaq.common.record import (
    BLANK_MAGIC,
    HEADER_SIZE,
    MAGIC,
    decode,
    encode,
    tag_code,
)

OpenStore = Callable[..., MessageStore]
STORE_HOST = bytes([10, 0, 0, 7, 0x1F, 0x90, 0, 0])


def producer_fields(raw: bytes | bytearray | memoryview) -> bytes:
    """A record without what the broker stamps: the CRC (8-12) and bytes 16-48."""
    raw = bytes(raw)
    return raw[:8] + raw[12:16] + raw[48:]


def read_queue(store: MessageStore, topic: str, queue_id: int, **kwargs: object) -> list[bytes]:
    """Every record of a queue from its minimum on, as bytes, in queue order."""
    out: list[bytes] = []
    offset = store.min_offset(topic, queue_id)
    while True:
        result = store.get(topic, queue_id, offset, **kwargs)  # type: ignore[arg-type]
        if result.status is not GetStatus.FOUND:
            assert result.status is GetStatus.OFFSET_OVERFLOW_ONE, result.status
            return out
        out.extend(bytes(view) for view in result.records)
        assert result.next_offset > offset
        offset = result.next_offset
        result.release()


def test_records_read_back_byte_identical_with_the_broker_fields_stamped(
    open_store: OpenStore,
) -> None:
    store = open_store(store_host=STORE_HOST)
    sent = [
        encode("orders", f"body {n}".encode() * n, queue_id=n % 2, tags="t", keys=[f"k{n}"])
        for n in range(20)
    ]
    appended = store.append(sent[:7])
    later = store.append(sent[7:])
    store.dispatcher.catch_up()

    stored = read_queue(store, "orders", 0) + read_queue(store, "orders", 1)
    stored.sort(key=lambda raw: decode(raw).commitlog_offset)

    assert [producer_fields(raw) for raw in stored] == [producer_fields(raw) for raw in sent]
    offsets = appended.commitlog_offsets + later.commitlog_offsets
    for n, raw in enumerate(stored):
        record = decode(raw)  # verifies the CRC the broker sealed
        assert record.commitlog_offset == offsets[n]
        assert record.queue_offset == n // 2
        assert record.store_host == STORE_HOST
        batch = appended if n < 7 else later
        assert record.store_timestamp_ms == batch.store_timestamp_ms
    assert appended.start == 0 and appended.end == later.start
    assert later.end == store.commitlog.write_offset == sum(len(r) for r in sent)


def test_put_encodes_one_message_and_returns_where_it_landed(open_store: OpenStore) -> None:
    store = open_store()
    first = store.put("orders", b"one", queue_id=3, tags="new", keys=["o-1", "c-9"])
    second = store.put("orders", b"two", queue_id=3, properties={"trace": "abc"})
    store.dispatcher.catch_up()

    result = store.get("orders", 3, 0)

    assert result.status is GetStatus.FOUND
    one, two = (decode(view) for view in result.records)
    assert (one.body, one.tags, one.keys, one.queue_offset) == (b"one", "new", ("o-1", "c-9"), 0)
    assert (two.body, dict(two.properties), two.queue_offset) == (b"two", {"trace": "abc"}, 1)
    assert first.appended.queue_offsets == [0] and second.appended.queue_offsets == [1]
    assert second.appended.start == first.appended.end


def _walk_segment_file(path: Path, start: int) -> tuple[list[tuple[int, int]], int]:
    """(offset, size) of each record in a commitlog file, and where its data stops."""
    raw = path.read_bytes()
    records = []
    pos = 0
    while len(raw) - pos >= 8:
        size, magic = struct.unpack_from("<II", raw, pos)
        if magic == BLANK_MAGIC:
            assert size == len(raw) - pos, "a blank must fill the rest of its file"
            return records, len(raw)
        if size == 0:
            break
        assert magic == MAGIC
        assert pos + size <= len(raw), "a record spans two segment files"
        records.append((start + pos, size))
        pos += size
    return records, pos


def test_segment_rollover_never_splits_a_record_and_blanks_the_rest(
    open_store: OpenStore,
) -> None:
    segment_bytes = 16 * 1024
    store = open_store(
        commitlog_segment_bytes=segment_bytes, max_message_bytes=4096, max_properties_bytes=1024
    )
    rng = random.Random(7)
    sent = []
    for _ in range(40):
        batch = [
            encode("roll", rng.randbytes(rng.randint(0, 3000)), queue_id=rng.randrange(3))
            for _ in range(rng.randint(1, 12))
        ]
        appended = store.append(batch)
        sent.extend(zip(appended.commitlog_offsets, batch, strict=True))
    store.dispatcher.catch_up()

    files = sorted(store.config.commitlog_dir.iterdir())
    assert len(files) >= 20, "the test wants many segments"
    found: list[tuple[int, int]] = []
    for path in files:
        start = int(path.name)
        assert start % segment_bytes == 0 and path.stat().st_size == segment_bytes
        records, data_end = _walk_segment_file(path, start)
        found.extend(records)
        if start + segment_bytes <= store.commitlog.write_offset and data_end < segment_bytes:
            # Fewer than 8 bytes left: nothing is written and readers move on.
            assert segment_bytes - data_end < 8
    assert found == [(offset, len(raw)) for offset, raw in sent]
    for offset, raw in sent:
        assert offset // segment_bytes == (offset + len(raw) - 1) // segment_bytes
    by_queue = defaultdict(list)
    for _, raw in sent:
        by_queue[decode(raw, verify=False).queue_id].append(producer_fields(raw))
    for queue_id, expected in by_queue.items():
        assert [producer_fields(r) for r in read_queue(store, "roll", queue_id)] == expected


def test_a_record_that_exactly_fills_a_segment_is_followed_by_the_next_file(
    open_store: OpenStore,
) -> None:
    segment_bytes = 16 * 1024
    store = open_store(
        commitlog_segment_bytes=segment_bytes, max_message_bytes=8192, max_properties_bytes=1024
    )
    overhead = len(encode("fill", b""))
    first = store.append([encode("fill", bytes(segment_bytes // 2 - overhead))])
    exact = store.append([encode("fill", bytes(segment_bytes // 2 - overhead))])
    after = store.append([encode("fill", b"next")])
    store.dispatcher.catch_up()

    assert exact.end == segment_bytes
    assert after.commitlog_offsets == [segment_bytes]
    assert [decode(r).body for r in read_queue(store, "fill", 0)][2] == b"next"
    assert first.queue_offsets + exact.queue_offsets + after.queue_offsets == [0, 1, 2]


def test_queue_offsets_are_contiguous_per_queue_across_topics_and_batches(
    open_store: OpenStore,
) -> None:
    store = open_store()
    rng = random.Random(3)
    assigned: dict[tuple[str, int], list[int]] = defaultdict(list)
    for _ in range(30):
        keys = [(rng.choice(["a", "b", "c"]), rng.randrange(4)) for _ in range(rng.randint(1, 9))]
        appended = store.append([encode(t, b"x", queue_id=q) for t, q in keys])
        for key, queue_offset in zip(keys, appended.queue_offsets, strict=True):
            assigned[key].append(queue_offset)
    store.dispatcher.catch_up()

    for (topic, queue_id), offsets in assigned.items():
        assert offsets == list(range(len(offsets)))
        assert store.max_offset(topic, queue_id) == len(offsets)
        records = [decode(r) for r in read_queue(store, topic, queue_id)]
        assert [r.queue_offset for r in records] == offsets
        assert {(r.topic, r.queue_id) for r in records} == {(topic, queue_id)}


def test_dispatcher_thread_builds_queues_without_being_asked(
    open_store: OpenStore, wait_until: Callable[[Callable[[], bool], float, str], None]
) -> None:
    store = open_store()
    store.append([encode("bg", b"x", queue_id=1) for _ in range(50)])

    wait_until(lambda: store.max_offset("bg", 1) == 50, 5.0, "the dispatcher reached 50")

    assert len(read_queue(store, "bg", 1)) == 50


def test_a_small_append_is_dispatched_by_the_appending_thread(open_store: OpenStore) -> None:
    store = open_store()
    listened: list[tuple[set[tuple[bytes, int]], int]] = []
    store.dispatcher.listeners.append(lambda keys: listened.append((keys, threading.get_ident())))
    appended = store.append([encode("inline", b"x", queue_id=2)], wake_dispatcher=False)

    store.dispatch_appended()

    # Done before the call returned, on this thread: no hand-off to the dispatcher.
    assert store.dispatcher.dispatched == appended.end
    assert store.max_offset("inline", 2) == 1
    assert listened == [({(b"inline", 2)}, threading.get_ident())]
    assert not store.background_busy()


def test_a_producers_batch_is_dispatched_by_the_appending_thread(open_store: OpenStore) -> None:
    """A batch of 1 KiB sends as a loaded producer coalesces them (about 140 KiB here):
    handed to the dispatcher thread, its records waited for that thread to get the GIL
    from a busy loop, milliseconds at the 99th percentile."""
    store = open_store()
    appended = store.append(
        [encode("batch", bytes(1000), queue_id=1) for _ in range(128)], wake_dispatcher=False
    )
    assert appended.end > 128 * 1024

    store.dispatch_appended()

    assert store.dispatcher.dispatched == appended.end
    assert store.max_offset("batch", 1) == 128


def test_a_large_append_or_a_busy_dispatcher_is_left_to_the_dispatcher_thread(
    open_store: OpenStore, wait_until: Callable[[Callable[[], bool], float, str], None]
) -> None:
    store = open_store(dispatch_inline_bytes=4096)
    large = store.append(
        [encode("big", bytes(1000), queue_id=0) for _ in range(8)], wake_dispatcher=False
    )
    with store.dispatcher.lock:  # the dispatcher thread is mid-round (so it cannot start)
        store.dispatch_appended()  # over the inline limit: returns without dispatching
        assert store.dispatcher.dispatched < large.end
        assert store.background_busy()  # the event loop should not poll against it
        small = store.append([encode("big", b"x", queue_id=0)], wake_dispatcher=False)
        store.dispatch_appended()  # small, but the lock is taken: must not block
        assert store.dispatcher.dispatched < small.end

    wait_until(lambda: store.max_offset("big", 0) == 9, 5.0, "the dispatcher took all 9")
    # Busy until the SYNC flush of those records is done too, which a loaded machine
    # may finish a little after the dispatcher.
    wait_until(lambda: not store.background_busy(), 5.0, "the store is idle again")


def test_a_sync_flush_under_way_is_background_work(open_store: OpenStore) -> None:
    store = open_store(flush_mode=FlushMode.SYNC)
    with store.flusher.lock:  # the flusher cannot finish while this is held
        appended = store.append([encode("durable", b"x")])
        store.dispatch_appended()
        assert store.background_busy()

    assert store.wait_durable(appended.end, 5.0)
    assert not store.background_busy()


# --- get: statuses and bounds ------------------------------------------------------------


@pytest.fixture
def ten(open_store: OpenStore) -> MessageStore:
    """A store with ten 1000-byte-body messages in orders/0."""
    store = open_store()
    store.append(
        [encode("orders", bytes([n]) * 1000, tags="a" if n % 2 else "b") for n in range(10)]
    )
    store.dispatcher.catch_up()
    return store


def test_get_honours_max_messages(ten: MessageStore) -> None:
    result = ten.get("orders", 0, 2, max_messages=3)

    assert result.status is GetStatus.FOUND
    assert result.queue_offsets == [2, 3, 4]
    assert [decode(v).body[0] for v in result.records] == [2, 3, 4]
    assert (result.next_offset, result.min_offset, result.max_offset) == (5, 0, 10)


def test_get_honours_max_bytes(ten: MessageStore) -> None:
    size = len(ten.get("orders", 0, 0, max_messages=1).records[0])

    result = ten.get("orders", 0, 0, max_bytes=size * 3 - 1)

    assert result.queue_offsets == [0, 1]
    assert result.total_bytes == 2 * size
    assert result.next_offset == 2


def test_get_returns_the_first_record_even_if_it_alone_exceeds_max_bytes(
    ten: MessageStore,
) -> None:
    result = ten.get("orders", 0, 4, max_bytes=10)

    assert result.status is GetStatus.FOUND
    assert result.queue_offsets == [4]
    assert result.next_offset == 5


def test_get_exactly_at_the_end_is_overflow_one(ten: MessageStore) -> None:
    result = ten.get("orders", 0, 10)

    assert (result.status, result.next_offset, result.records) == (
        GetStatus.OFFSET_OVERFLOW_ONE,
        10,
        [],
    )


def test_get_past_the_end_is_overflow_badly_and_points_at_the_end(ten: MessageStore) -> None:
    result = ten.get("orders", 0, 25)

    assert (result.status, result.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 10)


def test_get_on_an_unknown_queue_is_no_message_in_queue(ten: MessageStore) -> None:
    for topic, queue_id in [("orders", 1), ("nobody", 0)]:
        result = ten.get(topic, queue_id, 0)
        assert (result.status, result.next_offset) == (GetStatus.NO_MESSAGE_IN_QUEUE, 0)
        assert ten.max_offset(topic, queue_id) == ten.min_offset(topic, queue_id) == 0
    far = ten.get("nobody", 0, 5)
    assert (far.status, far.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 0)


def test_get_with_a_tag_filter_returns_only_matching_entries(ten: MessageStore) -> None:
    result = ten.get("orders", 0, 0, tag_codes={tag_code("a")})

    assert result.status is GetStatus.FOUND
    assert result.queue_offsets == [1, 3, 5, 7, 9]
    assert {decode(v).tags for v in result.records} == {"a"}
    assert result.next_offset == 10


def test_tag_filter_next_offset_skips_the_unmatched_entries_it_scanned(
    ten: MessageStore,
) -> None:
    result = ten.get("orders", 0, 0, max_messages=2, tag_codes={tag_code("b")})

    assert result.queue_offsets == [0, 2]
    assert result.next_offset == 3
    following = ten.get("orders", 0, result.next_offset, max_messages=2, tag_codes={tag_code("b")})
    assert following.queue_offsets == [4, 6]


def test_tag_filter_matching_nothing_is_no_matched_message_past_what_it_scanned(
    ten: MessageStore,
) -> None:
    result = ten.get("orders", 0, 3, tag_codes={tag_code("zzz")})

    assert (result.status, result.records, result.next_offset) == (
        GetStatus.NO_MATCHED_MESSAGE,
        [],
        10,
    )


def test_tag_filter_accepts_any_of_several_codes(ten: MessageStore) -> None:
    result = ten.get("orders", 0, 0, tag_codes={tag_code("a"), tag_code("b")})

    assert result.queue_offsets == list(range(10))


def test_lag_is_max_offset_minus_consumed(ten: MessageStore) -> None:
    consumed = 0
    lags = []
    while True:
        lags.append(ten.max_offset("orders", 0) - consumed)
        result = ten.get("orders", 0, consumed, max_messages=4)
        if result.status is not GetStatus.FOUND:
            break
        consumed = result.next_offset

    assert lags == [10, 6, 2, 0]
    ten.append([encode("orders", b"more") for _ in range(3)])
    ten.dispatcher.catch_up()
    assert ten.max_offset("orders", 0) - consumed == 3


def test_record_bytes_are_sliced_not_copied_and_decode_with_a_good_crc(
    ten: MessageStore,
) -> None:
    result = ten.get("orders", 0, 0, max_messages=10)

    for n, view in enumerate(result.records):
        assert isinstance(view, memoryview)
        record = decode(view)
        assert record.body == bytes([n]) * 1000 and record.size == len(view)
        assert len(view) == HEADER_SIZE + len("orders") + 1 + 1000
    result.release()
    assert result.records == []


def test_every_segment_stays_findable_at_every_step_of_a_rollover(open_store: OpenStore) -> None:
    """Readers search the segment lists without a lock, so a rollover must never hide one.

    A profile hook runs at every Python call made while appends and dispatch add commitlog
    and consume-queue files: each such point is where another thread could take over and
    read. Deterministic, unlike racing real threads.
    """
    store = open_store(
        commitlog_segment_bytes=16 * 1024,
        max_message_bytes=4096,
        max_properties_bytes=1024,
        consume_queue_segment_entries=4,
    )
    store.dispatch_service.stop()  # dispatch on this thread, where the hook runs
    store.append([encode("t", bytes(3000))])
    store.dispatcher.catch_up()
    queue = store.queues.get(b"t", 0)
    assert queue is not None
    hidden: list[str] = []

    def look(frame: object, event: str, arg: object) -> None:
        if event == "call":
            if store.commitlog.segments.find(0) is None:
                hidden.append("commitlog")
            if queue.segments.find(0) is None:
                hidden.append("consume queue")

    sys.setprofile(look)
    try:
        for _ in range(40):  # a commitlog file every 5 appends, a queue file every 4
            store.append([encode("t", bytes(3000))])
            store.dispatcher.catch_up()
    finally:
        sys.setprofile(None)

    assert len(store.commitlog.segments.segments) >= 8
    assert len(queue.segments.segments) >= 10
    assert sorted(set(hidden)) == []
    assert [s.start for s in queue.segments.segments] == sorted(
        s.start for s in queue.segments.segments
    )


def test_an_offset_appended_but_not_yet_dispatched_reads_as_nothing_new_not_as_wrong(
    open_store: OpenStore,
) -> None:
    store = open_store()
    store.dispatch_service.stop()  # entries stay invisible until dispatched by hand
    store.append([encode("T", b"first", queue_id=0), encode("T", b"second", queue_id=0)])

    pending = store.get("T", 0, 1)
    beyond = store.get("T", 0, 3)

    assert (pending.status, pending.next_offset) == (GetStatus.OFFSET_OVERFLOW_ONE, 1)
    assert beyond.status is GetStatus.OFFSET_OVERFLOW_BADLY
    store.dispatcher.catch_up()
    assert store.get("T", 0, 1).status is GetStatus.FOUND


def _two_runs(store: MessageStore, topic: str) -> tuple[Appended, Appended]:
    """Queue 0 of ``topic`` gets records 0-4 and 5-7 in two runs, queue 1's record between."""
    first = store.append([encode(topic, bytes([n]) * 100) for n in range(5)])
    store.append([encode(topic, b"other queue", queue_id=1)])
    second = store.append([encode(topic, bytes([n]) * 100) for n in range(5, 8)])
    store.dispatcher.catch_up()
    return first, second


def test_a_queues_adjacent_records_are_read_as_one_span_and_split_where_others_lie_between(
    open_store: OpenStore,
) -> None:
    store = open_store()
    first, second = _two_runs(store, "spans")

    result = store.get("spans", 0, 0)

    assert (result.status, result.count, result.next_offset) == (GetStatus.FOUND, 8, 8)
    assert result.span_starts == [first.commitlog_offsets[0], second.commitlog_offsets[0]]
    assert [len(span) for span in result.spans] == [
        first.end - first.start,
        second.end - second.start,
    ]
    assert [decode(r).body[0] for r in result.records] == list(range(8))
    assert result.queue_offsets == list(range(8))
    assert (result.log_start, result.log_end) == (first.start, second.end)


def test_a_span_never_runs_past_the_end_of_its_file(open_store: OpenStore) -> None:
    segment_bytes = 16 * 1024
    store = open_store(
        commitlog_segment_bytes=segment_bytes, max_message_bytes=8192, max_properties_bytes=1024
    )
    overhead = len(encode("fill", b""))
    # Back to back in the log, but the second ends the first file and the third opens the next.
    store.append([encode("fill", bytes(segment_bytes // 2 - overhead)) for _ in range(2)])
    store.append([encode("fill", b"next")])
    store.dispatcher.catch_up()

    result = store.get("fill", 0, 0)

    assert result.count == 3
    assert result.span_starts == [0, segment_bytes]
    assert [len(span) for span in result.spans] == [segment_bytes, len(result.records[2])]


def test_keep_below_cuts_inside_a_span_and_drops_the_spans_past_the_cut(
    open_store: OpenStore,
) -> None:
    store = open_store()
    first, second = _two_runs(store, "cut")

    inside = store.get("cut", 0, 0)
    inside.keep_below(first.commitlog_offsets[3])
    past = store.get("cut", 0, 0)
    past.keep_below(second.commitlog_offsets[0])
    nothing = store.get("cut", 0, 0)
    nothing.keep_below(first.start)

    assert (inside.count, inside.queue_offsets, inside.log_end) == (
        3, [0, 1, 2], first.commitlog_offsets[3],
    )  # fmt: skip
    assert (past.count, len(past.spans), past.log_end) == (5, 1, first.end)
    assert (nothing.count, nothing.spans, nothing.log_start) == (0, [], -1)


def test_a_run_stops_at_the_end_of_what_the_log_holds(open_store: OpenStore) -> None:
    """Entries left past the log's end (a cut the consume queue has yet to follow) are
    not served, though their records lie back to back with the ones before."""
    store = open_store()
    appended = store.append([encode("cut-end", bytes([n]) * 100) for n in range(5)])
    store.dispatcher.catch_up()
    store.commitlog.set_end(appended.commitlog_offsets[3])

    result = store.get("cut-end", 0, 0)

    assert (result.count, result.next_offset) == (3, 3)
    assert result.log_end == appended.commitlog_offsets[3]


def test_reads_over_whole_arrays_find_what_the_record_loop_finds(
    open_store: OpenStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large unfiltered reads take numpy's arrays; whatever the runs, files, byte bound
    and log end, they must answer exactly as the loop over records does."""
    store = open_store(
        commitlog_segment_bytes=64 * 1024, max_message_bytes=8192, max_properties_bytes=1024
    )
    rng = random.Random(7)
    for _ in range(80):  # runs of every length, in four queues, across many files
        queue_id = rng.randrange(3)
        store.append(
            [
                encode("mix", rng.randbytes(rng.randrange(10, 3000)), queue_id=queue_id)
                for _ in range(rng.randrange(1, 60))
            ]
        )
        # Queue 3's records are all of one size, so a byte bound can fall exactly on one.
        store.append([encode("mix", bytes(500), queue_id=3) for _ in range(rng.randrange(1, 60))])
    same_size = len(encode("mix", bytes(500), queue_id=3))
    store.dispatcher.catch_up()
    # Entries past the log's end, as a cut the consume queues have yet to follow leaves.
    store.commitlog.set_end(store.commitlog.write_offset - 5000)

    def read_all() -> list[tuple[object, ...]]:
        answers: list[tuple[object, ...]] = []
        for queue_id in range(4):
            for offset in range(0, store.max_offset("mix", queue_id), 7):
                for max_messages, max_bytes in (
                    (64, 1 << 20), (256, 20_000), (100, 1), (200, 60 * same_size),
                ):  # fmt: skip
                    result = store.get(
                        "mix", queue_id, offset, max_messages=max_messages, max_bytes=max_bytes
                    )
                    spans = [bytes(span) for span in result.spans]
                    answers.append((result.status, result.count, result.next_offset,
                                    result.log_start, result.log_end, result.span_starts,
                                    spans))  # fmt: skip
                    result.release()
        return answers

    taken = 0
    read_runs = reads._read_runs

    def counted(*args: Any) -> bool:
        nonlocal taken
        found = read_runs(*args)
        taken += found
        return found

    monkeypatch.setattr(reads, "_WHOLE_ARRAYS_FROM", sys.maxsize)
    by_record = read_all()
    monkeypatch.setattr(reads, "_WHOLE_ARRAYS_FROM", 1)
    monkeypatch.setattr(reads, "_read_runs", counted)
    by_array = read_all()

    assert by_array == by_record
    assert taken > len(by_array) // 2  # not every read fell back to the loop
