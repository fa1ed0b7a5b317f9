"""The in-flight offset tracker never lets a commit pass a message still being handled."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.client.inflight import InflightOffsets


def test_commit_offset_is_the_position_while_nothing_is_in_flight() -> None:
    tracker = InflightOffsets(7)

    assert tracker.commit_offset == 7
    tracker.add([], next_offset=12)  # a pull whose messages were all filtered out
    assert tracker.commit_offset == 12


def test_commit_offset_stops_at_the_lowest_unfinished_message() -> None:
    tracker = InflightOffsets(10)
    tracker.add([(10, 100), (11, 100), (12, 100)], next_offset=13)

    assert tracker.commit_offset == 10
    tracker.finish(11)
    tracker.finish(12)
    assert tracker.commit_offset == 10, "10 is still running: 11 and 12 must wait for it"
    tracker.finish(10)
    assert tracker.commit_offset == 13


def test_counts_and_bytes_follow_what_is_in_flight() -> None:
    tracker = InflightOffsets(0)
    tracker.add([(0, 5), (2, 7)], next_offset=3)

    assert (tracker.count, tracker.bytes) == (2, 12)
    assert tracker.finish(2)
    assert not tracker.finish(2), "a message finishes once"
    assert (tracker.count, tracker.bytes) == (1, 5)


def test_offsets_must_grow() -> None:
    tracker = InflightOffsets(0)
    tracker.add([(0, 1), (1, 1)], next_offset=2)

    with pytest.raises(ValueError, match="not above"):
        tracker.add([(1, 1)], next_offset=3)
    with pytest.raises(ValueError, match="does not lie past"):
        tracker.add([(5, 1)], next_offset=5)


def test_a_forward_correction_keeps_unfinished_messages_below_it_holding_the_commit() -> None:
    tracker = InflightOffsets(0)
    tracker.add([(0, 1), (1, 1)], next_offset=2)

    tracker.reposition(50)  # OFFSET_TOO_SMALL: the broker says start at 50

    assert tracker.position == 50
    assert tracker.commit_offset == 0
    tracker.finish(0)
    tracker.finish(1)
    assert tracker.commit_offset == 50


def test_a_backward_correction_forgets_messages_at_or_above_it() -> None:
    tracker = InflightOffsets(0)
    tracker.add([(3, 1), (8, 1), (9, 1)], next_offset=10)

    tracker.reposition(8)  # the queue lost its tail: 8 and 9 will be pulled again

    assert (tracker.count, tracker.commit_offset) == (1, 3)
    assert not tracker.finish(9)
    tracker.finish(3)
    assert tracker.commit_offset == 8
    tracker.add([(8, 1)], next_offset=9)
    assert tracker.commit_offset == 8


@st.composite
def _batches_and_order(draw: st.DrawFn) -> tuple[list[tuple[list[int], int]], list[int]]:
    """Pull batches (offsets with gaps for filtered messages, next offset) and one random
    interleaving of 'pull a batch' and 'finish an offset' steps."""
    offset = draw(st.integers(0, 1000))
    batches = []
    for _ in range(draw(st.integers(1, 8))):
        offsets = []
        for _ in range(draw(st.integers(0, 6))):
            offset += draw(st.integers(0, 3))  # gaps: filtered out by tags
            offsets.append(offset)
            offset += 1
        offset += draw(st.integers(0, 2))
        batches.append((offsets, offset))
    every = [o for offsets, _ in batches for o in offsets]
    order = draw(st.permutations(every))
    return batches, list(order)


@settings(max_examples=300, deadline=None)
@given(_batches_and_order(), st.data())
def test_commit_never_passes_an_unfinished_message_whatever_the_completion_order(
    case: tuple[list[tuple[list[int], int]], list[int]], data: st.DataObject
) -> None:
    batches, completion_order = case
    start = batches[0][0][0] if batches[0][0] else batches[0][1]
    tracker = InflightOffsets(min(start, batches[0][1]))
    delivered: set[int] = set()
    finished: set[int] = set()
    pending_batches = list(batches)
    pending_finishes = list(completion_order)
    last_commit = tracker.commit_offset
    while pending_batches or pending_finishes:
        # A message can only finish after it was delivered.
        can_finish = [o for o in pending_finishes if o in delivered]
        pull = pending_batches and (not can_finish or data.draw(st.booleans()))
        if pull:
            offsets, next_offset = pending_batches.pop(0)
            tracker.add([(o, 1) for o in offsets], next_offset)
            delivered.update(offsets)
        else:
            offset = can_finish[data.draw(st.integers(0, len(can_finish) - 1))]
            pending_finishes.remove(offset)
            assert tracker.finish(offset)
            finished.add(offset)
        commit = tracker.commit_offset
        unfinished = delivered - finished
        assert all(commit <= o for o in unfinished), "the commit passed an unfinished message"
        expected = min(unfinished) if unfinished else tracker.position
        assert commit == expected, "the commit lags further than the lowest unfinished message"
        assert commit >= last_commit, "the commit went backwards"
        assert tracker.count == len(unfinished)
        last_commit = commit
    assert tracker.commit_offset == batches[-1][1]
