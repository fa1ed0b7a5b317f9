"""Messaging features under load, against a real nameserver and broker on loopback.

- **delayed delivery** — ``--pending`` (100,000) messages of 1 KiB are scheduled with
  ``send_batch`` for one delivery time a few seconds ahead, so all of them are pending at
  once; then the broker delivers them. Figures: scheduling throughput, the plain
  ``send_batch`` throughput of the same messages in the same run (the baseline), and the
  delivery throughput from the due time until the last one is in its topic
  (``delayed_msgs_s``), with how late the first and the last one came;
- **transactions** — ``--txn-seconds`` each of plain sends and of transactional sends
  (half message, an empty local transaction, commit), one at a time, 1 KiB, in the same
  run: ``txn_vs_plain_ratio`` of their throughputs.

The last line of the output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

from metaq.client.message import Message, OutgoingMessage
from metaq.client.producer import Producer
from metaq.client.results import SendResult
from metaq.client.transaction import TransactionProducer, TransactionState
from metaq.testing import BrokerProcess, DataClient
from metaq.testing.cluster import ClusterBuilder

TOPIC: Final = "BenchDelayed"
PLAIN: Final = "BenchPlain"
QUEUES: Final = 8
BODY: Final = b"x" * 1024
BATCH: Final = 1000


async def _send_all(producer: Producer, topic: str, count: int, deliver_at: int | None) -> float:
    props = {"DELIVER_AT": str(deliver_at)} if deliver_at is not None else None
    messages = [OutgoingMessage(BODY, properties=props) for _ in range(BATCH)]
    began = time.perf_counter()
    for _ in range(count // BATCH):
        await producer.send_batch(topic, messages)
    return count / (time.perf_counter() - began)


async def _stored(broker: BrokerProcess, topic: str) -> int:
    client = await DataClient.connect(broker.data_host, broker.data_port)
    try:
        total = 0
        for queue_id in range(QUEUES):
            answer = await client.query_offset(topic, queue_id)
            total += answer.max_offset
        return total
    finally:
        await client.close()


async def measure(
    nameserver: str, broker: BrokerProcess, pending: int, lead_s: float
) -> dict[str, Any]:
    async with Producer([nameserver]) as producer:
        await producer.send(PLAIN, b"warm-up")
        plain_rate = await _send_all(producer, PLAIN, pending, None)
        due_ms = time.time_ns() // 1_000_000 + round(lead_s * 1000)
        schedule_rate = await _send_all(producer, TOPIC, pending, due_ms)
    scheduled_by = time.time_ns() // 1_000_000
    if scheduled_by >= due_ms:
        raise RuntimeError("scheduling took longer than the lead time: raise --lead-s")
    first_ms = last_ms = 0
    while True:
        stored = await _stored(broker, TOPIC)
        now_ms = time.time_ns() // 1_000_000
        if stored and not first_ms:
            first_ms = now_ms
        if stored >= pending:
            last_ms = now_ms
            break
        await asyncio.sleep(0.02)
    deliver_s = max(last_ms - due_ms, 1) / 1000
    return {
        "pending": pending,
        "plain_send_batch_msgs_s": round(plain_rate),
        "delayed_schedule_msgs_s": round(schedule_rate),
        "schedule_vs_plain_ratio": round(schedule_rate / plain_rate, 3),
        "delayed_msgs_s": round(pending / deliver_s),
        "first_delivered_late_ms": first_ms - due_ms,
        "last_delivered_late_ms": last_ms - due_ms,
    }


async def _one_at_a_time(send: Callable[[], Awaitable[object]], seconds: float) -> float:
    count = 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        await send()
        count += 1
    return count / (time.perf_counter() - began)


async def transactions(nameserver: str, seconds: float) -> dict[str, Any]:
    async def commit(_result: SendResult) -> TransactionState:
        return TransactionState.COMMIT

    async def check(_message: Message) -> TransactionState:
        return TransactionState.COMMIT

    async with TransactionProducer([nameserver], "bench-txn", check) as txn:
        await txn.producer.send(PLAIN, b"warm-up")
        plain = await _one_at_a_time(lambda: txn.producer.send(PLAIN, BODY), seconds)
        transactional = await _one_at_a_time(lambda: txn.send(PLAIN, BODY, commit), seconds)
    return {
        "plain_one_at_a_time_msgs_s": round(plain),
        "txn_one_at_a_time_msgs_s": round(transactional),
        "txn_vs_plain_ratio": round(transactional / plain, 3),
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--txn-seconds", type=float, default=5.0)
    parser.add_argument(
        "--lead-s", type=float, default=20.0, help="due time after scheduling starts"
    )
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-features-"))
    builder = ClusterBuilder(
        broker_args=("--set", "store.commitlog_segment_bytes=268435456"),
        small_store=False,
        ready_timeout_s=60,
    )
    try:
        with builder.start(work) as cluster:
            broker = cluster.broker("broker-a")
            nameserver = cluster.nameserver_addresses[0]
            for topic in (TOPIC, PLAIN):
                asyncio.run(cluster.create_topic(topic, queues=QUEUES))
            figures = asyncio.run(measure(nameserver, broker, args.pending, args.lead_s))
            figures.update(asyncio.run(transactions(nameserver, args.txn_seconds)))
            broker.terminate()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"| send_batch, plain      | {figures['plain_send_batch_msgs_s']:>9,} msgs/s |")
    print(f"| send_batch, delayed    | {figures['delayed_schedule_msgs_s']:>9,} msgs/s |"
          f" {figures['schedule_vs_plain_ratio']:.2f} of plain")  # fmt: skip
    print(f"| delivery of {args.pending:,} due at once | {figures['delayed_msgs_s']:>9,} msgs/s |"
          f" first {figures['first_delivered_late_ms']} ms, last "
          f"{figures['last_delivered_late_ms']} ms after due")  # fmt: skip
    print(f"| one at a time, plain   | {figures['plain_one_at_a_time_msgs_s']:>9,} msgs/s |")
    print(f"| one at a time, txn     | {figures['txn_one_at_a_time_msgs_s']:>9,} msgs/s |"
          f" {figures['txn_vs_plain_ratio']:.2f} of plain")  # fmt: skip
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
