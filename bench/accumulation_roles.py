"""The processes ``bench_accumulation.py`` starts: one consumer draining a backlog (metaq's
push consumer, RabbitMQ stream, NATS JetStream, Redis streams, Kafka with confluent-kafka),
and the cold phase's open-loop producer and real-time consumer.

Run as ``python accumulation_roles.py ROLE 'JSON'``. Every role speaks the same line
protocol with its parent, so the parent times each system alike:

- the role prints ``ready`` once connected and set up, then waits for a ``go JSON`` line
  (the schedule, in ``time.monotonic()`` seconds: one clock for every process here);
- a drain prints ``progress COUNT BYTES LAST ENDS`` every :data:`PROGRESS_S` (messages
  and body bytes so far, when the last arrived, and for metaq a JSON map of queue id to
  one past the highest queue offset received: how the parent tells that two processes
  of a group have drained everything, since a rebalance makes them repeat some);
- on ``stop`` it stops consuming and prints ``result JSON``, its last line.

A drain's consumer is what a user of that system gets by default, or the way its docs
drain a backlog: nothing here is tuned for the benchmark.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import struct
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final

import uvloop

PROGRESS_S: Final = 0.1
STAMP: Final = struct.Struct("<BQ")
"""The cold phase's bodies begin with (phase, scheduled send time in ns)."""
PHASES: Final = {1: "baseline", 2: "cold"}
TICK_S: Final = 0.001
KAFKA_BATCH: Final = 1000
KAFKA_POLL_S: Final = 0.05
ANSWER_WAIT_S: Final = 30.0
"""How long the producer waits for its last sends' answers after the schedule ends."""


class Parent:
    """The stdin/stdout protocol, from the child's side."""

    def __init__(self) -> None:
        self.go: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def read() -> None:  # a thread: stdin is a blocking pipe
            for line in sys.stdin:
                word, _, rest = line.strip().partition(" ")
                if word == "go":
                    loop.call_soon_threadsafe(self.go.set_result, json.loads(rest or "{}"))
                elif word == "stop":
                    loop.call_soon_threadsafe(self.stop.set)
            loop.call_soon_threadsafe(self.stop.set)  # the parent went away

        threading.Thread(target=read, daemon=True).start()

    @staticmethod
    def say(*words: object) -> None:
        print(*words, flush=True)


class Counter:
    """Messages and body bytes received, and when the last one came."""

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0
        self.last = 0.0
        self.ends: dict[int, int] = {}

    def add(self, size: int, n: int = 1) -> None:
        self.count += n
        self.bytes += size
        self.last = time.monotonic()

    def reached(self, queue_id: int, offset: int) -> None:
        if offset >= self.ends.get(queue_id, 0):
            self.ends[queue_id] = offset + 1

    async def report(self, parent: Parent) -> None:
        while not parent.stop.is_set():
            parent.say("progress", self.count, self.bytes, self.last, json.dumps(self.ends))
            await asyncio.sleep(PROGRESS_S)  # the report's period, not synchronisation


async def _drain(
    parent: Parent, counter: Counter, consume: Callable[[], Coroutine[Any, Any, None]]
) -> dict[str, Any]:
    """Run ``consume`` from ``go`` until ``stop``, reporting progress meanwhile."""
    parent.say("ready")
    await parent.go
    cpu_began = time.process_time()
    reporter = asyncio.create_task(counter.report(parent))
    task = asyncio.create_task(consume())
    stopped = asyncio.create_task(parent.stop.wait())
    await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # a consumer that died says why
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await reporter
    return {
        "cpu_s": time.process_time() - cpu_began,
        "count": counter.count,
        "bytes": counter.bytes,
        "last": counter.last,
        "ends": counter.ends,
    }


