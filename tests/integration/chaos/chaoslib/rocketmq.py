"""Apache RocketMQ 5 as a system under the chaos suite (``make chaos SYSTEM=rocketmq``):
the peer of ``make bench-compare`` in controller mode (``bench/peer_rocketmq.py``'s
``controller_group``: a nameserver with the controller in its JVM, three brokers of one
group, ``inSyncReplicas = 2``), a workload that writes the history metaq's scenarios
write, and the same checker.

Scenario 1 only so far, as metaq's and Kafka's: kill -9 the master, five times
(``kills``: ``make bench-failover-compare`` asks for more). One
topic of one queue on the group; the main producer is RocketMQ's Java client
(``paced_ids``: one synchronous send at a time at 40 msgs/s, each given 2 s, as metaq's
main producers' send timeout, and no retry within it) at its defaults otherwise, among
them a route refreshed from the nameserver every 30 s and after a failed send. Each
round waits for the controller to count all three replicas in sync, kills the master
with SIGKILL, waits for the controller's next master and 20 acknowledged sends, then
starts the killed broker again on its store. At the end a consumer reads the queue from
its start to the master's end offset, and the checker reports acknowledged messages that
were never read (lost) and how long the producer waited.
"""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from peer_rocketmq import (
    CONTROLLER_REPLICAS,
    RocketmqCluster,
    broker_at,
    client_argv,
    controller_group,
    kill_broker,
    restart_broker,
    run_client,
)
from peer_rocketmq import (
    GROUP as BROKER_GROUP,
)

from chaoslib.checker import Result, check
from chaoslib.history import HistoryWriter, read_history
from metaq.testing.waiting import hold, wait_until

SCENARIOS: Final = {1: "kill-master"}
TOPIC: Final = "chaos-a"
GROUP: Final = "a"
PRODUCER: Final = f"main-{GROUP}"
RATE_HZ: Final = 40.0
SEND_TIMEOUT_MS: Final = 2000
WAIT_S: Final = 180.0
"""How long an election, 20 acknowledged sends or a broker's start may take on a loaded
machine (each look at the controller is a JVM of its own) before the scenario fails."""


def _wait(what: str, done: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    wait_until(done, timeout_s, f"RocketMQ: {what}", poll_s=0.2)


def _controller(cluster: RocketmqCluster) -> str:
    return f"127.0.0.1:{cluster.servers[0].ports['controller']}"


def _master(cluster: RocketmqCluster) -> tuple[str | None, int]:
    """(the controller's master's broker name, replicas in sync), (None, 0) while unknown."""
    try:
        said = run_client(cluster, "master", _controller(cluster), BROKER_GROUP, timeout_s=60)
    except (RuntimeError, subprocess.TimeoutExpired):
        return None, 0
    master = said.get("master")
    return (broker_at(cluster, master) if master else None), int(said.get("in_sync", 0))


def _master_to_kill(cluster: RocketmqCluster) -> str:
    """The controller's master, asked until it names one: a look that fails (a JVM that
    times out on a loaded machine) is no answer, and must not end the run."""
    named: list[str] = []

    def look() -> bool:
        master, _ = _master(cluster)
        if master is not None:
            named.append(master)
        return master is not None

    _wait("the controller names the master to kill", look)
    return named[-1]


class MainProducer:
    """The Java client's paced sends in a JVM of its own; each EVENT it prints becomes
    an invoke, ok or info event of the history."""

    def __init__(self, cluster: RocketmqCluster, history: HistoryWriter) -> None:
        self.history = history
        self.acked_at: list[float] = []
        argv = client_argv(cluster, "paced_ids", TOPIC, PRODUCER, str(RATE_HZ),
                           str(SEND_TIMEOUT_MS))  # fmt: skip
        self._stderr = (cluster.work / "client" / "producer.log").open("wb")
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr
        )
        self._thread = threading.Thread(target=self._read, name="rocketmq-chaos-producer")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(b"stop\n")
        self._proc.stdin.close()
        try:
            self._proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._thread.join(WAIT_S)
        self._stderr.close()

    def acked_since(self, since: float) -> int:
        return sum(1 for t in self.acked_at if t >= since)

    def _read(self) -> None:
        assert self._proc.stdout is not None
        fields = {"topic": TOPIC, "group": GROUP, "producer": PRODUCER}
        for raw in self._proc.stdout:
            line = raw.decode(errors="replace")
            if not line.startswith("EVENT "):
                continue
            event: dict[str, Any] = json.loads(line.removeprefix("EVENT "))
            kind = event.pop("type")
            written = self.history.write(kind, **event, **fields)
            if kind == "ok":
                self.acked_at.append(written["t"])


