"""Finding messages by id, by (topic, key), and queue offsets by store time."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import metaq.broker.store.commitlog as commitlog_module
from metaq.broker.store import MessageStore
from metaq.broker.store.index import HashSummary, MessageIndex, hash_id
from metaq.common.record import decode, encode

OpenStore = Callable[..., MessageStore]

# Two keys whose index keys ("coll#" + key) have the same CRC-32, the index's hash.
COLLIDING = ("AG9dvDvCjk", "h16Kzk9aMQ")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """The commitlog's store clock, set by the test: ``clock.ms = ...``."""
    fake = SimpleNamespace(ms=1_700_000_000_000)
    fake.time_ns = lambda: fake.ms * 1_000_000
    monkeypatch.setattr(commitlog_module, "time", fake)
    return fake


def test_lookup_id_finds_every_message(open_store: OpenStore) -> None:
    store = open_store()
    rng = random.Random(5)
    sent = []
    for _ in range(20):
        batch = [
            encode(
                rng.choice(["a", "b"]),
                rng.randbytes(rng.randint(0, 200)),
                queue_id=rng.randrange(3),
            )
            for _ in range(rng.randint(1, 20))
        ]
        appended = store.append(batch)
        sent.extend(zip(appended.commitlog_offsets, batch, strict=True))
    store.dispatcher.catch_up()

    for offset, raw in sent:
        expected = decode(raw, verify=False)
        found = store.lookup_id(expected.msg_id)
        assert found is not None
        assert (found.commitlog_offset, found.body, found.topic) == (
            offset,
            expected.body,
            expected.topic,
        )
    assert store.lookup_id(bytes(16)) is None


def test_lookup_key_finds_a_message_by_each_of_its_keys(open_store: OpenStore) -> None:
    store = open_store()
    store.put("orders", b"first", keys=["order-1", "customer-9", "region-eu"])
    store.put("orders", b"other", keys=["order-2"])
    store.dispatcher.catch_up()

    for key in ("order-1", "customer-9", "region-eu"):
        assert [r.body for r in store.lookup_key("orders", key)] == [b"first"]
    assert [r.body for r in store.lookup_key("orders", "order-2")] == [b"other"]
    assert store.lookup_key("orders", "order-3") == []


def test_lookup_key_is_scoped_to_the_topic(open_store: OpenStore) -> None:
    store = open_store()
    store.put("orders", b"in orders", keys=["shared"])
    store.put("refunds", b"in refunds", keys=["shared"])
    store.dispatcher.catch_up()

    assert [r.body for r in store.lookup_key("orders", "shared")] == [b"in orders"]
    assert [r.body for r in store.lookup_key("refunds", "shared")] == [b"in refunds"]


def test_lookup_key_returns_newest_first_up_to_the_limit(open_store: OpenStore) -> None:
    store = open_store()
    for n in range(12):
        store.put("orders", f"v{n}".encode(), queue_id=n % 3, keys=["order-7", f"n{n}"])
    store.dispatcher.catch_up()

    found = store.lookup_key("orders", "order-7")
    assert [r.body for r in found] == [f"v{n}".encode() for n in reversed(range(12))]
    offsets = [r.commitlog_offset for r in found]
    assert offsets == sorted(offsets, reverse=True)
    assert [r.body for r in store.lookup_key("orders", "order-7", limit=3)] == [
        b"v11",
        b"v10",
        b"v9",
    ]


def test_lookup_key_filters_by_store_time(open_store: OpenStore, clock: SimpleNamespace) -> None:
    store = open_store()
    for n in range(5):
        clock.ms = 1_700_000_000_000 + n * 10_000
        store.put("orders", f"v{n}".encode(), keys=["k"])
    store.dispatcher.catch_up()

    found = store.lookup_key("orders", "k", begin_ms=1_700_000_010_000, end_ms=1_700_000_030_000)

    assert [r.body for r in found] == [b"v3", b"v2", b"v1"]


def test_one_slot_for_every_key_still_returns_only_true_matches(open_store: OpenStore) -> None:
    store = open_store(index_slots=1)
    for n in range(60):
        store.put("orders", f"v{n}".encode(), keys=[f"k{n % 6}"])
    store.dispatcher.catch_up()

    for k in range(6):
        found = store.lookup_key("orders", f"k{k}")
        assert [r.body for r in found] == [f"v{n}".encode() for n in reversed(range(k, 60, 6))]
        assert all(store.lookup_id(r.msg_id) == r for r in found)


