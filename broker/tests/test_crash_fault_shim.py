"""Power-loss tests through LossyDisk: what a sync covered survives, and nothing else does."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

import metaq.testing.store_crash as support
from metaq.broker.store import FlushMode, MessageStore, PutStatus, StoreConfig
from metaq.broker.store.commitlog import Appended
from metaq.common.record import encode
from metaq.testing.lossy_disk import LossyDisk

TOPICS = ("orders", "audit")
QUEUES = 3


@dataclass(frozen=True)
class Acked:
    uid: str
    topic: str
    queue_id: int
    commitlog_offset: int
    queue_offset: int
    body: bytes
    raw: bytes | None  # the stored record as read back at ack time, when the read won


def _body(rng: random.Random, large: bool = False) -> bytes:
    if large:
        return rng.randbytes(rng.randrange(6_000, 12_000))
    return rng.randbytes(rng.choice((0, 1, rng.randrange(2, 300), rng.randrange(300, 4_000))))


def _open(config: StoreConfig, disk: LossyDisk) -> MessageStore:
    store: MessageStore = support.open_store(config, disk=disk)
    return store


def _put_under_load_then_halt(
    store: MessageStore, seed: int, cycle: int, target: int
) -> list[Acked]:
    """Three writers put until ``target`` puts are acknowledged, then the store halts
    under them (puts in flight then fail or time out); returns the acknowledged puts."""
    halted = threading.Event()
    progress = threading.Condition()
    acked: list[Acked] = []
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        rng = random.Random(seed * 1000 + cycle * 10 + w)
        n = 0
        while not halted.is_set():
            uid = f"c{cycle}-w{w}-{n}"
            n += 1
            # One put in five is large, so segments roll often and group commits span rolls.
            large = rng.random() < 0.2
            topic, queue_id, body = rng.choice(TOPICS), rng.randrange(QUEUES), _body(rng, large)
            try:
                result = store.put(
                    topic, body, queue_id=queue_id, keys=[uid], properties={"uid": uid}
                )
            except Exception as exc:
                # Racing the halt may fail in many ways (the store is being torn down
                # under the writer); before the halt nothing may fail.
                if not halted.is_set():
                    errors.append(exc)
                return
            if result.status is not PutStatus.OK:
                continue
            # A record that did not fit starts in the next segment, past a blank.
            offset = result.appended.commitlog_offsets[0]
            view = store.commitlog.slice(offset, result.appended.end - offset)
            raw = bytes(view) if view is not None and not halted.is_set() else None
            queue_offset = result.appended.queue_offsets[0]
            with progress:
                acked.append(Acked(uid, topic, queue_id, offset, queue_offset, body, raw))
                progress.notify_all()

    threads = [threading.Thread(target=writer, args=(w,), name=f"writer-{w}") for w in range(3)]
    for thread in threads:
        thread.start()
    try:
        with progress:
            reached = progress.wait_for(lambda: len(acked) >= target or bool(errors), 30.0)
        assert reached, f"only {len(acked)} of {target} puts acknowledged in 30 s"
    finally:
        halted.set()
        store.halt()
        for thread in threads:
            # A put caught waiting for a flush that will never come times out.
            thread.join(timeout=10.0)
    assert not any(t.is_alive() for t in threads), "a writer is stuck after the halt"
    assert not errors, errors
    return acked


def test_sync_flush_every_acknowledged_put_survives_power_loss(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = support.small_config(data, FlushMode.SYNC, flush_timeout_ms=1_000)
    disk = LossyDisk(data)
    acked: list[Acked] = []
    store = _open(config, disk)
    try:
        for cycle in range(3):
            acked += _put_under_load_then_halt(store, seed=3, cycle=cycle, target=200)
            disk.drop_unsynced()
            store = _open(config, disk)
            assert store.recovery is not None and store.recovery.crashed
            found = support.check_store(store)
            by_offset = {record.commitlog_offset: (record, raw) for record, raw in found}
            for a in acked:
                assert a.commitlog_offset in by_offset, f"acknowledged {a.uid} lost"
                record, raw = by_offset[a.commitlog_offset]
                assert record.properties["uid"] == a.uid
                assert (record.topic, record.queue_id, record.queue_offset, record.body) == (
                    a.topic,
                    a.queue_id,
                    a.queue_offset,
                    a.body,
                )
                if a.raw is not None:
                    assert raw == a.raw
            uids = [record.properties["uid"] for record, _ in found]
            assert len(uids) == len(set(uids)), "a record is stored twice"
        # The last restart takes writes again, and they continue each queue's offsets.
        result = store.put("orders", b"after", queue_id=1, properties={"uid": "after"})
        assert result.status is PutStatus.OK
        assert result.appended.queue_offsets == [
            sum(1 for r, _ in found if (r.topic, r.queue_id) == ("orders", 1))
        ]
        store.dispatcher.catch_up()
        support.check_store(store)
    finally:
        store.close()


def _append_some(
    store: MessageStore, rng: random.Random, prefix: str, count: int, large: bool = False
) -> list[bytes]:
    """Append ``count`` messages by put() and in small batches; return them as stored."""
    stored: list[bytes] = []
    n = 0
    while n < count:
        batch = min(rng.choice((1, 1, 2, 4)), count - n)
        specs = [
            (rng.choice(TOPICS), rng.randrange(QUEUES), _body(rng, large), f"{prefix}-{n + i}")
            for i in range(batch)
        ]
        appended: Appended
        if batch == 1:
            topic, queue_id, body, uid = specs[0]
            result = store.put(topic, body, queue_id=queue_id, properties={"uid": uid})
            assert result.status is PutStatus.OK
            appended = result.appended
            sizes = [appended.end - appended.commitlog_offsets[0]]
        else:
            records = [
                encode(topic, body, queue_id=queue_id, properties={"uid": uid})
                for topic, queue_id, body, uid in specs
            ]
            appended = store.append(records)
            sizes = [len(r) for r in records]
        for offset, size in zip(appended.commitlog_offsets, sizes, strict=True):
            view = store.commitlog.slice(offset, size)
            assert view is not None
            stored.append(bytes(view))
        n += batch
    return stored


@pytest.mark.parametrize("checkpoint_after_tail", [False, True], ids=["no-ckpt", "ckpt"])
def test_async_flush_loses_exactly_the_unflushed_tail(
    tmp_path: Path, checkpoint_after_tail: bool
) -> None:
    data = tmp_path / "data"
    # The flusher never runs on its own here: only the explicit flush() makes data durable.
    config = support.small_config(
        data,
        FlushMode.ASYNC,
        flush_interval_ms=3_600_000,
        flush_dirty_bytes=1 << 40,
        checkpoint_interval_ms=3_600_000,
    )
    disk = LossyDisk(data)
    rng = random.Random(11)
    survivors: list[bytes] = []
    store = _open(config, disk)
    try:
        for cycle in range(3):
            # Both parts exceed a segment: the flush must cover every segment written since
            # the last one, and the tail leaves a whole never-synced segment file to lose.
            flushed = _append_some(store, rng, f"c{cycle}-flushed", 40, large=True)
            assert store.flusher.flush() == store.commitlog.write_offset
            tail = _append_some(store, rng, f"c{cycle}-tail", 40, large=True)
            assert min(sum(map(len, flushed)), sum(map(len, tail))) > support.SEGMENT_BYTES
            if checkpoint_after_tail:
                # Queues and index become durable past the commitlog: recovery must cut them.
                store.dispatcher.catch_up()
                store.checkpoint()
            written = store.commitlog.write_offset
            durable = store.flusher.durable
            store.halt()
            disk.drop_unsynced()

            store = _open(config, disk)
            got = [raw for _, raw in support.check_store(store)]
            appended = survivors + flushed + tail
            assert got == appended[: len(got)], "the survivors are not a prefix of the log"
            end = store.commitlog.write_offset
            assert durable <= end <= written, "lost more than was written since the last flush"
            assert got[-1] == flushed[-1], "a message appended before flush() was lost"
            assert got == survivors + flushed, "lost other than exactly the unflushed tail"
            survivors = got
        # The restarted store appends again, continuing every queue without a gap.
        more = _append_some(store, rng, "after", 20)
        store.flusher.flush()
        store.dispatcher.catch_up()
        assert [raw for _, raw in support.check_store(store)] == survivors + more
    finally:
        store.close()


@pytest.mark.parametrize("free", [0, 7, 8, 11, 12, 93, 99, 100])
def test_segment_ending_in_a_short_blank_recovers(tmp_path: Path, free: int) -> None:
    """A segment left with ``free`` bytes that no record fits into (a blank of 8 bytes up,
    nothing below 8) is dispatched, and recovered after a power loss, like any other."""
    data = tmp_path / "data"
    config = support.small_config(data, FlushMode.SYNC)
    disk = LossyDisk(data)
    store = _open(config, disk)
    try:
        overhead = len(encode("fill", b""))
        while (room := support.SEGMENT_BYTES - free - store.commitlog.write_offset) > 0:
            body = bytes(min(room - overhead, 60_000))
            assert store.put("fill", body).status is PutStatus.OK
        assert store.commitlog.write_offset == support.SEGMENT_BYTES - free
        # Does not fit: seals the segment (a blank if 8 bytes or more) and rolls.
        assert store.put("fill", bytes(500), queue_id=1).status is PutStatus.OK
        store.dispatcher.catch_up()
        before = [raw for _, raw in support.check_store(store)]
        store.halt()
        disk.drop_unsynced()
        store = _open(config, disk)
        assert [raw for _, raw in support.check_store(store)] == before
        assert store.put("fill", b"after", queue_id=1).appended.queue_offsets == [1]
    finally:
        store.close()


def test_index_finds_checkpointed_keys_after_power_loss(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = support.small_config(data, FlushMode.SYNC, checkpoint_interval_ms=3_600_000)
    disk = LossyDisk(data)
    store = _open(config, disk)
    try:
        for i in range(100):
            store.put("orders", b"before", keys=[f"before-{i}"])
        store.dispatcher.catch_up()
        store.checkpoint()  # the index now holds every "before" key durably
        for i in range(50):
            store.put("orders", b"after", keys=[f"after-{i}"])
        store.dispatcher.catch_up()
        store.halt()
        disk.drop_unsynced()
        store = _open(config, disk)
        missing = [i for i in range(100) if not store.lookup_key("orders", f"before-{i}")]
        assert not missing, f"{len(missing)} checkpointed keys not found: {missing[:10]}"
    finally:
        store.close()
