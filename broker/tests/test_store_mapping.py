"""Mapped store files keep no descriptor, and idle consume-queue files are unmapped."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from metaq.broker.store import GetStatus, MessageStore
from metaq.broker.store.mapping import Mapping
from metaq.common.record import encode

OpenStore = Callable[..., MessageStore]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def mapped_files_under(directory: Path) -> int:
    """Mappings of this process of files below ``directory`` (from /proc/self/maps)."""
    prefix = str(directory)
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if line.rstrip().split(" ")[-1].startswith(prefix))


def fill(store: MessageStore, topics: int, queues: int) -> None:
    records = [
        encode(f"T{t}", f"{t}/{q}".encode(), queue_id=q)
        for t in range(topics)
        for q in range(queues)
    ]
    store.append(records)
    store.dispatcher.catch_up()


def test_queue_files_cost_no_descriptors(open_store: OpenStore) -> None:
    store = open_store()
    store.append([encode("Warm", b"first files", queue_id=0)])
    store.dispatcher.catch_up()
    before = open_fds()
    fill(store, 25, 16)  # 400 more queues, each with a mapped file
    assert len(store.queues.queues) == 401
    assert mapped_files_under(store.config.consume_queue_dir) == 401
    # mmap.mmap would hold a duplicate descriptor for each of the 400 new files.
    assert open_fds() - before < 10


def test_idle_queue_files_are_unmapped_and_read_back_when_touched(
    open_store: OpenStore,
) -> None:
    store = open_store(mapped_queue_files=8)
    fill(store, 10, 10)
    fill(store, 10, 10)  # every queue written twice, going round all 100
    cq_dir = store.config.consume_queue_dir
    assert mapped_files_under(cq_dir) <= 8
    pool = store.mapped_queue_files
    # The second round's entries went to unmapped files without mapping them again.
    assert pool.unmapped >= 92 and pool.mapped_again == 0
    for t in range(10):
        for q in range(10):
            result = store.get(f"T{t}", q, 0)
            assert result.status is GetStatus.FOUND
            bodies = [bytes(view) for view in result.records]
            assert len(bodies) == 2 and all(f"{t}/{q}".encode() in body for body in bodies)
            result.release()
    assert pool.mapped_again >= 92  # reading maps a file again
    assert mapped_files_under(cq_dir) <= 8


def test_entries_of_an_unmapped_file_survive_a_restart(open_store: OpenStore) -> None:
    store = open_store(mapped_queue_files=2)
    fill(store, 4, 4)
    store.close()
    again = open_store(mapped_queue_files=2)
    assert again.recovery is not None and not again.recovery.crashed
    assert [again.max_offset(f"T{t}", q) for t in range(4) for q in range(4)] == [1] * 16


def test_a_mapping_stays_while_a_view_of_it_lives(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(bytes(8192))
    fd = os.open(path, os.O_RDWR)
    mapping = Mapping(fd, 8192)
    os.close(fd)  # the mapping needs no descriptor
    mapping.view[4000:4005] = b"hello"
    piece = mapping.view[4000:4005]
    assert not mapping.close()
    assert bytes(piece) == b"hello"  # still readable: nothing was unmapped
    assert mapping.find(b"llo") == 4002
    del piece
    assert mapping.close()
    with pytest.raises(ValueError):
        mapping.flush()
    assert path.read_bytes()[4000:4005] == b"hello"