def test_keys_with_the_same_hash_are_told_apart(open_store: OpenStore) -> None:
    a, b = COLLIDING
    assert zlib.crc32(f"coll#{a}".encode()) == zlib.crc32(f"coll#{b}".encode())
    store = open_store()
    store.put("coll", b"a-old", keys=[a])
    for n in range(3):
        store.put("coll", f"b{n}".encode(), keys=[b])
    store.put("coll", b"a-new", keys=[a])
    store.dispatcher.catch_up()

    assert [r.body for r in store.lookup_key("coll", a)] == [b"a-new", b"a-old"]
    assert [r.body for r in store.lookup_key("coll", b)] == [b"b2", b"b1", b"b0"]


def test_a_key_is_found_behind_many_newer_messages_with_a_colliding_key(
    open_store: OpenStore,
) -> None:
    """Hash matches are only candidates: a busy colliding key must not hide a real match."""
    a, b = COLLIDING
    store = open_store()
    store.put("coll", b"the one", keys=[a])
    store.append([encode("coll", f"b{n}".encode(), keys=[b]) for n in range(100)])
    store.dispatcher.catch_up()

    assert [r.body for r in store.lookup_key("coll", a)] == [b"the one"]
    assert [r.body for r in store.lookup_key("coll", a, limit=1)] == [b"the one"]
    assert len(store.lookup_key("coll", b, limit=40)) == 40


def test_index_rolls_over_to_new_files_and_still_finds_everything(
    open_store: OpenStore,
) -> None:
    store = open_store(index_entries=16, index_slots=4)
    ids = []
    for n in range(100):
        result = store.put("orders", f"v{n}".encode(), keys=[f"k{n}", f"group{n % 5}"])
        ids.append(result.appended.commitlog_offsets[0])
    store.dispatcher.catch_up()

    files = sorted(p.name for p in store.config.index_dir.iterdir())
    assert len(files) >= 300 // 16  # 3 entries per message: id and two keys
    assert files[0] == f"{0:020d}"
    for n in range(100):
        assert [r.body for r in store.lookup_key("orders", f"k{n}")] == [f"v{n}".encode()]
    group = store.lookup_key("orders", "group3", limit=100)
    assert [r.body for r in group] == [f"v{n}".encode() for n in reversed(range(3, 100, 5))]
    for offset in ids:
        record = store.record_at(offset)
        assert record is not None
        assert store.lookup_id(record.msg_id) == record


def test_a_message_with_more_keys_than_an_index_file_holds_is_still_dispatched(
    open_store: OpenStore,
) -> None:
    store = open_store(index_entries=4)
    store.put("orders", b"many keys", keys=[f"k{n}" for n in range(10)])
    store.put("orders", b"after", keys=["last"])

    store.dispatcher.catch_up()

    assert store.max_offset("orders", 0) == 2
    assert store.dispatch_service.error is None
    store.close()
    store = open_store(store.config)  # the index files load back in order
    assert [r.body for r in store.lookup_key("orders", "last")] == [b"after"]
    for n in range(10):
        assert [r.body for r in store.lookup_key("orders", f"k{n}")] == [b"many keys"]


