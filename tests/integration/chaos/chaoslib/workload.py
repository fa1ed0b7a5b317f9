"""The chaos workload, a process of its own (on the cluster's client host).

    python -m chaoslib.workload SPEC.json

Producers send at a steady, bounded rate, each with at most ``in_flight`` sends
unanswered (one at a time by default; hundreds for the high-rate producer of the
adversary scenarios), every body starting with a unique id (``<producer>-<n>``); the
ordered producer cycles through sharding keys and numbers each key's messages. Push
consumers in consumer groups read everything and commit offsets. Every send (invoke,
then ok / info) and every handled message (read) goes to the history file (see
:mod:`chaoslib.history`).

SIGTERM ends the producing; the consumers then drain: until each queue's consumer has
handled everything up to the queue's end as the current master reports it, or the drain
stalls. A ``drain`` event says which, and the process exits 0. The drain stalls only
after ``drain_timeout_s`` without any queue advancing (90 s: three times the 30 s queue
lock time to live that a new master waits out before it grants an ordered queue's lock
again), so a backlog drains however long it takes, up to ``drain_max_s``, while a
consumer that handles nothing fails in bounded time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoslib.history import HistoryWriter
from metaq.client.consumer import PullConsumer, PushConsumer
from metaq.client.message import Message
from metaq.client.producer import Producer
from metaq.client.results import SendStatus

log = logging.getLogger("chaoslib.workload")


@dataclass
class ProducerSpec:
    name: str
    topic: str
    group: str
    rate_hz: float
    send_timeout_s: float = 2.0
    retries: int = 2
    keys: int = 0
    """Sharding keys of an ordered producer (0: no key)."""
    body_bytes: int = 128
    in_flight: int = 1
    """Sends awaiting their answer at once; the rate still bounds how many start."""


@dataclass
class ConsumerSpec:
    group: str
    topics: list[str]
    concurrency: int = 16
    held: bool = False
    """Joins its group at once but handles nothing until SIGUSR1 (a group that has not
    read yet: what disk pressure must not delete)."""


@dataclass
class WorkloadSpec:
    nameservers: list[str]
    history: str
    producers: list[ProducerSpec] = field(default_factory=list)
    consumers: list[ConsumerSpec] = field(default_factory=list)
    drain_timeout_s: float = 90.0
    """How long the drain may go without any queue advancing."""
    drain_max_s: float = 180.0
    """The drain's absolute bound, progress or not."""

    @classmethod
    def load(cls, path: Path) -> WorkloadSpec:
        raw = json.loads(path.read_text())
        return cls(
            nameservers=raw["nameservers"],
            history=raw["history"],
            producers=[ProducerSpec(**p) for p in raw.get("producers", [])],
            consumers=[ConsumerSpec(**c) for c in raw.get("consumers", [])],
            drain_timeout_s=raw.get("drain_timeout_s", 90.0),
            drain_max_s=raw.get("drain_max_s", 180.0),
        )

    def dump(self) -> str:
        return json.dumps(
            {
                "nameservers": self.nameservers,
                "history": self.history,
                "producers": [vars(p) for p in self.producers],
                "consumers": [vars(c) for c in self.consumers],
                "drain_timeout_s": self.drain_timeout_s,
                "drain_max_s": self.drain_max_s,
            }
        )


