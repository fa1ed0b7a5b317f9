"""The chaos workload, a process of its own (on the cluster's client host).

    python -m chaoslib.workload SPEC.json

Producers send at a steady, bounded rate, one message at a time each, every body
starting with a unique id (``<producer>-<n>``); the ordered producer cycles through
sharding keys and numbers each key's messages. Push consumers in consumer groups read
everything and commit offsets. Every send (invoke, then ok / info) and every handled
message (read) goes to the history file (see :mod:`chaoslib.history`).

SIGTERM ends the producing; the consumers then drain: until each queue's consumer has
handled everything up to the queue's end as the current master reports it, or the drain
deadline passes. A ``drain`` event says which, and the process exits 0.
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


@dataclass
class ConsumerSpec:
    group: str
    topics: list[str]
    concurrency: int = 16


@dataclass
class WorkloadSpec:
    nameservers: list[str]
    history: str
    producers: list[ProducerSpec] = field(default_factory=list)
    consumers: list[ConsumerSpec] = field(default_factory=list)
    drain_timeout_s: float = 90.0

    @classmethod
    def load(cls, path: Path) -> WorkloadSpec:
        raw = json.loads(path.read_text())
        return cls(
            nameservers=raw["nameservers"],
            history=raw["history"],
            producers=[ProducerSpec(**p) for p in raw.get("producers", [])],
            consumers=[ConsumerSpec(**c) for c in raw.get("consumers", [])],
            drain_timeout_s=raw.get("drain_timeout_s", 90.0),
        )

    def dump(self) -> str:
        return json.dumps(
            {
                "nameservers": self.nameservers,
                "history": self.history,
                "producers": [vars(p) for p in self.producers],
                "consumers": [vars(c) for c in self.consumers],
                "drain_timeout_s": self.drain_timeout_s,
            }
        )


def _outcome(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


async def produce(spec: ProducerSpec, nameservers: list[str], history: HistoryWriter,
                  stop: asyncio.Event) -> None:  # fmt: skip
    producer = Producer(nameservers, send_timeout_s=spec.send_timeout_s, retries=spec.retries)
    await producer.start()
    period = 1.0 / spec.rate_hz
    next_at = time.monotonic()
    n = 0
    try:
        while not stop.is_set():
            message_id = f"{spec.name}-{n:07d}"
            fields: dict[str, Any] = {"id": message_id, "topic": spec.topic, "group": spec.group,
                                      "producer": spec.name}  # fmt: skip
            key = None
            if spec.keys:
                key = f"k{n % spec.keys}"
                fields["key"] = key
                fields["seq"] = n // spec.keys
            body = message_id.encode() + b" " + b"x" * max(0, spec.body_bytes - len(message_id))
            n += 1
            history.write("invoke", **fields)
            try:
                result = await producer.send(spec.topic, body, sharding_key=key)
            except Exception as exc:
                history.write("info", **fields, error=_outcome(exc))
            else:
                where = {"broker": result.broker, "queue": result.queue_id,
                         "offset": result.queue_offset, "msg_id": result.msg_id}  # fmt: skip
                if result.status is SendStatus.OK:
                    history.write("ok", **fields, **where)
                else:
                    history.write("info", **fields, **where, status=result.status.value)
            next_at = max(next_at + period, time.monotonic())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(next_at - time.monotonic()):
                    await stop.wait()
    finally:
        await producer.close()


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

    async def start(self) -> None:
        for spec in self.specs:
            consumer = PushConsumer(
                self.nameservers, spec.group, concurrency=spec.concurrency,
                rebalance_interval_s=5.0, heartbeat_interval_s=2.0,
            )  # fmt: skip
            for topic in spec.topics:
                consumer.subscribe(topic, self._handler(spec.group))
            await consumer.start()
            self.consumers.append(consumer)

    def _handler(self, group: str) -> Any:
        async def handle(message: Message) -> None:
            message_id = message.body.split(b" ", 1)[0].decode(errors="replace")
            self.history.write(
                "read", id=message_id, consumer=group, topic=message.topic,
                queue=message.queue_id, offset=message.queue_offset,
            )  # fmt: skip
            key = (group, message.topic, message.queue_id)
            self.handled_to[key] = max(self.handled_to.get(key, 0), message.queue_offset + 1)

        return handle

    async def drain(self, timeout_s: float) -> None:
        """Until every queue is handled up to its end, or ``timeout_s``; a drain event."""
        deadline = time.monotonic() + timeout_s
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
                if not behind or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.25)  # polling the queues' ends, not a synchronisation
        self.history.write("drain", ok=not behind, behind=behind)

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
    await consumers.drain(spec.drain_timeout_s)
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