def test_offset_for_timestamp_finds_the_first_message_stored_at_or_after(
    open_store: OpenStore, clock: SimpleNamespace
) -> None:
    store = open_store()
    stamps = []
    for n in range(40):
        clock.ms = 1_700_000_000_000 + (n // 3) * 1000  # three messages per second
        store.put("orders", b"x", queue_id=0)
        stamps.append(clock.ms)
        if n % 2:
            store.put("orders", b"other queue", queue_id=1)
    store.dispatcher.catch_up()

    probes = sorted({*stamps, *(s - 1 for s in stamps), *(s + 1 for s in stamps), 0, 2**62})
    for probe in probes:
        expected = next((n for n, s in enumerate(stamps) if s >= probe), len(stamps))
        assert store.offset_for_timestamp("orders", 0, probe) == expected, probe
    assert store.offset_for_timestamp("nobody", 0, 0) == 0


def test_maybe_stored_names_the_ids_of_a_batch_that_may_be_stored(
    open_store: OpenStore, clock: SimpleNamespace
) -> None:
    """The retried SEND's first question: which of these ids may be stored since the
    window's start? Across rolled-over files, and never ids stored before it."""
    store = open_store(index_entries=16, index_slots=4)
    old = [encode("orders", b"old") for _ in range(5)]
    store.append(old)
    clock.ms += 60_000
    recent = [encode("orders", f"v{n}".encode()) for n in range(50)]
    store.append(recent)
    store.dispatcher.catch_up()
    assert len(list(store.config.index_dir.iterdir())) > 3
    since = clock.ms - 30_000

    def ids(raws: list[bytearray]) -> list[bytes]:
        return [decode(r, verify=False).msg_id for r in raws]

    fresh = [random.Random(n).randbytes(16) for n in range(200)]
    assert store.index.maybe_stored(fresh, since) == []
    assert store.index.maybe_stored(ids(old), since) == []
    assert store.index.maybe_stored(ids(old), since - 60_000) == list(range(5))
    for msg_id in ids(recent):
        assert store.index.maybe_stored([*fresh[:100], msg_id, *fresh[100:]], since) == [100]
    assert store.index.maybe_stored([*ids(recent), *fresh], since) == list(range(50))


def test_maybe_stored_ends_on_chains_a_crash_tore(tmp_path: Path) -> None:
    """Entries written after the last checkpoint can hold anything after a crash: a slot
    naming an entry past the count, a "previous" that points at itself or is negative.
    The walk must end on them, and still find what the intact chains hold."""
    slots = 8
    index = MessageIndex(tmp_path, slots=slots, capacity=64, disk=None)  # type: ignore[arg-type]
    index.load()
    ids = [random.Random(n).randbytes(16) for n in range(40)]
    index.put_many([hash_id(m) for m in ids], list(range(40)), [1_000] * 40)
    file = index.files[0]
    entries = file.segment.view[file._entries_at :].cast("I")
    slot_numbers = file.segment.view[40 : file._entries_at].cast("I")
    entries[40 * 5 + 4] = 40  # the newest entry (ids[39]) points at itself
    entries[39 * 5 + 4] = 2**32 - 7  # ids[38]'s "previous" was a negative number
    torn = {hash_id(ids[39]) % slots, hash_id(ids[38]) % slots}
    wild = next(s for s in range(slots) if s not in torn)
    slot_numbers[wild] = 1_000  # a slot names an entry never written
    intact = next(m for m in ids[:38] if hash_id(m) % slots not in {*torn, wild})

    strangers = [random.Random(n).randbytes(16) for n in range(100, 300)]
    assert {hash_id(m) % slots for m in strangers} == set(range(slots))  # every chain
    assert index.maybe_stored(strangers, 0) == []
    for found in (ids[39], ids[38], intact):
        assert index.maybe_stored([*strangers, found], 0) == [len(strangers)]


def test_full_files_are_summarised_one_a_call_and_freed_out_of_the_window(
    tmp_path: Path,
) -> None:
    """A full file answers from a summary of its hashes; the files a restart loads are
    summarised one per call (a send never waits for them all), answering by their chains
    till then; a file past the window gives its summary up."""
    index = MessageIndex(tmp_path, slots=8, capacity=64, disk=None)  # type: ignore[arg-type]
    index.load()
    ids = [random.Random(n).randbytes(16) for n in range(64 * 4 + 10)]
    times = [1_000 * (n // 64) for n in range(len(ids))]  # a second per file
    index.put_many([hash_id(m) for m in ids], list(range(len(ids))), times)
    for file in index.files:
        file.write_header()
    index = MessageIndex(tmp_path, slots=8, capacity=64, disk=None)  # type: ignore[arg-type]
    index.load()
    assert [f.unsummarised for f in index.files] == [True, True, True, True, False]

    strangers = [random.Random(n).randbytes(16) for n in range(1_000, 1_200)]
    probe = [*strangers, ids[5], ids[64 * 2 + 7], ids[-1]]
    expected = [len(strangers), len(strangers) + 1, len(strangers) + 2]
    for summarised in (1, 2, 3, 4, 4):
        assert index.maybe_stored(probe, 0) == expected
        assert sum(not f.unsummarised for f in index.files[:4]) == summarised
    assert index.maybe_stored(probe, 1_500) == expected[1:]  # the first two files' seconds
    assert [f._summary is None for f in index.files] == [True, True, False, False, True]


def test_a_hash_summary_finds_exactly_the_hashes_it_holds() -> None:
    rng = np.random.default_rng(7)
    held = rng.integers(1, 2**32 - 1, 4_000, dtype=np.uint64).astype(np.uint32)
    summary = HashSummary(held, capacity=4_000)
    strangers = np.setdiff1d(rng.integers(0, 2**32, 20_000, dtype=np.uint64), held)
    edges = np.array([0, 2**32 - 1], np.uint32)  # below and past every held hash
    probe = np.sort(np.concatenate([held[:500], strangers.astype(np.uint32), edges]))
    found = probe[summary.candidates(probe)]
    assert sorted(found.tolist()) == sorted(set(held[:500].tolist()))
