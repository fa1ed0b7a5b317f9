"""Apache Kafka 4 as a system under the chaos suite (``make chaos SYSTEM=kafka``): the
peer of ``make bench-compare`` on three KRaft nodes (``bench/peer_kafka.py``), a
workload that writes the history metaq's scenarios write, and the same checker.

Scenario 1 only so far, as metaq's: kill -9 the leader, five times (``kills``:
``make bench-failover-compare`` asks for more). One topic of one
partition, three replicas, ``min.insync.replicas = 2`` (metaq's group ``a``: one
master, its copies); the main producer sends one message at a time at 40 msgs/s with
``acks=all`` and idempotence, each send given 2 s (``message.timeout.ms``, as metaq's
main producers' send timeout) before it counts as unknown (``info``). Each round waits
for all three replicas in sync, kills the partition's leader with SIGKILL, waits for
another leader and 20 acknowledged sends, then starts the killed node again. At the end
a consumer reads the partition from its start to its end, and the checker reports
acknowledged messages that were never read (lost) and how long the producer waited.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from peer_kafka import (
    CLUSTER_SIZE,
    KafkaCluster,
    create_topic,
    kafka_running,
    kill_node,
    restart_node,
)

from chaoslib.checker import Result, check
from chaoslib.history import HistoryWriter, read_history
from metaq.testing.waiting import Pace, hold, wait_until

SCENARIOS: Final = {1: "kill-leader"}
TOPIC: Final = "chaos-a"
GROUP: Final = "a"
PRODUCER: Final = f"main-{GROUP}"
RATE_HZ: Final = 40.0
SEND_TIMEOUT_S: Final = 2.0
WAIT_S: Final = 120.0
"""How long a leader election, 20 acknowledged sends or a node's start may take on a
loaded machine before the scenario fails."""


def _wait(what: str, done: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    wait_until(done, timeout_s, f"Kafka: {what}", poll_s=0.1)


class MainProducer:
    """One send at a time at :data:`RATE_HZ`, each recorded as invoke, then ok or info."""

    def __init__(self, cluster: KafkaCluster, history: HistoryWriter) -> None:
        self.history = history
        self.acked_at: list[float] = []
        self._answer: list[KafkaError | None] = []
        self._stop = threading.Event()
        self._producer = Producer({
            "bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 0, "message.timeout.ms": int(SEND_TIMEOUT_S * 1000),
            "log.connection.close": False,
        })  # fmt: skip
        self._thread = threading.Thread(target=self._run, name="kafka-chaos-producer")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)

    def acked_since(self, since: float) -> int:
        return sum(1 for t in self.acked_at if t >= since)

    def _delivered(self, error: KafkaError | None, _message: Message) -> None:
        self._answer.append(error)

    def _run(self) -> None:
        sent = 0
        pace = Pace(RATE_HZ)
        while not self._stop.is_set():
            message_id = f"{PRODUCER}-{sent}"
            sent += 1
            self.history.write("invoke", id=message_id, topic=TOPIC, group=GROUP,
                               producer=PRODUCER)  # fmt: skip
            answer = self._answer
            answer.clear()
            self._producer.produce(TOPIC, message_id.encode(), on_delivery=self._delivered)
            deadline = time.monotonic() + SEND_TIMEOUT_S + 5
            while not answer and time.monotonic() < deadline:
                self._producer.poll(0.1)
            fields = {"id": message_id, "topic": TOPIC, "group": GROUP, "producer": PRODUCER}
            if answer and answer[0] is None:
                self.acked_at.append(self.history.write("ok", **fields)["t"])
            else:
                error = answer[0].str() if answer and answer[0] is not None else "no answer"
                self.history.write("info", **fields, error=error)
            pace.wait()  # the load the scenario applies: a send at each slot, not a wait
        self._producer.flush(SEND_TIMEOUT_S + 5)


def _leader(admin: AdminClient) -> tuple[int, int]:
    """(leader node id, replicas in sync) of the partition, (-1, 0) while unknown."""
    try:
        topic = admin.list_topics(TOPIC, timeout=5).topics[TOPIC]
        partition = topic.partitions[0]
        return partition.leader, len(partition.isrs)
    except Exception:
        return -1, 0


def _leader_to_kill(admin: AdminClient) -> int:
    """The partition's leader, asked until it is known: a look that fails (a metadata
    request that times out on a loaded machine) says -1, which is no node to kill."""
    known: list[int] = []

    def look() -> bool:
        leader, _ = _leader(admin)
        if leader != -1:
            known.append(leader)
        return leader != -1

    _wait("the partition's leader to kill is known", look)
    return known[-1]


def _read_everything(cluster: KafkaCluster, history: HistoryWriter) -> None:
    """Every record of the partition from its start to its end now, as ``read`` events."""
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "chaos-main",
                         "enable.auto.commit": False, "log.connection.close": False})  # fmt: skip
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=30)
        consumer.assign([TopicPartition(TOPIC, 0, low)])
        position = low
        deadline = time.monotonic() + WAIT_S
        while position < high and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            offset = message.offset() or 0
            position = offset + 1
            history.write("read", id=(message.value() or b"").decode(), topic=TOPIC, queue=0,
                          offset=offset, consumer="chaos-main")  # fmt: skip
        behind = {} if position >= high else {f"{TOPIC}/0": high - position}
        history.write("drain", ok=not behind, behind=behind)
    finally:
        consumer.close()


def kill_leader(cluster: KafkaCluster, history: HistoryWriter,
                rng: random.Random, kills: int = 5) -> None:  # fmt: skip
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    producer = MainProducer(cluster, history)
    producer.start()
    try:
        _wait("40 sends acknowledged", lambda: producer.acked_since(0.0) >= 40)
        for _ in range(kills):
            _wait("all replicas in sync", lambda: _leader(admin)[1] == CLUSTER_SIZE)
            hold(rng.uniform(1.0, 3.0))  # traffic with all in sync: the fault's timing
            old = _leader_to_kill(admin)
            kill_node(cluster, old)
            killed = history.write("fault", phase="start", fault="kill", node=f"kafka-{old}",
                                   group=GROUP, failover=True)["t"]  # fmt: skip
            # Each wait's condition runs before the loop moves on: no stale capture.
            _wait("a new leader", lambda: _leader(admin)[0] not in (-1, old))  # noqa: B023
            history.write("elected", after_s=round(time.monotonic() - killed, 3))
            _wait("20 sends acknowledged", lambda: producer.acked_since(killed) >= 20)  # noqa: B023
            hold(rng.uniform(1.0, 4.0))  # the new leader writes with one follower
            restart_node(cluster, old)
            history.write("fault", phase="end", fault="kill", node=f"kafka-{old}", group=GROUP)
    finally:
        producer.stop()


def run_kafka_scenario(number: int, work_dir: Path, *, seed: int, kills: int = 5) -> Result:
    """Scenario ``number`` against Kafka in ``work_dir``, its history checked."""
    if number not in SCENARIOS:
        raise ValueError(
            f"scenario {number} has no Kafka version yet; SYSTEM=kafka runs "
            f"{', '.join(f'{n} ({name})' for n, name in SCENARIOS.items())}"
        )
    work_dir.mkdir(parents=True, exist_ok=True)
    history = HistoryWriter(work_dir / "history.jsonl")
    history.write("scenario", name=f"{number}-kafka-{SCENARIOS[number]}", number=number,
                  seed=seed, expect={},
                  summary=f"kill -9 the leader, {kills} times (Kafka)")  # fmt: skip
    try:
        with kafka_running(work_dir / "kafka", CLUSTER_SIZE, keep=True) as cluster:
            create_topic(cluster, TOPIC, 1)
            kill_leader(cluster, history, random.Random(seed), kills)
            _read_everything(cluster, history)
    except Exception as exc:
        history.write("check", name="scenario-completed", ok=False,
                      detail=f"{type(exc).__name__}: {exc}"[:2000])  # fmt: skip
    finally:
        history.close()
    return check(read_history(work_dir / "history.jsonl"))