class Pace:
    """Holds a handler back to ``rate`` messages a second from the first it is given:
    a consumer whose work takes that long, which the push consumer's flow control then
    pulls for."""

    def __init__(self, rate: float) -> None:
        self._interval = 1.0 / rate
        self._due = 0.0

    async def wait(self) -> None:
        now = time.monotonic()
        self._due = max(self._due, now - 0.1) + self._interval  # no burst to catch up
        if self._due - now > 0.001:
            await asyncio.sleep(self._due - now)  # the pacing itself


async def metaq_drain(args: dict[str, Any]) -> dict[str, Any]:
    """metaq's push consumer with its default settings (it commits every second, on
    pulls and at close); with ``rate``, its handler paced to that many a second."""
    from metaq.client.consumer import Message, PushConsumer

    parent, counter = Parent(), Counter()
    consumer = PushConsumer([args["nameserver"]], args["group"])
    pace = Pace(args["rate"]) if args.get("rate") else None

    async def handle(message: Message) -> None:
        counter.add(len(message.body))
        counter.reached(message.queue_id, message.queue_offset)
        if pace is not None:
            await pace.wait()

    consumer.subscribe(args["topic"], handle)

    async def consume() -> None:
        await consumer.start()
        await asyncio.Event().wait()  # the handlers run until stopped

    try:
        return await _drain(parent, counter, consume)
    finally:
        await consumer.close()  # commits what was handled


async def rabbitmq_stream_drain(args: dict[str, Any]) -> dict[str, Any]:
    """rstream's consumer from the stream's first offset, default credit."""
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType

    parent, counter = Parent(), Counter()
    consumer = Consumer("127.0.0.1", args["port"], username="guest", password="guest")

    def handle(message: Any, _context: Any) -> None:
        counter.add(len(message))

    async def consume() -> None:
        await consumer.start()
        first = ConsumerOffsetSpecification(OffsetType.FIRST, None)
        await consumer.subscribe(args["stream"], handle, offset_specification=first)
        await asyncio.Event().wait()

    try:
        return await _drain(parent, counter, consume)
    finally:
        await consumer.close()


async def nats_drain(args: dict[str, Any]) -> dict[str, Any]:
    """A durable JetStream pull consumer fetching batches, acknowledging each batch by its
    last message (``AckPolicy.ALL``: the stream's equivalent of committing an offset)."""
    import nats
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    parent, counter = Parent(), Counter()
    nc = await nats.connect(f"nats://127.0.0.1:{args['port']}")
    js = nc.jetstream()
    config = ConsumerConfig(ack_policy=AckPolicy.ALL, deliver_policy=DeliverPolicy.ALL)
    subscription = await js.pull_subscribe(
        args["subject"], durable="drain", stream=args["stream"], config=config
    )

    async def consume() -> None:
        while True:
            try:
                batch = await subscription.fetch(args["batch"], timeout=5)
            except NatsTimeout:
                continue
            for message in batch:
                counter.add(len(message.data))
            await batch[-1].ack()

    try:
        return await _drain(parent, counter, consume)
    finally:
        await nc.close()


async def redis_drain(args: dict[str, Any]) -> dict[str, Any]:
    """XRANGE in batches from the stream's start, each from just past the last id."""
    import redis.asyncio as aioredis

    parent, counter = Parent(), Counter()
    client: Any = aioredis.Redis(host="127.0.0.1", port=args["port"])
    stream, batch = args["stream"], args["batch"]

    async def consume() -> None:
        start = "-"
        while True:
            entries = await client.xrange(stream, min=start, count=batch)
            if not entries:
                await asyncio.sleep(0.01)  # at the end: what a poller does
                continue
            for _id, fields in entries:
                counter.add(len(fields[b"d"]))
            start = b"(" + entries[-1][0]

    try:
        return await _drain(parent, counter, consume)
    finally:
        await client.aclose()


