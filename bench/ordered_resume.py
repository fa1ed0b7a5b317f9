"""Ordered consumers across kill -9 of their master (``make bench-failover``).

Two members of an ordered consumer group share a topic's queues on a sync group of two;
a producer keeps sending with eight sharding keys. Each run kills the master, and times
from the new master being seen until every queue is handled again
(``ordered_resume_p99_s`` over the runs; target 2 s). The old master is started again
and back in sync before the next run.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from metaq.client.admin import Admin, TopicSettings
from metaq.client.consumer import FIRST, PushConsumer
from metaq.client.message import Message
from metaq.client.producer import Producer
from metaq.testing import BrokerProcess
from metaq.testing.cluster import Group
from metaq.testing.waiting import wait_until, wait_until_async

TOPIC: Final = "bench-ordered"
QUEUES: Final = 4
KEYS: Final = [f"key-{n}" for n in range(8)]


def _role(broker: BrokerProcess) -> str:
    state = broker.health(timeout_s=2.0)
    return str(state["role"]) if state is not None else "unreachable"


async def _kill_and_time(group: Group, handled: list[tuple[float, int]]) -> float:
    """kill -9 the master; seconds from the new master until every queue is handled."""
    await asyncio.to_thread(group.wait_committed_in_sync, [0, 1], 60)
    old = await asyncio.to_thread(group.master, 30)
    group.brokers[old].kill()
    others = [b for i, b in group.brokers.items() if i != old]
    await asyncio.to_thread(
        wait_until, lambda: any(_role(b) == "master" for b in others), 60, "a new master",
        poll_s=0.02,
    )  # fmt: skip
    took_over = time.monotonic()

    async def resumed() -> bool:
        return {q for t, q in handled if t > took_over} == set(range(QUEUES))

    await wait_until_async(resumed, 90, "every queue is handled again")
    firsts = [min(t for t, q in handled if t > took_over and q == queue) for queue in range(QUEUES)]
    await asyncio.to_thread(group.start_broker, old)
    return max(firsts) - took_over


def ordered_resumes(group: Group, nameserver: str, runs: int) -> list[float]:
    """Per kill, seconds from the new master until every ordered queue is handled."""
    master = group.brokers[group.master(30)]
    asyncio.run(
        Admin().put_topic(
            master.http_url, TOPIC, TopicSettings(read_queues=QUEUES, write_queues=QUEUES)
        )
    )
    handled: list[tuple[float, int]] = []

    async def handle(message: Message) -> None:
        handled.append((time.monotonic(), message.queue_id))

    async def run_all() -> list[float]:
        members = []
        for _ in range(2):
            member = PushConsumer(
                [nameserver], "bench-ordered-g", consume_from=FIRST,
                rebalance_interval_s=0.5, heartbeat_interval_s=0.3, lock_retry_ms=100,
            )  # fmt: skip
            member.subscribe_ordered(TOPIC, handle)
            members.append(member)
        stop = asyncio.Event()
        times: list[float] = []
        async with Producer([nameserver], send_timeout_s=2.0) as producer:

            async def produce() -> None:
                while not stop.is_set():
                    for key in KEYS:
                        try:
                            await producer.send(TOPIC, key.encode(), sharding_key=key)
                        except Exception:
                            await asyncio.sleep(0.05)  # pacing after a failure
                    await asyncio.sleep(0.005)  # pacing: about 150 rounds a second

            sending = asyncio.ensure_future(produce())
            try:
                for member in members:
                    await member.start()

                async def settled() -> bool:
                    owned = [{q for _, _, q in m.assigned_queues} for m in members]
                    return all(owned) and sorted(q for o in owned for q in o) == list(range(QUEUES))

                await wait_until_async(settled, 60, "the members share the queues")
                since = time.monotonic()

                async def owners_handle() -> bool:
                    return {q for t, q in handled if t > since} == set(range(QUEUES))

                await wait_until_async(owners_handle, 60, "every owner handles its queues")
                for run in range(runs):
                    times.append(await _kill_and_time(group, handled))
                    print(f"  ordered resume {run + 1}: {times[-1]:.3f} s", flush=True)
            finally:
                stop.set()
                await sending
                for member in members:
                    await member.close()
        return times

    return asyncio.run(run_all())