def _outcome(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


async def produce(spec: ProducerSpec, nameservers: list[str], history: HistoryWriter,
                  stop: asyncio.Event) -> None:  # fmt: skip
    producer = Producer(nameservers, send_timeout_s=spec.send_timeout_s, retries=spec.retries)
    await producer.start()
    period = 1.0 / spec.rate_hz
    slots = asyncio.Semaphore(spec.in_flight)
    sends: set[asyncio.Task[None]] = set()
    next_at = time.monotonic()
    n = 0

    def finished(done: asyncio.Task[None]) -> None:
        slots.release()
        sends.discard(done)

    try:
        while not stop.is_set():
            await slots.acquire()
            if stop.is_set():
                slots.release()
                break
            task = asyncio.create_task(_send_one(spec, producer, history, n))
            task.add_done_callback(finished)
            sends.add(task)
            n += 1
            next_at = max(next_at + period, time.monotonic())
            if next_at > time.monotonic():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(next_at - time.monotonic()):
                        await stop.wait()
        # Every send invoked gets its answer (ok or info) before the producer closes.
        await asyncio.gather(*sends, return_exceptions=True)
    finally:
        await producer.close()


async def _send_one(spec: ProducerSpec, producer: Producer, history: HistoryWriter,
                    n: int) -> None:  # fmt: skip
    message_id = f"{spec.name}-{n:07d}"
    fields: dict[str, Any] = {"id": message_id, "topic": spec.topic, "group": spec.group,
                              "producer": spec.name}  # fmt: skip
    key = None
    if spec.keys:
        key = f"k{n % spec.keys}"
        fields["key"] = key
        fields["seq"] = n // spec.keys
    body = message_id.encode() + b" " + b"x" * max(0, spec.body_bytes - len(message_id))
    history.write("invoke", **fields)
    try:
        result = await producer.send(spec.topic, body, sharding_key=key)
    except Exception as exc:
        history.write("info", **fields, error=_outcome(exc))
        return
    where = {"broker": result.broker, "queue": result.queue_id,
             "offset": result.queue_offset, "msg_id": result.msg_id}  # fmt: skip
    if result.status is SendStatus.OK:
        history.write("ok", **fields, **where)
    else:
        history.write("info", **fields, **where, status=result.status.value)


class Consumers:
    """The workload's push consumers and how far each queue has been handled."""

    def __init__(self, specs: list[ConsumerSpec], nameservers: list[str],
                 history: HistoryWriter) -> None:  # fmt: skip
        self.nameservers = nameservers
        self.history = history
        self.specs = specs
        self.handled_to: dict[tuple[str, str, int], int] = {}
        """(consumer group, topic, queue id) -> one past the highest offset handled."""
        self.consumers: list[PushConsumer] = []
        self.released = asyncio.Event()
        """Set by SIGUSR1: held groups start handling."""

    async def start(self) -> None:
        for spec in self.specs:
            consumer = PushConsumer(
                self.nameservers, spec.group, concurrency=spec.concurrency,
                rebalance_interval_s=5.0, heartbeat_interval_s=2.0,
            )  # fmt: skip
            for topic in spec.topics:
                consumer.subscribe(topic, self._handler(spec.group, spec.held))
            await consumer.start()
            self.consumers.append(consumer)

    def _handler(self, group: str, held: bool) -> Any:
        async def handle(message: Message) -> None:
            if held:
                await self.released.wait()
            message_id = message.body.split(b" ", 1)[0].decode(errors="replace")
            self.history.write(
                "read", id=message_id, consumer=group, topic=message.topic,
                queue=message.queue_id, offset=message.queue_offset,
            )  # fmt: skip
            key = (group, message.topic, message.queue_id)
            self.handled_to[key] = max(self.handled_to.get(key, 0), message.queue_offset + 1)

        return handle

    async def drain(self, stall_s: float, max_s: float) -> None:
        """Until every queue is handled up to its end; a drain event. Gives up after
        ``stall_s`` with no queue advancing, or ``max_s`` in all."""
        started = time.monotonic()
        progress_at, progress = started, -1
        behind: dict[str, Any] = {}
        async with PullConsumer(self.nameservers, "chaos-drain-probe") as probe:
            while True:
                behind = {}
                try:
                    for spec in self.specs:
                        for topic in spec.topics:
                            for queue in await probe.queues(topic, refresh=True):
                                bounds = await probe.query(topic, queue, with_committed=False)
                                done = self.handled_to.get((spec.group, topic, queue.queue_id), 0)
                                if done < bounds.max_offset:
                                    behind[f"{spec.group}/{topic}/{queue.queue_id}"] = [
                                        done,
                                        bounds.max_offset,
                                    ]
                except Exception as exc:
                    behind = {"error": _outcome(exc)}
                now = time.monotonic()
                handled = sum(self.handled_to.values())
                if handled > progress:
                    progress_at, progress = now, handled
                if not behind or now - progress_at > stall_s or now - started > max_s:
                    break
                await asyncio.sleep(0.25)  # polling the queues' ends, not a synchronisation
        self.history.write("drain", ok=not behind, behind=behind,
                           seconds=round(time.monotonic() - started, 3))  # fmt: skip

    async def close(self) -> None:
        for consumer in self.consumers:
            with contextlib.suppress(Exception):
                await consumer.close()


async def run(spec: WorkloadSpec) -> None:
    history = HistoryWriter(Path(spec.history))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    consumers = Consumers(spec.consumers, spec.nameservers, history)
    loop.add_signal_handler(signal.SIGUSR1, consumers.released.set)
    await consumers.start()
    tasks = [asyncio.create_task(produce(p, spec.nameservers, history, stop))
             for p in spec.producers]  # fmt: skip
    history.write("workload", phase="started")
    await stop.wait()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            history.write("workload", phase="producer-crashed", error=_outcome(result))
    history.write("workload", phase="produced")
    consumers.released.set()
    await consumers.drain(spec.drain_timeout_s, spec.drain_max_s)
    await consumers.close()
    history.write("workload", phase="stopped")
    history.close()


def main() -> int:
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )  # fmt: skip
    spec = WorkloadSpec.load(Path(sys.argv[1]))
    asyncio.run(run(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
