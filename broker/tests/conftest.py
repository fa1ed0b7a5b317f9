"""Shared fixtures for the store tests: small configs, started stores, deadline polling.

pytest runs with ``--import-mode=importlib``, so test modules cannot import this file;
everything here is reached through fixtures (``wait_until`` is one too). What the crash
tests share with their child process is ``metaq.testing.store_crash``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from metaq.broker.store import MessageStore, StoreConfig
from metaq.testing.waiting import wait_until

# Small enough that rollover, rebuilds and retention happen within a few hundred records.
SMALL: dict[str, Any] = {
    "commitlog_segment_bytes": 1 << 20,
    "max_message_bytes": 64 * 1024,
    "consume_queue_segment_entries": 256,
    "index_slots": 64,
    "index_entries": 1024,
    # Background rounds happen only when a test asks for them (flusher.flush(),
    # checkpoint(), clean()), so what a crash leaves behind is deterministic.
    "flush_interval_ms": 3_600_000,
    "checkpoint_interval_ms": 3_600_000,
    "clean_interval_s": 3_600.0,
}


@pytest.fixture(name="wait_until")
def wait_until_fixture() -> Callable[[Callable[[], bool], float, str], None]:
    return wait_until


def no_disk_pressure(_path: Path) -> float:
    """Disk usage as the guard sees it in tests: empty, whatever the host's disk holds."""
    return 0.0


@pytest.fixture
def store_config(tmp_path: Path) -> Callable[..., StoreConfig]:
    """``store_config(**overrides)``: a small StoreConfig with its data_dir under tmp_path."""

    def make(**overrides: Any) -> StoreConfig:
        settings = {"data_dir": tmp_path / "store", **SMALL, **overrides}
        return StoreConfig(**settings)

    return make


@pytest.fixture
def open_store(
    store_config: Callable[..., StoreConfig],
) -> Iterator[Callable[..., MessageStore]]:
    """``open_store(config=None, disk_usage=..., disk=..., **overrides)``: a started store.

    Stores still open at the end of the test are closed cleanly; halted ones stay halted.
    """
    opened: list[MessageStore] = []

    def start(
        config: StoreConfig | None = None,
        *,
        disk_usage: Callable[[Path], float] = no_disk_pressure,
        disk: Any = None,
        **overrides: Any,
    ) -> MessageStore:
        if config is None:
            config = store_config(**overrides)
        elif overrides:
            raise TypeError("pass either a config or overrides, not both")
        store = MessageStore(config, disk=disk, disk_usage=disk_usage)
        store.start()
        opened.append(store)
        return store

    yield start
    for store in opened:
        store.close()