def _read_everything(cluster: RocketmqCluster, history: HistoryWriter) -> None:
    """Every message of the topic from its start to its end now, as ``read`` events."""
    done = subprocess.run(client_argv(cluster, "read_all", TOPIC), capture_output=True,
                          timeout=WAIT_S + 60, check=False, stdin=subprocess.DEVNULL)  # fmt: skip
    behind: dict[str, int] = {"unknown": 1}
    result: dict[str, Any] = {}
    for raw in done.stdout.decode(errors="replace").splitlines():
        if raw.startswith("EVENT "):
            event = json.loads(raw.removeprefix("EVENT "))
            history.write("read", id=event["id"], topic=TOPIC, queue=event["queue"],
                          offset=event["offset"], consumer="chaos-main")  # fmt: skip
        elif raw.startswith("RESULT "):
            result = json.loads(raw.removeprefix("RESULT "))
            behind = result.get("behind", behind)
    # Why the read stopped short goes into the history: the checker's "did not catch up"
    # alone does not tell a slow consumer from a client that failed.
    why = result.get("error") or ("" if result else f"exit {done.returncode}, no result")
    history.write("drain", ok=not behind, behind=behind,
                  **({"error": str(why)[:2000]} if why else {}))  # fmt: skip


def kill_master(cluster: RocketmqCluster, history: HistoryWriter,
                rng: random.Random, kills: int = 5) -> None:  # fmt: skip
    producer = MainProducer(cluster, history)
    producer.start()
    try:
        _wait("40 sends acknowledged", lambda: producer.acked_since(0.0) >= 40)
        for _ in range(kills):
            _wait("all replicas in sync", lambda: _master(cluster)[1] == CONTROLLER_REPLICAS)
            hold(rng.uniform(1.0, 3.0))  # traffic with all in sync: the fault's timing
            old = _master_to_kill(cluster)
            kill_broker(cluster, old)
            killed = history.write("fault", phase="start", fault="kill", node=old,
                                   group=GROUP, failover=True)["t"]  # fmt: skip
            # Each wait's condition runs before the loop moves on: no stale capture.
            _wait("a new master", lambda: _master(cluster)[0] not in (None, old))  # noqa: B023
            history.write("elected", after_s=round(time.monotonic() - killed, 3))
            _wait("20 sends acknowledged", lambda: producer.acked_since(killed) >= 20)  # noqa: B023
            hold(rng.uniform(1.0, 4.0))  # the new master writes with one slave
            restart_broker(cluster, old)
            history.write("fault", phase="end", fault="kill", node=old, group=GROUP)
    finally:
        producer.stop()


def run_rocketmq_scenario(number: int, work_dir: Path, *, seed: int, kills: int = 5) -> Result:
    """Scenario ``number`` against RocketMQ in ``work_dir``, its history checked."""
    if number not in SCENARIOS:
        raise ValueError(
            f"scenario {number} has no RocketMQ version yet; SYSTEM=rocketmq runs "
            f"{', '.join(f'{n} ({name})' for n, name in SCENARIOS.items())}"
        )
    work_dir.mkdir(parents=True, exist_ok=True)
    history = HistoryWriter(work_dir / "history.jsonl")
    history.write("scenario", name=f"{number}-rocketmq-{SCENARIOS[number]}", number=number,
                  seed=seed, expect={},
                  summary=f"kill -9 the master, {kills} times (RocketMQ)")  # fmt: skip
    try:
        with controller_group(work_dir / "rocketmq", keep=True) as cluster:
            run_client(cluster, "topic", TOPIC, "1")
            kill_master(cluster, history, random.Random(seed), kills)
            _read_everything(cluster, history)
    except Exception as exc:
        history.write("check", name="scenario-completed", ok=False,
                      detail=f"{type(exc).__name__}: {exc}"[:2000])  # fmt: skip
    finally:
        history.close()
    return check(read_history(work_dir / "history.jsonl"))
