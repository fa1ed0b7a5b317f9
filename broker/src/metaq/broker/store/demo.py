"""``make run`` until the broker exists: drive the store end to end and say what it did.

Appends messages over a few topics and queues, reads them back through the consume
queues, finds some by id, key and timestamp, then restarts the store, first cleanly and
then as after a crash, and shows that recovery keeps everything.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from metaq.broker.store import FlushMode, GetStatus, MessageStore, StoreConfig
from metaq.common.record import decode, encode, tag_code

TOPICS = ("orders", "payments", "audit")
QUEUES = 4


def _config(data_dir: Path, flush: FlushMode) -> StoreConfig:
    return StoreConfig(
        data_dir=data_dir,
        flush_mode=flush,
        commitlog_segment_bytes=64 * 1024 * 1024,
        max_message_bytes=1024 * 1024,
        index_slots=50_000,
        index_entries=200_000,
    )


def _produce(store: MessageStore, count: int) -> float:
    began = time.perf_counter()
    batch: list[bytearray] = []
    for n in range(count):
        topic = TOPICS[n % len(TOPICS)]
        batch.append(
            encode(
                topic,
                f"{topic} message {n}".encode() * 8,
                queue_id=n % QUEUES,
                tags="even" if n // 12 % 2 == 0 else "odd",
                keys=[f"{topic}-{n}"],
                born_timestamp_ms=time.time_ns() // 1_000_000,
            )
        )
        if len(batch) == 64 or n == count - 1:
            appended = store.append(batch)
            batch = []
            if store.config.flush_mode is FlushMode.SYNC:
                store.wait_durable(appended.end)
    store.dispatcher.catch_up()
    return time.perf_counter() - began


def _consume_all(store: MessageStore) -> int:
    seen = 0
    for topic in TOPICS:
        for queue_id in range(QUEUES):
            offset = store.min_offset(topic, queue_id)
            while True:
                result = store.get(topic, queue_id, offset, max_messages=256)
                if result.status is not GetStatus.FOUND:
                    break
                for view in result.records:
                    record = decode(view)
                    assert record.topic == topic and record.queue_id == queue_id
                    seen += 1
                offset = result.next_offset
                result.release()
    return seen


def _show_state(store: MessageStore, label: str) -> None:
    report = store.recovery
    assert report is not None
    print(
        f"[{label}] crashed={report.crashed} full_rebuild={report.full_rebuild} "
        f"commitlog_end={report.commitlog_end} redispatched={report.redispatched_records} "
        f"({report.seconds * 1000:.1f} ms, {report.tail_reason})"
    )
    for topic in TOPICS:
        offsets = [store.max_offset(topic, q) for q in range(QUEUES)]
        print(f"    {topic:<9} queue max offsets {offsets}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", type=Path, default=Path("run-data/store-demo"))
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--flush", choices=[m.value for m in FlushMode], default="async")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    config = _config(args.data_dir, FlushMode(args.flush))

    store = MessageStore(config)
    store.start()
    _show_state(store, "opened")
    seconds = _produce(store, args.messages)
    print(f"appended {args.messages} messages in {seconds:.2f} s "
          f"({args.messages / seconds:,.0f} msgs/s, {args.flush} flush)")  # fmt: skip
    probe = store.get("orders", 1, store.min_offset("orders", 1), max_messages=3)
    for view in probe.records:
        record = decode(view)
        body = record.body[:24]
        print(f"    orders/1 @{record.queue_offset}: {body!r}... id={record.msg_id_hex}")
        found = store.lookup_id(record.msg_id)
        assert found is not None and found.commitlog_offset == record.commitlog_offset
    probe.release()
    odd = store.get("audit", 0, 0, max_messages=5, tag_codes={tag_code("odd")})
    offsets = [decode(view).queue_offset for view in odd.records]
    print(f"    audit/0 filtered by tag 'odd': queue offsets {offsets}")
    odd.release()
    by_key = store.lookup_key("payments", f"payments-{1 + 3 * 7}")
    print(f"    key payments-22 -> {[r.queue_offset for r in by_key]}")
    print(f"    consumed back {_consume_all(store)} messages through the consume queues")
    store.close()

    store = MessageStore(config)
    store.start()
    _show_state(store, "clean restart")
    _produce(store, 1_000)
    store.halt()  # as if killed: no final flush, no checkpoint, abort marker left

    store = MessageStore(config)
    store.start()
    _show_state(store, "restart after crash")
    print(f"    consumed back {_consume_all(store)} messages after recovery")
    store.close()
    print(f"data kept in {args.data_dir}; run again to append more, `make clean` to remove it")


if __name__ == "__main__":
    main()
