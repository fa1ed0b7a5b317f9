"""The idempotent producers' table, in-process: duplicates located by arithmetic, gaps
and stale epochs refused, runs merged, cut with the log, expired, saved and loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from metaq.broker.store.producers import (
    NEW,
    ProducerFenced,
    ProducerTable,
    SequenceGap,
    write_snapshot,
)

KEY = (7, b"orders", 3)


def test_an_unknown_producer_starts_anywhere_and_the_next_batch_is_new() -> None:
    table = ProducerTable()
    assert table.check(KEY, 0, 40, 10) is NEW
    table.record(KEY, 0, 40, 49, 100, 1)
    assert table.check(KEY, 0, 50, 10) is NEW


def test_a_resent_batch_is_located_where_it_was_stored() -> None:
    table = ProducerTable()
    table.record(KEY, 0, 0, 9, 100, 1)
    table.record(KEY, 0, 10, 19, 500, 2)  # other producers' records came between
    verdict = table.check(KEY, 0, 5, 10)
    assert verdict.duplicates == 10
    assert verdict.places == (105, 106, 107, 108, 109, 500, 501, 502, 503, 504)


def test_a_batch_overlapping_the_last_stored_is_new_from_there_on() -> None:
    table = ProducerTable()
    table.record(KEY, 0, 0, 9, 0, 1)
    verdict = table.check(KEY, 0, 8, 5)
    assert verdict.duplicates == 2
    assert verdict.places == (8, 9)


def test_a_gap_is_refused_naming_what_is_missing() -> None:
    table = ProducerTable()
    table.record(KEY, 0, 0, 9, 0, 1)
    with pytest.raises(SequenceGap, match="sequences 10-19 are missing"):
        table.check(KEY, 0, 20, 5)


def test_an_older_epoch_is_fenced_and_a_newer_one_starts_over() -> None:
    table = ProducerTable()
    table.record(KEY, 2, 0, 9, 0, 1)
    with pytest.raises(ProducerFenced, match="epoch 1"):
        table.check(KEY, 1, 10, 1)
    assert table.check(KEY, 3, 0, 1) is NEW


def test_only_the_last_runs_are_kept_and_older_duplicates_are_unplaced() -> None:
    table = ProducerTable(batches=2)
    for n in range(4):
        table.record(KEY, 0, n * 10, n * 10 + 9, n * 100, 1)
    verdict = table.check(KEY, 0, 0, 1)
    assert verdict.duplicates == 1
    assert verdict.places == (None,)
    assert table.check(KEY, 0, 35, 1).places == (305,)


def test_consecutive_batches_merge_and_a_refed_stretch_changes_nothing() -> None:
    table = ProducerTable(batches=1)
    table.record(KEY, 0, 0, 9, 0, 1)
    table.record(KEY, 0, 10, 19, 10, 2)
    table.record(KEY, 0, 5, 14, 5, 3)  # re-dispatched
    assert table.check(KEY, 0, 0, 20).places == tuple(range(20))


def test_a_cut_log_cuts_the_runs() -> None:
    table = ProducerTable()
    table.record(KEY, 0, 0, 9, 0, 1)
    table.record(KEY, 0, 10, 19, 50, 1)
    table.truncate({(b"orders", 3): 55})
    assert table.check(KEY, 0, 15, 1) is NEW
    table.truncate({(b"orders", 3): 0})
    assert len(table) == 0


def test_idle_producers_expire() -> None:
    table = ProducerTable()
    table.record(KEY, 0, 0, 9, 0, 1_000)
    table.record((8, b"orders", 3), 0, 0, 9, 10, 5_000)
    assert table.expire(2_000) == 1
    assert table.get(KEY) is None


def test_a_saved_table_loads_with_its_offset(tmp_path: Path) -> None:
    table = ProducerTable()
    table.record(KEY, 1, 0, 9, 100, 1)
    write_snapshot(tmp_path / "producers.json", table.dump(4096))
    loaded = ProducerTable()
    assert loaded.load(tmp_path / "producers.json") == 4096
    assert loaded.check(KEY, 1, 3, 1).places == (103,)
    (tmp_path / "producers.json").write_text("{")
    assert loaded.load(tmp_path / "producers.json") is None
    assert len(loaded) == 0
