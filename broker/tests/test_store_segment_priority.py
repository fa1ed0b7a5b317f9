"""The thread that makes the next commitlog file ready runs at no more than nice 0,
whatever priority the broker took for its loop."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest

from metaq.broker.store import MessageStore
from metaq.testing.waiting import wait_until

OpenStore = Callable[..., MessageStore]


@pytest.mark.skipif(os.geteuid() != 0, reason="raising a thread's priority needs root")
def test_the_segment_allocator_does_not_run_at_its_creators_raised_priority(
    open_store: OpenStore,
) -> None:
    opened: list[MessageStore] = []

    def as_the_broker() -> None:  # a thread of its own: nice is per thread on Linux
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -5)
        opened.append(open_store())

    creator = threading.Thread(target=as_the_broker)
    creator.start()
    creator.join()
    assert opened, "the store did not open"

    segments = opened[0].commitlog.segments
    wait_until(lambda: segments._next is not None, 10, "the next commitlog file is being made")
    segments._next.result(timeout=10)  # the allocator's thread has run, initializer first
    assert segments._allocator is not None
    (thread,) = segments._allocator._threads
    assert thread.native_id is not None
    assert os.getpriority(os.PRIO_PROCESS, thread.native_id) == 0
