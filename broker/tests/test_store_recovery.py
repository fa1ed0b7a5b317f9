"""Restarting the store: after a clean close, after halt() (a crash), and after file damage."""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.broker.store import GetStatus, MessageStore, StoreConfig
from metaq.common.errors import CorruptLog, StoreUnavailable
from metaq.common.record import decode, encode

OpenStore = Callable[..., MessageStore]
Reads = dict[tuple[str, int], list[bytes]]

TOPICS = ("orders", "audit")


def fill(store: MessageStore, count: int, *, seed: int = 0, body_max: int = 600) -> list[int]:
    """Append ``count`` messages over two topics and three queues; return their offsets."""
    rng = random.Random(seed)
    offsets: list[int] = []
    while len(offsets) < count:
        batch = [
            encode(
                rng.choice(TOPICS),
                rng.randbytes(rng.randint(1, body_max)),
                queue_id=rng.randrange(3),
                keys=[f"key-{seed}-{len(offsets) + n}"],
            )
            for n in range(min(rng.randint(1, 8), count - len(offsets)))
        ]
        offsets.extend(store.append(batch).commitlog_offsets)
    store.dispatcher.catch_up()
    return offsets


def read_all(store: MessageStore) -> Reads:
    """Every queue's records from offset 0, as bytes."""
    out: Reads = {}
    for topic_b, queue_id in sorted(store.queues.queues):
        topic = topic_b.decode()
        records: list[bytes] = []
        offset = store.min_offset(topic, queue_id)
        while True:
            result = store.get(topic, queue_id, offset, max_messages=64)
            if result.status is not GetStatus.FOUND:
                assert result.status is GetStatus.OFFSET_OVERFLOW_ONE, result.status
                break
            records.extend(bytes(v) for v in result.records)
            offset = result.next_offset
        out[(topic, queue_id)] = records
    return out


def segment_path(config: StoreConfig, offset: int) -> Path:
    size = config.commitlog_segment_bytes
    return config.commitlog_dir / f"{offset - offset % size:020d}"


def write_at(config: StoreConfig, offset: int, data: bytes) -> None:
    """Overwrite commitlog bytes at a log offset, through the file (the store is down)."""
    path = segment_path(config, offset)
    with path.open("r+b") as f:
        f.seek(offset % config.commitlog_segment_bytes)
        f.write(data)


def read_at(config: StoreConfig, offset: int, size: int) -> bytes:
    with segment_path(config, offset).open("rb") as f:
        f.seek(offset % config.commitlog_segment_bytes)
        return f.read(size)


def flip_bit(config: StoreConfig, offset: int) -> None:
    (byte,) = read_at(config, offset, 1)
    write_at(config, offset, bytes([byte ^ 0x10]))


def record_size(config: StoreConfig, offset: int) -> int:
    return int.from_bytes(read_at(config, offset, 4), "little")


def without(reads: Reads, offset: int) -> Reads:
    """``reads`` minus the record stored at commitlog ``offset``."""
    return {
        key: [r for r in records if decode(r).commitlog_offset != offset]
        for key, records in reads.items()
    }


# --- clean restarts -----------------------------------------------------------------------


def test_clean_close_then_restart_trusts_the_files(open_store: OpenStore) -> None:
    store = open_store()
    fill(store, 200)
    before = read_all(store)
    end = store.commitlog.write_offset
    store.close()
    assert not (store.config.data_dir / "abort").exists()

    store = open_store(store.config)
    report = store.recovery

    assert report is not None
    assert (report.crashed, report.full_rebuild, report.redispatched_records) == (False, False, 0)
    assert report.tail_reason == "clean shutdown"
    assert report.commitlog_end == store.commitlog.write_offset == end
    assert read_all(store) == before
    appended = store.append([encode("orders", b"next", queue_id=q) for q in range(3)])
    assert appended.start == end
    assert appended.queue_offsets == [len(before[("orders", q)]) for q in range(3)]


def test_a_new_data_dir_is_a_new_store_not_a_crash(open_store: OpenStore) -> None:
    store = open_store()

    assert store.recovery is not None
    assert (store.recovery.crashed, store.recovery.full_rebuild) == (False, False)
    assert (store.config.data_dir / "abort").exists()


