"""Apache Kafka 4 as a peer of the side-by-side benchmark: its servers, started from the
jars ``make peers-kafka`` resolves into ``bench/peers/kafka/lib``, and the clients its
users pick (confluent-kafka, aiokafka, and Kafka's own ``ProducerPerformance``).

Two setups, each started and stopped here like the other peers (``peer_servers.py``):
in a process group of its own, on 127.0.0.1 with free ports, its data under the given
directory, at the CPU priority metaq's broker takes.

- **One broker** — one KRaft process in combined mode (``process.roles =
  broker,controller``), topic of one replica, producers with ``acks=1``.
- **Three brokers** — three KRaft processes, each broker and controller (combined mode:
  the controller quorum is the three of them), topic with replication factor 3 and
  ``min.insync.replicas=2``; producers with ``acks=all`` and idempotence on. Three
  more JVMs as dedicated controllers would take the two cores from the brokers, so the
  quorum lives inside them, as metaq's controller lives in its nameserver.

Each node's directory is formatted with ``kafka.tools.StorageTool format`` (what
``kafka-storage.sh format`` runs) under one random cluster id and a static quorum
(``controller.quorum.voters``), then started with ``kafka.Kafka``, the JVM options of
``kafka-server-start.sh`` (1 GiB heap, G1) and every broker setting at its default but
the listeners, the replication factors and ``group.initial.rebalance.delay.ms=0``.
Kafka's default is to acknowledge from the page cache and leave flushing to the OS
(``log.flush.interval.messages`` unbounded): no fsync before the ack, as metaq's ASYNC
flush.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from compare_harness import IN_FLIGHT, EndToEnd, Latencies, OpenLoop, offer
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from metaq_load import Budget
from peer_servers import ServerProcess, free_port

PEER_DIR: Final = Path(__file__).parent / "peers" / "kafka"
LIB: Final = PEER_DIR / "lib"
STAMP: Final = LIB / ".stamp"
"""Written by ``make peers-kafka`` once every jar is in ``LIB``."""
HEAP: Final = ("-Xms1g", "-Xmx1g")
"""``kafka-server-start.sh``'s default heap: 1 GiB of this 24 GiB box per broker."""
JVM_OPTS: Final = (
    "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)  # fmt: skip
"""``kafka-run-class.sh``'s ``KAFKA_JVM_PERFORMANCE_OPTS``."""
TOOL_HEAP: Final = ("-Xmx512m",)
"""``kafka-producer-perf-test.sh``'s heap."""
FORMAT_OPTS: Final = (*TOOL_HEAP, "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
"""The storage tool runs for a second: no optimising compiler or concurrent collector
to start (about half its CPU, seconds on a loaded machine)."""
TOPIC: Final = "bench-compare"
PARTITIONS: Final = 8
"""As many as metaq's topic has queues (``metaq_system.QUEUES``)."""
CLUSTER_SIZE: Final = 3
BOOT_S: Final = 120.0
"""How long a node may take to format, start and join (JVM start-up on a loaded box)."""
ACK_WAIT_S: Final = 30.0
LOG4J2: Final = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.request.name = kafka.request.logger
logger.request.level = warn
"""
"""Kafka's own log levels (its ``config/log4j2.yaml``), to the node's log file."""


class KafkaNotInstalled(RuntimeError):
    """Kafka's jars were not resolved; says what to run."""


def require_jars() -> None:
    if not STAMP.exists():
        raise KafkaNotInstalled(
            f"Kafka's jars are not in {LIB}: run `make peers-kafka` (Maven resolves them "
            f"from {PEER_DIR / 'pom.xml'}), or leave the kafka launchers out of --only"
        )


def java_argv(*args: str) -> list[str]:
    """A java command line with Kafka's jars on the class path."""
    return ["java", "-cp", f"{LIB}/*", *args]


def _cluster_id() -> str:
    """A random id as Kafka writes them (URL-safe base64 of 16 bytes, unpadded), not
    starting with '-', which the tools would read as an option."""
    while True:
        text = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


@dataclass(frozen=True)
class KafkaCluster:
    """Running Kafka nodes; ``replicas`` copies of each partition of :data:`TOPIC`."""

    servers: list[ServerProcess]
    """By node: ``servers[i]`` is node ``i + 1``, replaced when :func:`restart_node`."""
    bootstrap: str
    replicas: int
    work: Path
    argv: list[list[str]]
    """What started each node, to start it again."""

    @property
    def pids(self) -> list[int]:
        """Every node's process id, for what reads its /proc entry (CPU) or kills it."""
        return [server.proc.pid for server in self.servers]


def _node_config(node: int, ports: list[tuple[int, int]], data: Path) -> str:
    voters = ",".join(f"{i}@127.0.0.1:{ctl}" for i, (_, ctl) in enumerate(ports, 1))
    client, ctl = ports[node - 1]
    replicas = len(ports)
    return "\n".join(
        [
            f"node.id={node}",
            "process.roles=broker,controller",
            f"controller.quorum.voters={voters}",
            f"listeners=PLAINTEXT://127.0.0.1:{client},CONTROLLER://127.0.0.1:{ctl}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{client}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"log.dirs={data}",
            f"num.partitions={PARTITIONS}",
            f"default.replication.factor={replicas}",
            f"offsets.topic.replication.factor={replicas}",
            f"transaction.state.log.replication.factor={replicas}",
            f"transaction.state.log.min.isr={min(2, replicas)}",
            f"min.insync.replicas={min(2, replicas)}",
            # A lone consumer's group needs no wait for others to join.
            "group.initial.rebalance.delay.ms=0",
            "",
        ]
    )


def _format(node_dir: Path, config: Path, cluster_id: str) -> None:
    argv = java_argv(*FORMAT_OPTS, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c",
                 str(config))  # fmt: skip
    done = subprocess.run(argv, cwd=node_dir, capture_output=True, timeout=BOOT_S, check=False)
    if done.returncode != 0:
        said = (done.stdout + done.stderr).decode(errors="replace")[-3000:]
        raise RuntimeError(f"kafka-storage format of {node_dir} failed:\n{said}")


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def _wait(what: str, check: Callable[[], bool], servers: list[ServerProcess]) -> None:
    """Until ``check()``, within :data:`BOOT_S`; the nodes' logs in the error otherwise."""
    deadline = time.monotonic() + BOOT_S
    while True:
        with contextlib.suppress(KafkaException):
            if check():
                return
        dead = [s for s in servers if s.proc.poll() is not None]
        if dead or time.monotonic() > deadline:
            why = f"{dead[0].name} exited" if dead else f"not within {BOOT_S:.0f} s"
            tails = "\n".join(
                f"--- {s.name}\n{s.log_path.read_text(errors='replace')[-2000:]}" for s in servers
            )
            raise RuntimeError(f"Kafka: {what}: {why}; the logs end:\n{tails}")
        time.sleep(0.2)  # poll interval of a deadline-bound wait


def _brokers_up(admin: AdminClient, size: int) -> bool:
    return len(admin.list_topics(timeout=5).brokers) == size


def _topic_in_sync(admin: AdminClient, name: str, partitions: int, replicas: int) -> bool:
    topic = admin.list_topics(name, timeout=5).topics.get(name)
    if topic is None or topic.error is not None or len(topic.partitions) != partitions:
        return False
    return all(p.leader >= 0 and len(p.isrs) == replicas for p in topic.partitions.values())


def create_topic(cluster: KafkaCluster, topic: str = TOPIC, partitions: int = PARTITIONS) -> None:
    """``topic``, ``partitions`` partitions of ``cluster.replicas`` copies
    (``min.insync.replicas`` 2 where there are more), and until every partition has a
    leader and all its replicas in sync."""
    admin = _admin(cluster.bootstrap)
    config = {"min.insync.replicas": str(min(2, cluster.replicas))}
    futures = admin.create_topics([NewTopic(topic, partitions, cluster.replicas, config=config)])
    futures[topic].result(timeout=BOOT_S)
    wait_topic(cluster, topic, partitions)


def wait_topic(cluster: KafkaCluster, topic: str = TOPIC, partitions: int = PARTITIONS) -> None:
    """Until every partition of ``topic`` has a leader and all its replicas in sync."""
    admin = _admin(cluster.bootstrap)
    _wait("the topic's replicas in sync",
          lambda: _topic_in_sync(admin, topic, partitions, cluster.replicas),
          cluster.servers)  # fmt: skip


def start_kafka(work: Path, size: int = 1) -> KafkaCluster:
    """``size`` combined broker-controller nodes in one KRaft cluster, with :data:`TOPIC`
    created; stop each of ``servers`` (or start them with :func:`kafka_running`)."""
    require_jars()
    work.mkdir(parents=True, exist_ok=True)
    ports = [(free_port(), free_port()) for _ in range(size)]
    cluster_id = _cluster_id()
    log4j = work / "log4j2.properties"
    log4j.write_text(LOG4J2)
    servers: list[ServerProcess] = []
    commands: list[list[str]] = []
    try:
        for node in range(1, size + 1):
            node_dir = work / f"kafka-{node}"
            node_dir.mkdir(parents=True, exist_ok=True)
            config = node_dir / "server.properties"
            config.write_text(_node_config(node, ports, node_dir / "data"))
            _format(node_dir, config, cluster_id)
            argv = java_argv(*HEAP, *JVM_OPTS, f"-Dlog4j2.configurationFile={log4j}",
                         "kafka.Kafka", str(config))  # fmt: skip
            server = ServerProcess.spawn(f"kafka-{node}", argv, node_dir)
            server.ports["client"] = ports[node - 1][0]
            servers.append(server)
            commands.append(argv)
        for server in servers:
            server.wait_listening(server.ports["client"], BOOT_S)
        bootstrap = ",".join(f"127.0.0.1:{s.ports['client']}" for s in servers)
        cluster = KafkaCluster(servers, bootstrap, size, work, commands)
        admin = _admin(bootstrap)
        _wait(f"{size} brokers registered", lambda: _brokers_up(admin, size), servers)
        create_topic(cluster)
    except BaseException:
        for server in reversed(servers):
            server.stop()
        raise
    return cluster


def kill_node(cluster: KafkaCluster, node: int) -> None:
    """``kill -9`` of node ``node`` (1-based), reaped."""
    server = cluster.servers[node - 1]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(30)


def restart_node(cluster: KafkaCluster, node: int) -> None:
    """Node ``node`` started again on its data and ports, until it listens."""
    old = cluster.servers[node - 1]
    server = ServerProcess.spawn(old.name, cluster.argv[node - 1], old.log_path.parent)
    server.ports.update(old.ports)
    cluster.servers[node - 1] = server
    server.wait_listening(server.ports["client"], BOOT_S)


@contextlib.contextmanager
def kafka_running(work: Path, size: int = 1, keep: bool = False) -> Iterator[KafkaCluster]:
    """A cluster of ``size`` nodes for the block's length, stopped however it ends
    (whatever nodes it has then), its data removed unless ``keep``."""
    try:
        cluster = start_kafka(work, size)
        try:
            yield cluster
        finally:
            for server in reversed(cluster.servers):
                server.stop()
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


ONE_COPY: Final = (
    "1 copy (one broker, acks=1): acked once the leader appended it to its log (page "
    "cache); no fsync before the ack (Kafka's default: the OS writes back)"
)
ACKS_ALL: Final = (
    "3 replicas on 3 brokers, acks=all, min.insync.replicas=2, idempotent producer: acked "
    "once every in-sync replica (all 3 while healthy, never fewer than 2) appended it "
    "(page cache); no fsync before the ack"
)


_NO_LEADER_YET: Final = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
)


def _end_offset(consumer: Consumer, partition: int) -> int:
    """The partition's end offset. A fresh consumer's first metadata can still name no
    leader, or an old one, moments after the broker started; that passes within seconds."""
    deadline = time.monotonic() + 30
    while True:
        try:
            high: int = consumer.get_watermark_offsets(TopicPartition(TOPIC, partition), 10)[1]
            return high
        except KafkaException as exc:
            code = exc.args[0].code()
            if code not in _NO_LEADER_YET or time.monotonic() > deadline:
                raise
        time.sleep(0.2)  # poll interval of a deadline-bound wait


class _KafkaRow:
    """What the Kafka rows share: the cluster, and the row's key, label and durability
    by its setup (one broker with acks=1, or three with acks=all)."""

    key: str
    key_r3: str
    label: str
    durability: str
    in_flight_how: str

    def __init__(self, cluster: KafkaCluster) -> None:
        self.cluster = cluster
        self.replicated = cluster.replicas > 1
        self.server_pids = cluster.pids
        if self.replicated:
            self.key, self.label = self.key_r3, self.label + ", 3 brokers, acks=all"
        else:
            self.label += ", acks=1"
        self.durability = ACKS_ALL if self.replicated else ONE_COPY


class KafkaConfluent(_KafkaRow):
    """confluent-kafka (librdkafka), two producers: one at its defaults (``linger.ms``
    5) for (b), (c) and the cost cell, one with ``linger.ms=0`` for (a), as its docs
    advise for the lowest latency of a lone send; both with the setup's acks and
    idempotence, and at most :data:`IN_FLIGHT` unacknowledged. Its calls block; the
    harness runs one cell at a time, so nothing else waits on the event loop meanwhile."""

    key, key_r3 = "kafka", "kafka_r3"
    label = "Kafka, confluent-kafka"
    in_flight_how = (
        f"produce() with ≤ {IN_FLIGHT:,} unacknowledged (queue.buffering.max.messages), "
        "librdkafka's batching (linger.ms 5, its default); (a) with linger.ms 0"
    )

    def __init__(self, cluster: KafkaCluster) -> None:
        super().__init__(cluster)
        self._producers: dict[str, Producer] = {}
        self.acked = 0
        self.failed: KafkaError | None = None

    def producer_config(self, linger_ms: float | None = None) -> dict[str, Any]:
        config: dict[str, Any] = {
            "bootstrap.servers": self.cluster.bootstrap,
            "queue.buffering.max.messages": IN_FLIGHT,
            "log.connection.close": False,
        }
        if linger_ms is not None:
            config["linger.ms"] = linger_ms
        if self.replicated:
            config.update({"acks": "all", "enable.idempotence": True})
        else:
            config["acks"] = 1
        return config

    @property
    def producer(self) -> Producer:
        """For throughput."""
        return self._producers["throughput"]

    @property
    def prompt(self) -> Producer:
        """For latency."""
        return self._producers["latency"]

    def _delivered(self, error: KafkaError | None, _message: Message) -> None:
        if error is None:
            self.acked += 1
        else:
            self.failed = error

    def _check(self) -> None:
        if self.failed is not None:
            raise KafkaException(self.failed)

    async def open(self) -> None:
        for name, linger_ms in (("throughput", None), ("latency", 0.0)):
            producer = Producer(self.producer_config(linger_ms))
            self._producers[name] = producer
            # The first send fetches the metadata and opens the connections.
            producer.produce(TOPIC, b"warm-up", on_delivery=self._delivered)
            self._flush(producer)

    def _flush(self, producer: Producer) -> None:
        if producer.flush(ACK_WAIT_S) != 0:
            raise TimeoutError(f"Kafka did not acknowledge within {ACK_WAIT_S:.0f} s")
        self._check()

    async def close(self) -> None:
        for producer in self._producers.values():
            producer.flush(ACK_WAIT_S)
        self._producers.clear()

    def _produce(
        self, producer: Producer, body: bytes, on_delivery: Callable[..., None] | None = None
    ) -> None:
        """One send, waiting for room while :data:`IN_FLIGHT` are unacknowledged."""
        while True:
            try:
                producer.produce(TOPIC, body, on_delivery=on_delivery or self._delivered)
                return
            except BufferError:
                producer.poll(0.1)  # returns at the first acknowledgement
                self._check()

    async def one_at_a_time(self, body: bytes, budget: Budget) -> list[float]:
        latencies: list[float] = []
        clock = time.perf_counter
        producer = self.prompt
        while budget.going():
            start = clock()
            acked = self.acked
            producer.produce(TOPIC, body, on_delivery=self._delivered)
            while self.acked == acked:
                producer.poll(ACK_WAIT_S)  # returns once the acknowledgement came
                self._check()
            latencies.append(clock() - start)
            budget.sent += 1
        return latencies

    async def in_flight(self, body: bytes, budget: Budget) -> None:
        producer = self.producer
        while budget.going():
            self._produce(producer, body)
            producer.poll(0)
            budget.sent += 1
        self._flush(producer)

    async def paced(self, body: bytes, rate: float, seconds: float) -> int:
        """``rate`` msgs/s offered for ``seconds``; how many were acknowledged."""
        producer = self.producer
        acked = self.acked

        async def send(count: int) -> None:
            for _ in range(count):
                self._produce(producer, body)
            producer.poll(0)

        await offer(rate, seconds, send)
        self._flush(producer)
        return self.acked - acked

    async def paced_latency(
        self, body: bytes, rate: float, seconds: float
    ) -> tuple[int, Latencies]:
        """:meth:`paced`, and the acknowledged sends' latency, each from the tick that
        made it due to its delivery callback (a wait for room counts)."""
        producer = self.producer
        latencies: list[float] = []
        clock = time.perf_counter

        def delivered(due: float) -> Callable[[KafkaError | None, Message], None]:
            def on_delivery(error: KafkaError | None, message: Message) -> None:
                self._delivered(error, message)
                if error is None:
                    latencies.append(clock() - due)

            return on_delivery

        async def send(count: int) -> None:
            callback = delivered(clock())
            for _ in range(count):
                self._produce(producer, body, callback)
            producer.poll(0)

        await offer(rate, seconds, send)
        self._flush(producer)
        return len(latencies), Latencies.of(latencies)

    async def end_to_end(self, size: int, rate: float, seconds: float) -> EndToEnd:
        run = OpenLoop(rate, seconds, size)
        loop = asyncio.get_running_loop()
        producer = self.producer
        consumer = Consumer(
            {"bootstrap.servers": self.cluster.bootstrap, "group.id": "bench-e2e",
             "enable.auto.commit": False, "log.connection.close": False}
        )  # fmt: skip
        # From each partition's end now, so nothing is missed while the consumer starts.
        ends = [_end_offset(consumer, p) for p in range(PARTITIONS)]
        consumer.assign([TopicPartition(TOPIC, p, end) for p, end in enumerate(ends)])
        stop = threading.Event()

        def hand_over(bodies: list[bytes]) -> None:
            for body in bodies:
                run.on_message(body)

        def consume() -> None:
            # poll() returns at the first message (it waits without the GIL), then
            # consume(timeout 0) takes what else is there; the loop runs the callback.
            while not stop.is_set():
                first = consumer.poll(0.1)
                if first is None:
                    continue
                messages = [first, *consumer.consume(1000, 0)]
                bodies = [body for m in messages if (body := m.value()) is not None]
                if bodies:
                    loop.call_soon_threadsafe(hand_over, bodies)

        thread = threading.Thread(target=consume, name="kafka-e2e-consumer", daemon=True)
        thread.start()

        async def send(bodies: list[bytes]) -> None:
            for body in bodies:
                self._produce(producer, body)
            producer.poll(0)

        try:
            return await run.run(send)
        finally:
            stop.set()
            thread.join(5)
            consumer.close()
            self._flush(producer)


class KafkaAio(_KafkaRow):
    """aiokafka, its settings at their defaults but the acks and the idempotence."""

    key, key_r3 = "kafka_aiokafka", "kafka_r3_aiokafka"
    label = "Kafka, aiokafka"
    in_flight_how = f"send() with ≤ {IN_FLIGHT:,} unacknowledged (linger_ms 0, its default)"

    def __init__(self, cluster: KafkaCluster) -> None:
        super().__init__(cluster)
        self._producer: AIOKafkaProducer | None = None
        self._errors = 0

    @property
    def producer(self) -> AIOKafkaProducer:
        assert self._producer is not None, "open() first"
        return self._producer

    async def open(self) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.cluster.bootstrap,
            acks="all" if self.replicated else 1,
            enable_idempotence=self.replicated,
        )
        await self.producer.start()
        await self.producer.send_and_wait(TOPIC, b"warm-up")

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()

    async def one_at_a_time(self, body: bytes, budget: Budget) -> list[float]:
        latencies: list[float] = []
        clock = time.perf_counter
        while budget.going():
            start = clock()
            await self.producer.send_and_wait(TOPIC, body)
            latencies.append(clock() - start)
            budget.sent += 1
        return latencies

    def _count_error(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            self._errors += 1

    async def in_flight(self, body: bytes, budget: Budget) -> None:
        window = asyncio.Semaphore(IN_FLIGHT)
        pending: set[asyncio.Future[Any]] = set()

        def done(future: asyncio.Future[Any]) -> None:
            window.release()
            pending.discard(future)
            self._count_error(future)

        while budget.going():
            await window.acquire()
            future = await self.producer.send(TOPIC, body)
            pending.add(future)
            future.add_done_callback(done)
            budget.sent += 1
        async with asyncio.timeout(ACK_WAIT_S):
            await asyncio.gather(*pending, return_exceptions=True)
        if self._errors:
            raise RuntimeError(f"aiokafka: {self._errors} sends were not acknowledged")

    async def end_to_end(self, size: int, rate: float, seconds: float) -> EndToEnd:
        run = OpenLoop(rate, seconds, size)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.cluster.bootstrap, enable_auto_commit=False
        )
        await consumer.start()
        partitions = [AioTopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_end(*partitions)
        for partition in partitions:  # the end offsets resolved before the first send
            await consumer.position(partition)

        async def receive() -> None:
            while True:
                batches = await consumer.getmany(timeout_ms=100)
                for messages in batches.values():
                    for message in messages:
                        run.on_message(message.value)

        receiver = asyncio.create_task(receive())

        async def send(bodies: list[bytes]) -> None:
            for body in bodies:
                future = await self.producer.send(TOPIC, body)
                future.add_done_callback(self._count_error)

        try:
            return await run.run(send)
        finally:
            receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await receiver
            await consumer.stop()
            await self.producer.flush()


_REPORT: Final = re.compile(r"^(\d+) records sent, ([\d.]+) records/sec")


class KafkaProducerPerf(_KafkaRow):
    """Kafka's own load generator, ``org.apache.kafka.tools.ProducerPerformance``
    (``kafka-producer-perf-test.sh``): the Java client unthrottled, with kafka-clients'
    defaults but the acks and the idempotence. What the servers take from the fastest
    client there is; only the throughput cells, from its once-a-second reports."""

    key, key_r3 = "kafka_perf", "kafka_r3_perf"
    label = "Kafka, ProducerPerformance (Java)"
    in_flight_how = (
        "the Java producer unthrottled (linger.ms 5, batch.size 16 KiB, 5 requests in "
        "flight per connection: kafka-clients' defaults), its own process"
    )

    def throughput(self, size: int, warmup_s: float, seconds: float) -> float:
        """msgs/s acknowledged over ``seconds`` of its reports, after ``warmup_s`` more
        (JVM start and warm-up) not counted; the process is stopped then."""
        acks = ("acks=all", "enable.idempotence=true") if self.replicated else ("acks=1",)
        argv = java_argv(
            *TOOL_HEAP, "org.apache.kafka.tools.ProducerPerformance",
            "--bootstrap-server", self.cluster.bootstrap, "--topic", TOPIC,
            "--num-records", str(1 << 40), "--record-size", str(size), "--throughput", "-1",
            "--reporting-interval", "1000", "--command-property", *acks,
        )  # fmt: skip
        # A client, so at the clients' priority (not the servers' nice), in a group of
        # its own that stop() ends.
        log_path = self.cluster.work / f"producer-perf-{size}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        tool = ServerProcess(f"producer-perf-{size}", proc, log_path)
        records = 0.0
        measured = 0.0
        started: float | None = None
        try:
            deadline = time.monotonic() + BOOT_S
            offset = 0
            while measured < seconds:
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = log_path.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"ProducerPerformance stopped reporting:\n{tail}")
                with log_path.open("rb") as log:
                    log.seek(offset)
                    lines = log.read().splitlines(True)
                for raw in lines:
                    if not raw.endswith(b"\n"):
                        break
                    offset += len(raw)
                    match = _REPORT.match(raw.decode(errors="replace"))
                    if match is None:
                        continue
                    now = time.monotonic()
                    started = now if started is None else started
                    if now - started >= warmup_s:
                        count, rate = int(match[1]), float(match[2])
                        records += count
                        measured += count / rate if rate else 0.0
                time.sleep(0.2)  # poll interval of a deadline-bound wait
        finally:
            tool.stop()
        return records / measured
