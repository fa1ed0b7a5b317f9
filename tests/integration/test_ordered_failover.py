"""Ordered consumers keep their queues across a failover, with real processes: a sync
group of two, two ordered members, kill -9 of the master.

The failure this guards against: the new master granted no queue lock for a whole
``queue_lock_ttl_ms`` (30 s) after taking over, since it could not know who held which
queue, so ordered consumption paused for about that long (p50 30.25 s in a loss run).
Members now renew the leases they still hold, which a new master grants to the first
claimant of each queue; the test also checks that no two members ever handle one queue
at once and that each key's messages stay in order.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from pathlib import Path

import pytest

from metaq.client.consumer import FIRST, PushConsumer
from metaq.client.message import Message
from metaq.client.producer import Producer
from metaq.testing.replica_group import QUEUES, TOPIC, start_group
from metaq.testing.waiting import deadline, run_async, wait_until_async

pytestmark = pytest.mark.slow

KEYS = [f"account-{i}" for i in range(8)]
OPTIONS = {"rebalance_interval_s": 0.5, "heartbeat_interval_s": 0.3, "lock_retry_ms": 100}
RESUME_BOUND_S = 6.0
"""The target is 2 s; the bound leaves room for a loaded two-core machine (the old code
took the whole 30 s lock time to live)."""


def test_ordered_consumers_resume_soon_after_a_failover_without_sharing_a_queue(
    tmp_path: Path,
) -> None:
    group = start_group(tmp_path, brokers=2, mode="sync", min_in_sync=1)
    handled: list[tuple[float, int, str, int]] = []
    active: dict[int, str] = {}
    overlaps: list[str] = []

    def handler(name: str):  # type: ignore[no-untyped-def]
        async def handle(message: Message) -> None:
            holder = active.setdefault(message.queue_id, name)
            if holder != name:
                overlaps.append(f"queue {message.queue_id}: {holder} and {name}")
            try:
                key, seq = message.body.decode().split(":")
                handled.append((time.monotonic(), message.queue_id, key, int(seq)))
                await asyncio.sleep(0.001)  # some work, so overlaps would show
            finally:
                if active.get(message.queue_id) == name:
                    del active[message.queue_id]

        return handle

    async def scenario() -> float:
        nameservers = group.nameserver_addresses
        members = []
        for name in ("first", "second"):
            member = PushConsumer(nameservers, "ordered-failover", consume_from=FIRST, **OPTIONS)
            member.subscribe_ordered(TOPIC, handler(name))
            members.append(member)
        stop = asyncio.Event()
        async with Producer(nameservers, send_timeout_s=2.0) as producer:

            async def produce() -> None:
                seq = 0
                while not stop.is_set():
                    for key in KEYS:
                        try:
                            await producer.send(TOPIC, f"{key}:{seq}".encode(), sharding_key=key)
                        except Exception:
                            await asyncio.sleep(0.05)  # pacing after a failure
                    seq += 1
                    await asyncio.sleep(0.01)  # pacing, not synchronisation

            sending = asyncio.ensure_future(produce())
            try:
                for member in members:
                    await member.start()

                async def settled() -> bool:
                    owned = [{q for _, _, q in m.assigned_queues} for m in members]
                    return all(owned) and sorted(q for o in owned for q in o) == list(range(QUEUES))

                await wait_until_async(settled, 60, "the members share the queues")
                since = time.monotonic()

                async def every_queue_handled() -> bool:
                    return {q for t, q, _, _ in handled if t > since} == set(range(QUEUES))

                # Each owner holds its queues' locks: a queue still changing hands at
                # the failover waits out the new master's hold-off, as it must.
                await wait_until_async(every_queue_handled, 60, "every owner consumes")
                old = await asyncio.to_thread(group.master)
                group.brokers[old].kill()
                await asyncio.to_thread(group.master, 30.0, other_than=old)
                took_over = time.monotonic()

                async def every_queue_resumed() -> bool:
                    return {q for t, q, _, _ in handled if t > took_over} == set(range(QUEUES))

                await wait_until_async(every_queue_resumed, 90, "every queue is consumed again")
                firsts = [min(t for t, q, _, _ in handled if t > took_over and q == queue)
                          for queue in range(QUEUES)]  # fmt: skip
                return max(firsts) - took_over
            finally:
                stop.set()
                await sending
                for member in members:
                    await member.close()

    try:
        resume_s = run_async(scenario(), timeout_s=180)
    finally:
        group.stop()
    print(json.dumps({"ordered_resume_s": round(resume_s, 3)}))
    assert overlaps == []
    by_key: dict[str, list[int]] = defaultdict(list)
    for _, _, key, seq in handled:
        by_key[key].append(seq)
    for key, sequence in by_key.items():
        # At least once: a queue may repeat its uncommitted tail after the failover, but
        # each value is first handled after every smaller one (sends that failed are
        # gaps, not disorder).
        firsts = list(dict.fromkeys(sequence))
        assert firsts == sorted(firsts), f"{key} out of order: {firsts}"
    assert resume_s <= deadline(RESUME_BOUND_S), (
        f"ordered consumption resumed {resume_s:.2f} s after"
    )
