"""Child process of the kill -9 test: appends forever, printing one line per acknowledgement.

Usage: crash_child.py DATA_DIR RUN SEED

Opens the store with SYNC flush (recovering whatever the last kill left), prints
``ready <write offset> <recovery reason>``, then appends messages of varied sizes to a few
topics and queues, by put() and in small batches by append() + wait_durable(). Once a
message is acknowledged it prints ``ack <uid> <commitlog offset> <topic> <queue id>
<queue offset> <body hash> <record crc>``, flushing stdout, so the parent knows exactly
what the store promised. Message uids are ``<run>-<n>``, new in every run.
"""

from __future__ import annotations

import random
import sys
import zlib
from pathlib import Path

from metaq.broker.store import FlushMode, MessageStore, PutStatus
from metaq.common.record import encode
from metaq.testing.store_crash import body_hash, open_store, small_config

TOPICS = ("orders", "audit", "events")
QUEUES = 4


def _body(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.6:
        size = rng.randrange(0, 512)
    elif roll < 0.95:
        size = rng.randrange(512, 8_192)
    else:
        size = rng.randrange(20_000, 60_000)
    return rng.randbytes(size)


def _ack(store: MessageStore, spec: tuple[str, str, int, bytes], at: int, size: int, q: int) -> str:
    uid, topic, queue_id, body = spec
    # The CRC of the record as stored lets the parent check it byte for byte after a crash.
    raw = store.commitlog.slice(at, size)
    assert raw is not None
    return f"ack {uid} {at} {topic} {queue_id} {q} {body_hash(body)} {zlib.crc32(raw)}\n"


def main() -> None:
    data_dir, run, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    # Frequent checkpoints, so kills also land in checkpoint syncs and file replacements.
    store = open_store(
        small_config(data_dir, FlushMode.SYNC, checkpoint_interval_ms=20, queue_sync_interval_ms=60)
    )
    assert store.recovery is not None
    out = sys.stdout
    reason = store.recovery.tail_reason.replace(" ", "_")
    out.write(f"ready {store.commitlog.write_offset} {reason}\n")
    out.flush()
    rng = random.Random(seed * 100_003 + run)
    n = 0
    while True:
        batch = 1 if rng.random() < 0.7 else rng.randrange(2, 6)
        specs = []
        for _ in range(batch):
            specs.append((f"{run}-{n}", rng.choice(TOPICS), rng.randrange(QUEUES), _body(rng)))
            n += 1
        if batch == 1:
            uid, topic, queue_id, body = specs[0]
            result = store.put(topic, body, queue_id=queue_id, keys=[uid], properties={"uid": uid})
            if result.status is not PutStatus.OK:
                continue
            appended = result.appended
            sizes = [appended.end - appended.commitlog_offsets[0]]
        else:
            records = [
                encode(topic, body, queue_id=queue_id, keys=[uid], properties={"uid": uid})
                for uid, topic, queue_id, body in specs
            ]
            appended = store.append(records)
            if not store.wait_durable(appended.end):
                continue
            sizes = [len(r) for r in records]
        acks = zip(specs, appended.commitlog_offsets, sizes, appended.queue_offsets, strict=True)
        out.write("".join(_ack(store, *ack) for ack in acks))
        out.flush()


if __name__ == "__main__":
    main()
