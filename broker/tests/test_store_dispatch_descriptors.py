"""A dispatcher that cannot open a file for want of a descriptor waits and retries: the
store says why, refuses producers' writes meanwhile, and every message stored before is
readable once a descriptor can be had."""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from metaq.broker.store import GetStatus, MessageStore, segment
from metaq.common.errors import StoreUnavailable
from metaq.common.record import encode

OpenStore = Callable[..., MessageStore]
WaitUntil = Callable[..., None]


class DescriptorLimit:
    """``open_segment`` failing with EMFILE for consume-queue files while ``reached``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reached = False
        self.refused = 0
        real = segment.open_segment

        def open_segment(path: Path, *args: object, **kwargs: object) -> segment.Segment:
            if self.reached and "consumequeue" in path.parts:
                self.refused += 1
                raise OSError(errno.EMFILE, "Too many open files", str(path))
            return real(path, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(segment, "open_segment", open_segment)


def test_the_dispatcher_waits_for_a_descriptor_and_goes_on_when_one_frees_up(
    open_store: OpenStore,
    wait_until: WaitUntil,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    limit = DescriptorLimit(monkeypatch)
    store = open_store()
    store.append([encode("Old", b"before", queue_id=0)])
    wait_until(lambda: store.max_offset("Old", 0) == 1, 10.0, "the first queue is dispatched")

    limit.reached = True
    caplog.set_level(logging.WARNING, "metaq.broker.store.dispatch")
    stored = [store.append([encode("New", f"m{q}".encode(), queue_id=q)]) for q in range(4)]
    wait_until(lambda: limit.refused >= 3, 10.0, "the dispatcher tries again and again")

    assert store.dispatch_service.error is None, "the dispatcher thread died"
    reason = store.refusal
    assert reason is not None and "cannot open a consume-queue or index file" in reason
    assert "open-file limit" in reason and "retries by itself" in reason
    with pytest.raises(StoreUnavailable, match="open-file limit"):
        store.append([encode("New", b"refused", queue_id=0)])
    warnings = [
        r for r in caplog.records if "dispatch waiting for a file descriptor" in r.getMessage()
    ]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    # Queues with a file still read what was dispatched.
    assert store.get("Old", 0, 0).status is GetStatus.FOUND

    limit.reached = False
    wait_until(lambda: store.refusal is None, 10.0, "the dispatcher goes on")
    for queue_id, appended in enumerate(stored):
        found = store.get("New", queue_id, 0)
        assert found.status is GetStatus.FOUND, (queue_id, found.status)
        assert found.next_offset == 1 and appended.queue_offsets == [0]
    store.append([encode("New", b"taken again", queue_id=0)])


def test_a_checkpoint_short_of_a_descriptor_is_tried_again_not_fatal(
    open_store: OpenStore, wait_until: WaitUntil, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(checkpoint_interval_ms=10)
    failures: list[int] = []

    def no_descriptor(*_args: object) -> None:
        failures.append(1)
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr("metaq.broker.store.store.write_checkpoint", no_descriptor)
    wait_until(lambda: len(failures) >= 5, 10.0, "the checkpointer tries again")
    monkeypatch.undo()
    # Not a dead thread, nor a failing device (io_error_limit is 3).
    assert store.refusal is None, store.refusal
    assert not store.guard.io_refused
    store.append([encode("T", b"x", queue_id=0)])
