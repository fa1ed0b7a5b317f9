"""The checkpoint's two cadences: the commitlog's durable offset always, queues when due."""

from __future__ import annotations

from collections.abc import Callable

from metaq.broker.store import MessageStore
from metaq.broker.store.checkpoint import read_checkpoint

OpenStore = Callable[..., MessageStore]


def _put(store: MessageStore, count: int) -> None:
    for n in range(count):
        store.put("T", b"m%d" % n, queue_id=n % 3)
    store.dispatcher.catch_up()
    store.flusher.flush()


def test_checkpoint_without_queue_sync_keeps_the_last_synced_dispatch_point(
    open_store: OpenStore,
) -> None:
    store = open_store()
    _put(store, 30)
    synced = store.checkpoint()
    _put(store, 20)

    light = store.checkpoint(queues=False)

    on_disk = read_checkpoint(store.config.data_dir / "checkpoint")
    assert on_disk == light
    assert light.commitlog_durable == store.commitlog.write_offset > synced.commitlog_durable
    assert (light.dispatched, light.queue_entries) == (synced.dispatched, synced.queue_entries)


def test_crash_after_light_checkpoints_redispatches_from_the_last_queue_sync(
    open_store: OpenStore,
) -> None:
    store = open_store()
    _put(store, 30)
    synced = store.checkpoint()
    _put(store, 20)
    store.checkpoint(queues=False)
    expected = {q: store.max_offset("T", q) for q in range(3)}
    config = store.config
    store.halt()

    store = open_store(config)

    assert store.recovery is not None and store.recovery.crashed
    assert store.recovery.redispatched_records >= 20
    assert {q: store.max_offset("T", q) for q in range(3)} == expected
    assert synced.dispatched < store.commitlog.write_offset