async def kafka_drain(args: dict[str, Any]) -> dict[str, Any]:
    """confluent-kafka's consumer of a new group from the earliest offset, with its
    defaults (offsets committed automatically every 5 s), taking what librdkafka has
    fetched a batch at a time (``consume``, its batch call). A call that waits blocks
    the loop for at most :data:`KAFKA_POLL_S`, so the progress reports go on."""
    from confluent_kafka import Consumer

    parent, counter = Parent(), Counter()
    consumer = Consumer({"bootstrap.servers": args["bootstrap"], "group.id": args["group"],
                         "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.subscribe([args["topic"]])

    async def consume() -> None:
        while True:
            batch = consumer.consume(KAFKA_BATCH, KAFKA_POLL_S)
            for message in batch:
                if message.error() is not None:
                    raise RuntimeError(f"Kafka consumer: {message.error()}")
                counter.add(len(message.value() or b""))
            await asyncio.sleep(0)  # the reporter and the parent's stop

    try:
        return await _drain(parent, counter, consume)
    finally:
        consumer.close()  # commits what was consumed


class CollectorPauses:
    """This process's garbage-collector pauses, reported beside its latencies: a pause
    delays every send or delivery scheduled in it, and is the harness's, not the
    broker's."""

    def __init__(self) -> None:
        self._pauses: list[tuple[int, float]] = []
        self._began = 0.0
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self._pauses.append((info["generation"], time.perf_counter() - self._began))

    def summary(self) -> dict[str, dict[str, float | int]]:
        """Per generation: how many collections, the longest and the total in ms."""
        out: dict[str, dict[str, float | int]] = {}
        for generation in range(3):
            ms = [s * 1000 for g, s in self._pauses if g == generation]
            out[f"gen{generation}"] = {
                "count": len(ms), "max_ms": round(max(ms, default=0.0), 2),
                "total_ms": round(sum(ms), 1),
            }  # fmt: skip
        return out


def _percentiles(latencies_ns: list[int]) -> dict[str, float | int]:
    ordered = sorted(latencies_ns)
    if not ordered:
        return {"n": 0, "p50_ms": float("nan"), "p99_ms": float("nan")}

    def at(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] / 1e6, 3)

    return {"n": len(ordered), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": at(1.0)}


def _phase_of(sched: float, go: dict[str, Any]) -> int:
    if go["baseline"][0] <= sched < go["baseline"][1]:
        return 1
    if go["cold"][0] <= sched < go["cold"][1]:
        return 2
    return 0


async def cold_producer(args: dict[str, Any]) -> dict[str, Any]:
    """Sends ``rate`` msgs/s open loop (each message at its scheduled time, whether or not
    earlier ones were answered) from ``go["start"]`` to ``go["end"]``; a send's latency
    runs from its scheduled time to its acknowledgement."""
    from ticker import Ticker

    from metaq.client.producer import Producer

    parent = Parent()
    pauses = CollectorPauses()
    rate, size, topic = args["rate"], args["size"], args["topic"]
    padding = b"x" * (size - STAMP.size)
    latencies: dict[int, list[int]] = {1: [], 2: [], 0: []}
    acked_last: dict[int, int] = {1: 0, 2: 0, 0: 0}
    errors = 0
    behind_max_s = 0.0
    async with Producer([args["nameserver"]], linger_ms=0.5) as producer:
        await producer.send(topic, STAMP.pack(0, time.monotonic_ns()) + padding)  # warm
        gc.freeze()  # set-up's objects out of the collector's walks, as a service would
        parent.say("ready")
        go = await parent.go

        outstanding = 0
        all_answered = asyncio.Event()

        def acked(sched_ns: int, phase: int, future: asyncio.Future[Any]) -> None:
            nonlocal errors, outstanding
            outstanding -= 1
            if not outstanding:
                all_answered.set()
            if future.exception() is not None:
                errors += 1
                return
            now = time.monotonic_ns()
            latencies[phase].append(now - sched_ns)
            acked_last[phase] = max(acked_last[phase], now)

        start, end = go["start"], go["end"]
        sent = 0
        with Ticker(TICK_S, start) as ticker:
            await ticker.wait()
            while (now := time.monotonic()) < end:
                due = int((now - start) * rate) + 1
                if sent < due:
                    behind_max_s = max(behind_max_s, now - (start + sent / rate))
                for index in range(sent, due):
                    sched = start + index / rate
                    sched_ns = int(sched * 1e9)
                    phase = _phase_of(sched, go)
                    future = producer.send_async(topic, STAMP.pack(phase, sched_ns) + padding)
                    future.add_done_callback(
                        lambda f, s=sched_ns, p=phase: acked(s, p, f)  # type: ignore[misc]
                    )
                    outstanding += 1
                    all_answered.clear()
                sent = max(sent, due)
                await ticker.wait()
        # Bounded: a producer starved of CPU may have fallen minutes behind. The sends
        # are not kept in a list meanwhile: hundreds of thousands of futures held made
        # each full collection of this process pause it for up to 80 ms, which the
        # latencies of both phases then showed.
        if outstanding:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_answered.wait(), ANSWER_WAIT_S)
        unanswered = outstanding
    result: dict[str, Any] = {
        "sent": sent,
        "errors": errors,
        "unanswered": unanswered,
        "behind_max_s": round(behind_max_s, 3),
        "gc_pauses": pauses.summary(),
    }
    for phase, name in PHASES.items():
        window = go[name][1] - go[name][0]
        figures = _percentiles(latencies[phase])
        # Acknowledged per second over the phase's schedule, to the last acknowledgement.
        took = max(window, acked_last[phase] / 1e9 - go[name][0]) if latencies[phase] else window
        figures["acked_msgs_s"] = round(len(latencies[phase]) / took, 1)
        result[name] = figures
    parent.say("result", json.dumps(result))
    await parent.stop.wait()
    return result


async def cold_realtime(args: dict[str, Any]) -> dict[str, Any]:
    """A push consumer (default settings) of its own group, from the topic's end: each
    message's end-to-end latency, scheduled send to handler."""
    from metaq.client.consumer import LAST, Message, PushConsumer

    parent = Parent()
    pauses = CollectorPauses()
    latencies: dict[int, list[int]] = {1: [], 2: [], 0: []}
    consumer = PushConsumer([args["nameserver"]], args["group"], consume_from=LAST)

    async def handle(message: Message) -> None:
        phase, sched_ns = STAMP.unpack_from(message.body)
        latencies.get(phase, latencies[0]).append(time.monotonic_ns() - sched_ns)

    consumer.subscribe(args["topic"], handle)
    await consumer.start()
    try:
        deadline = time.monotonic() + 30
        # Ready once every queue is taken with its start committed: nothing sent from
        # now on is missed.
        while not (
            len(consumer.assigned_queues) == args["queues"]
            and all(
                (q := consumer.queue_state(k)) is not None and q.committed is not None
                for k in consumer.assigned_queues
            )
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("the real-time consumer did not take every queue in 30 s")
            await asyncio.sleep(0.01)  # poll interval of a deadline-bound wait
        gc.freeze()  # set-up's objects out of the collector's walks, as a service would
        parent.say("ready")
        await parent.go
        await parent.stop.wait()
    finally:
        await consumer.close()
    result: dict[str, Any] = {
        name: _percentiles(latencies[phase]) for phase, name in PHASES.items()
    }
    result["gc_pauses"] = pauses.summary()
    parent.say("result", json.dumps(result))
    return result


ROLES: Final[dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]]] = {
    "metaq": metaq_drain,
    "rabbitmq_stream": rabbitmq_stream_drain,
    "nats": nats_drain,
    "redis": redis_drain,
    "kafka": kafka_drain,
    "cold_producer": cold_producer,
    "cold_realtime": cold_realtime,
}


def main() -> None:
    role, args = sys.argv[1], json.loads(sys.argv[2])

    async def run() -> None:
        result = await ROLES[role](args)
        if role not in ("cold_producer", "cold_realtime"):
            Parent.say("result", json.dumps(result))

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())


if __name__ == "__main__":
    main()
