from metaq.broker.store.queue_offsets import QueueOffsets


def test_take_hands_out_consecutive_offsets_per_queue() -> None:
    offsets = QueueOffsets()
    taken = [offsets.take(b"T", q) for q in (3, 3, 0, 3, 0)]
    assert taken == [0, 1, 0, 2, 1]
    assert offsets.take(b"U", 3) == 0


def test_reads_as_a_mapping_of_queues_that_took_records() -> None:
    offsets = QueueOffsets([((b"T", 2), 5), ((b"T", 7), 0), ((b"U", 0), 1)])
    assert dict(offsets) == {(b"T", 2): 5, (b"U", 0): 1}
    assert offsets.get((b"T", 7), 0) == 0
    assert offsets.get((b"T", 9000), 0) == 0
    assert offsets.get((b"V", 0)) is None
    offsets.set(b"T", 2, 3)
    assert offsets[(b"T", 2)] == 3 and len(offsets) == 2