# --- crashes: torn tails ------------------------------------------------------------------


def _partial_record(last: bytes) -> bytes:
    return last[: len(last) // 2]


def _header_claiming_more(last: bytes) -> bytes:
    return last[:100]


def _stale_copy(last: bytes) -> bytes:
    return last  # intact and CRC-correct, but stamped with another offset


def _garbage(last: bytes) -> bytes:
    return random.Random(9).randbytes(300)


@pytest.mark.parametrize("tail", [_partial_record, _header_claiming_more, _stale_copy, _garbage])
@pytest.mark.parametrize("checkpointed", [False, True], ids=["no-checkpoint", "checkpointed"])
def test_torn_tail_after_a_crash_is_cut_and_appends_resume_there(
    open_store: OpenStore, tail: Callable[[bytes], bytes], checkpointed: bool
) -> None:
    store = open_store()
    offsets = fill(store, 150)
    if checkpointed:
        store.flusher.flush()
        store.checkpoint()
    before = read_all(store)
    end = store.commitlog.write_offset
    config = store.config
    store.halt()
    junk = tail(read_at(config, offsets[-1], end - offsets[-1]))
    write_at(config, end, junk)

    store = open_store(config)

    report = store.recovery
    assert report is not None and report.crashed
    assert report.commitlog_end == store.commitlog.write_offset == end
    assert read_all(store) == before
    store.close()
    assert read_at(config, end, len(junk)) == bytes(len(junk))  # the junk was zeroed
    store = open_store(config)
    appended = store.append([encode("orders", b"after the cut", queue_id=0)])
    assert appended.start == end
    assert appended.queue_offsets == [len(before[("orders", 0)])]
    store.dispatcher.catch_up()
    assert decode(read_all(store)[("orders", 0)][-1]).body == b"after the cut"


def test_a_bit_flipped_in_the_last_record_cuts_just_that_record(open_store: OpenStore) -> None:
    store = open_store()
    offsets = fill(store, 120)
    before = read_all(store)
    config = store.config
    last = offsets[-1]
    last_record = decode(read_at(config, last, record_size(config, last)))
    store.halt()
    flip_bit(config, last + record_size(config, last) - 1)  # in its body

    store = open_store(config)

    report = store.recovery
    assert report is not None
    assert report.commitlog_end == store.commitlog.write_offset == last
    assert "CRC" in report.tail_reason
    assert read_all(store) == without(before, last)
    key = (last_record.topic, last_record.queue_id)
    assert store.max_offset(*key) == last_record.queue_offset
    assert store.lookup_id(last_record.msg_id) is None
    appended = store.append([encode(last_record.topic, b"again", queue_id=last_record.queue_id)])
    assert (appended.start, appended.queue_offsets) == (last, [last_record.queue_offset])


# --- corruption in the middle -------------------------------------------------------------


def _multi_segment_store(open_store: OpenStore) -> tuple[MessageStore, list[int]]:
    store = open_store(commitlog_segment_bytes=256 * 1024)
    offsets = fill(store, 300, body_max=6000)
    assert store.commitlog.write_offset > 3 * 256 * 1024
    return store, offsets


@pytest.mark.parametrize(
    ("which", "checkpointed"),
    [
        # After a crash, validation starts at the segment holding the checkpoint's offsets.
        ("start-of-last-segment", True),
        ("inside-last-segment", True),
        # Without a checkpoint the whole log is validated.
        ("first-segment", False),
        ("middle-segment", False),
    ],
)
def test_a_bit_flipped_mid_log_stops_start_naming_the_file_and_offset(
    open_store: OpenStore, which: str, checkpointed: bool
) -> None:
    store, offsets = _multi_segment_store(open_store)
    config = store.config
    store.flusher.flush()
    store.checkpoint()
    last_segment = store.commitlog.write_offset - store.commitlog.write_offset % (256 * 1024)
    store.halt()
    if not checkpointed:
        (config.data_dir / "checkpoint").unlink()
    in_last = [o for o in offsets if o >= last_segment]
    assert len(in_last) > 4
    victim = {
        "start-of-last-segment": in_last[0],
        "inside-last-segment": in_last[-3],
        "first-segment": offsets[3],
        "middle-segment": next(o for o in offsets if o > 256 * 1024 + 1000),
    }[which]
    flip_bit(config, victim + record_size(config, victim) - 2)

    with pytest.raises(CorruptLog) as info:
        MessageStore(config).start()

    path = segment_path(config, victim)
    assert info.value.path == str(path)
    assert info.value.offset == victim
    assert str(path) in str(info.value)
    assert f"commitlog offset {victim}" in str(info.value)
    assert "CRC mismatch" in str(info.value)


def test_mid_log_damage_without_a_checkpoint_is_corruption_too(open_store: OpenStore) -> None:
    store, offsets = _multi_segment_store(open_store)
    config = store.config
    store.close()
    (config.data_dir / "checkpoint").unlink()
    victim = offsets[len(offsets) // 2]
    flip_bit(config, victim + 120)

    with pytest.raises(CorruptLog, match=f"commitlog offset {victim}"):
        MessageStore(config).start()


def test_a_start_refused_for_corruption_frees_the_directory_for_a_retry(
    open_store: OpenStore,
) -> None:
    store = open_store()
    offsets = fill(store, 100)
    before = read_all(store)
    config = store.config
    store.flusher.flush()
    store.checkpoint()
    store.halt()
    victim = offsets[50] + 110
    flip_bit(config, victim)
    with pytest.raises(CorruptLog):
        MessageStore(config).start()

    flip_bit(config, victim)  # the operator restores the segment from a replica
    store = open_store(config)

    assert read_all(store) == before


def test_mid_log_damage_is_caught_after_a_crash_right_after_a_restart(
    open_store: OpenStore,
) -> None:
    """The checkpoint written at start must not forget that the recovered log is durable."""
    store = open_store()
    offsets = fill(store, 100)
    config = store.config
    store.close()
    store = open_store(config)
    store.halt()  # before any periodic checkpoint
    victim = offsets[40]
    flip_bit(config, victim + 110)

    with pytest.raises(CorruptLog, match=f"commitlog offset {victim}"):
        MessageStore(config).start()


# --- lost checkpoint and lost consume queues ----------------------------------------------


@pytest.mark.parametrize("stop", ["close", "halt"])
def test_without_a_checkpoint_everything_is_rebuilt_from_the_commitlog(
    open_store: OpenStore, stop: str
) -> None:
    store = open_store()
    offsets = fill(store, 200)
    store.flusher.flush()
    store.checkpoint()
    before = read_all(store)
    first = decode(before[("orders", 0)][0])
    config = store.config
    getattr(store, stop)()
    (config.data_dir / "checkpoint").unlink()

    store = open_store(config)

    report = store.recovery
    assert report is not None
    assert (report.crashed, report.full_rebuild) == (True, True)
    assert report.redispatched_records == len(offsets)
    assert read_all(store) == before
    found = store.lookup_id(first.msg_id)
    assert found is not None and found.commitlog_offset == first.commitlog_offset
    assert store.append([encode("orders", b"x")]).queue_offsets == [len(before[("orders", 0)])]


@pytest.mark.parametrize("stop", ["close", "halt"])
@pytest.mark.parametrize("lost", ["all-queues", "one-queue"])
def test_lost_consume_queue_files_are_rebuilt(open_store: OpenStore, stop: str, lost: str) -> None:
    store = open_store(consume_queue_segment_entries=16)
    fill(store, 200)
    store.flusher.flush()
    store.checkpoint()
    before = read_all(store)
    config = store.config
    getattr(store, stop)()
    if lost == "all-queues":
        shutil.rmtree(config.consume_queue_dir)
    else:
        shutil.rmtree(config.consume_queue_dir / "audit" / "1")

    store = open_store(config)

    assert store.recovery is not None and store.recovery.full_rebuild
    assert read_all(store) == before
    appended = store.append([encode("audit", b"x", queue_id=1)])
    assert appended.queue_offsets == [len(before[("audit", 1)])]


def test_queues_dispatched_after_the_last_checkpoint_are_redispatched(
    open_store: OpenStore,
) -> None:
    store = open_store()
    fill(store, 50, seed=1)
    store.flusher.flush()
    store.checkpoint()
    fill(store, 70, seed=2)  # in the log but not covered by the checkpoint
    before = read_all(store)
    config = store.config
    store.halt()

    store = open_store(config)

    report = store.recovery
    assert report is not None
    assert report.crashed and not report.full_rebuild
    # The 70 past the checkpoint, plus whatever the newest index file held: a crash may
    # leave that file's slots naming lost entries, so it is rebuilt too.
    assert 70 <= report.redispatched_records <= 120
    assert read_all(store) == before


# --- the property: whatever was appended before a crash is there after it ----------------

SMALL_CONFIG = {
    "commitlog_segment_bytes": 16 * 1024,
    "max_message_bytes": 4096,
    "max_properties_bytes": 1024,
    "consume_queue_segment_entries": 8,
    "index_slots": 8,
    "index_entries": 64,
    "flush_interval_ms": 3_600_000,
    "checkpoint_interval_ms": 3_600_000,
    "clean_interval_s": 3_600.0,
}

_message = st.tuples(
    st.sampled_from(["a", "b"]), st.integers(0, 2), st.integers(0, 3000), st.booleans()
)
_step = st.one_of(
    st.lists(_message, min_size=1, max_size=8).map(lambda batch: ("append", batch)),
    st.just(("dispatch", [])),
    st.just(("checkpoint", [])),
)


def producer_fields(raw: bytes | bytearray) -> bytes:
    """A record without what the broker stamps: the CRC (8-12) and bytes 16-48."""
    return bytes(raw[:8] + raw[12:16] + raw[48:])


def assert_holds(store: MessageStore, sent: dict[tuple[str, int], list[bytearray]]) -> None:
    """Every queue holds exactly what was sent to it, in order, with offsets 0..n-1."""
    stored = read_all(store)
    assert stored.keys() == sent.keys()
    for key, records in sent.items():
        assert [producer_fields(r) for r in stored[key]] == [producer_fields(r) for r in records]
        assert [decode(r).queue_offset for r in stored[key]] == list(range(len(records)))


@settings(max_examples=25, deadline=None)
@given(steps=st.lists(_step, min_size=1, max_size=12), restarts=st.integers(1, 2))
def test_every_append_survives_crashes_and_queue_offsets_continue_without_gaps(
    steps: list[tuple[str, list[tuple[str, int, int, bool]]]], restarts: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = StoreConfig(data_dir=Path(tmp), **SMALL_CONFIG)  # type: ignore[arg-type]
        sent: dict[tuple[str, int], list[bytearray]] = {}
        for _ in range(restarts):
            store = MessageStore(config, disk_usage=lambda _p: 0.0)
            store.start()
            try:
                assert_holds(store, sent)
                for action, batch in steps:
                    if action == "dispatch":
                        store.dispatcher.catch_up()
                    elif action == "checkpoint":
                        store.flusher.flush()
                        store.checkpoint()
                    else:
                        records = [
                            encode(t, bytes([q]) * size, queue_id=q, keys=["k"] if key else ())
                            for t, q, size, key in batch
                        ]
                        appended = store.append(records)
                        for (t, q, _, _), raw, queue_offset in zip(
                            batch, records, appended.queue_offsets, strict=True
                        ):
                            assert queue_offset == len(sent.setdefault((t, q), []))
                            sent[(t, q)].append(raw)
            finally:
                store.halt()
        store = MessageStore(config, disk_usage=lambda _p: 0.0)
        store.start()
        try:
            assert_holds(store, sent)
            for (topic, queue_id), records in sent.items():
                appended = store.append([encode(topic, b"next", queue_id=queue_id)])
                assert appended.queue_offsets == [len(records)]
        finally:
            store.close()


# --- the data-dir lock -------------------------------------------------------------------


def test_a_second_store_on_the_same_data_dir_is_refused(open_store: OpenStore) -> None:
    store = open_store()

    with pytest.raises(StoreUnavailable, match="in use by another process"):
        MessageStore(store.config).start()

    store.put("orders", b"still mine")  # the first store is unaffected
    store.close()
    second = open_store(store.config)
    assert second.recovery is not None and not second.recovery.crashed


# --- a replica's damaged records ----------------------------------------------------------


def _damage(store: MessageStore, offsets: list[int], *, crash: bool) -> tuple[int, bytes]:
    """Flip a bit in the body of a record in the middle; return its offset and good bytes."""
    config = store.config
    victim = offsets[len(offsets) // 2]
    good = read_at(config, victim, record_size(config, victim))
    store.flusher.flush()
    store.checkpoint()
    if crash:
        store.halt()
    else:
        store.close()
    flip_bit(config, victim + len(good) - 1)
    return victim, good


def _pull_around(store: MessageStore, victim: int) -> tuple[str, int, int]:
    record = decode(bytes(store.commitlog.slice(victim, record_size(store.config, victim)) or b""),
                    verify=False)  # fmt: skip
    return record.topic, record.queue_id, record.queue_offset


def test_a_replica_recovering_from_a_crash_keeps_the_damaged_record_aside(
    open_store: OpenStore,
) -> None:
    store = open_store(keep_damaged_records=True)
    offsets = fill(store, 200)
    before = read_all(store)
    victim, good = _damage(store, offsets, crash=True)
    # The checkpoint is past the damage, so only a recovery from before it would see it.
    config = store.config
    (config.data_dir / "checkpoint").unlink()

    store = open_store(config)

    assert store.commitlog.damaged == {victim: len(good)}
    assert store.commitlog.write_offset > victim  # nothing after it was cut
    topic, queue_id, queue_offset = _pull_around(store, victim)
    early = store.get(topic, queue_id, 0, max_messages=10_000)
    assert early.status is GetStatus.FOUND
    assert early.next_offset == queue_offset  # the batch stops before the damaged record
    with pytest.raises(StoreUnavailable, match="damaged"):
        store.get(topic, queue_id, queue_offset)

    store.commitlog.repair(victim, good)

    assert store.commitlog.damaged == {}
    assert read_at(config, victim, len(good)) == good
    assert read_all(store) == before


def test_a_standalone_store_still_refuses_to_start_on_mid_log_damage(
    open_store: OpenStore,
) -> None:
    store = open_store()
    offsets = fill(store, 200)
    victim, _ = _damage(store, offsets, crash=True)
    (store.config.data_dir / "checkpoint").unlink()
    with pytest.raises(CorruptLog, match=f"offset {victim}"):
        open_store(store.config)


def test_check_finds_damage_the_start_after_a_clean_stop_trusted(open_store: OpenStore) -> None:
    store = open_store(keep_damaged_records=True)
    offsets = fill(store, 200)
    before = read_all(store)
    victim, good = _damage(store, offsets, crash=False)
    store = open_store(store.config)
    assert store.commitlog.damaged == {}  # a clean start trusts the files

    reached = store.commitlog.check(store.commitlog.min_offset, store.commitlog.write_offset)

    assert reached == store.commitlog.write_offset
    assert store.commitlog.damaged == {victim: len(good)}
    topic, queue_id, queue_offset = _pull_around(store, victim)
    with pytest.raises(StoreUnavailable, match="waits for repair from its master"):
        store.get(topic, queue_id, queue_offset)
    store.commitlog.repair(victim, good)
    assert read_all(store) == before


def test_a_copy_that_is_no_better_is_refused_and_the_record_stays_damaged(
    open_store: OpenStore,
) -> None:
    store = open_store(keep_damaged_records=True)
    offsets = fill(store, 50)
    victim, good = _damage(store, offsets, crash=False)
    store = open_store(store.config)
    store.commitlog.check(store.commitlog.min_offset, store.commitlog.write_offset)
    bad = read_at(store.config, victim, len(good))

    with pytest.raises(CorruptLog, match="the master's copy"):
        store.commitlog.repair(victim, bad)

    assert store.commitlog.damaged == {victim: len(good)}
    assert read_at(store.config, victim, len(good)) == bad


def test_a_header_that_makes_no_sense_stops_the_check(open_store: OpenStore) -> None:
    store = open_store(keep_damaged_records=True)
    offsets = fill(store, 50)
    victim = offsets[25]
    store.close()
    flip_bit(store.config, victim + 5)  # in the magic
    store = open_store(store.config)
    with pytest.raises(CorruptLog, match=f"offset {victim}: bad magic"):
        store.commitlog.check(store.commitlog.min_offset, store.commitlog.write_offset)
