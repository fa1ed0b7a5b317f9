"""Apache RocketMQ 5 as a peer: its nameserver, brokers, proxy and controller from the
released jars (``make peers-rocketmq`` resolves them with Maven into
``bench/peers/rocketmq/target/lib``), started by hand on loopback, each with its store and
logs under one directory, and stopped by process id (:class:`peer_servers.ServerProcess`).

``ROCKETMQ_HOME`` of every server points at a ``home`` folder the benchmark writes; each
server's configuration file is written there, and its ``user.home`` (where RocketMQ puts
its logs, the nameserver its key-value file) is its own directory. The JVM heaps, sized for
a 2-core, 24 GiB machine shared by several servers (RocketMQ's own scripts ask for 4 GiB
for a nameserver and 8 GiB for a broker):

- nameserver (and the nameserver-embedded controller): 256 MiB;
- broker (with the gRPC proxy in local mode where one is asked for): 1 GiB, 1 GiB of
  direct memory.

Every broker keeps RocketMQ's defaults apart from loopback addresses and ports, its store
directory, and 256 MiB commitlog files (1 GiB by default; metaq's runs use 256 MiB
segments too). Three set-ups:

- :func:`single` — one nameserver and one broker, ``ASYNC_MASTER`` and ``ASYNC_FLUSH``
  (acknowledged once in the page cache), with the gRPC proxy in local mode in the
  broker's JVM for clients that speak gRPC (the Python client);
- :func:`sync_pair` — one nameserver, a ``SYNC_MASTER`` and its ``SLAVE`` (the "synchronous
  double write": acknowledged once the slave holds the message too), ``ASYNC_FLUSH`` on
  both;
- :func:`controller_group` — a nameserver with the controller embedded
  (``enableControllerInNamesrv``) and three brokers of one group in controller mode
  (``enableControllerMode``): the controller elects the master, which answers once
  ``inSyncReplicas = 2`` copies hold a message and refuses writes while fewer than
  ``minInSyncReplicas = 2`` are in sync; a dead master is replaced automatically.

:class:`RocketClient` is RocketMQ's own Java client (``rocketmq-client``, the remoting
protocol, asynchronous sends) in one JVM the benchmark keeps for a cluster's length,
driven over its stdin (``bench/peers/rocketmq/src/main/java/metaq/bench/RocketBench.java``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from compare_harness import IN_FLIGHT, EndToEnd, Latencies
from metaq_load import Budget
from peer_servers import ServerProcess, free_port

PEER_DIR: Final = Path(__file__).resolve().parent / "peers" / "rocketmq"
LIB: Final = PEER_DIR / "target" / "lib"
CLIENT_JAR: Final = PEER_DIR / "target" / "rocketmq-bench.jar"
CLUSTER: Final = "BenchCluster"
GROUP: Final = "bench-a"
NAMESRV_HEAP: Final = ("-Xms256m", "-Xmx256m")
BROKER_HEAP: Final = ("-Xms1g", "-Xmx1g", "-XX:MaxDirectMemorySize=1g")
CLIENT_HEAP: Final = ("-Xms512m", "-Xmx1g")
JVM: Final = ("-XX:+UseG1GC", "-XX:-OmitStackTraceInFastThrow")
QUICK_JVM: Final = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:-OmitStackTraceInFastThrow")
"""For the smoke test only, never for figures: the first JIT tier alone and the serial
collector start a RocketMQ JVM in about half the CPU on a busy machine."""
COMMITLOG_BYTES: Final = 256 * 1024 * 1024
BOOT_S: Final = 300.0
"""How long a JVM server may take to listen, or a group to elect and register its master,
on a loaded machine, where a restarted broker can take minutes."""
CLIENT_CALL_S: Final = 180.0


class RocketmqNotInstalled(RuntimeError):
    """RocketMQ's jars were not resolved, or no JVM runs here; says what to do."""


def missing() -> str | None:
    """Why the RocketMQ peer cannot run here, or None when it can."""
    if shutil.which("java") is None:
        return "no java on PATH (make ci-deps installs a JDK)"
    if not (LIB.is_dir() and CLIENT_JAR.is_file()):
        return f"RocketMQ's jars are not in {LIB.parent}: run `make peers-rocketmq` first"
    return None


def _classpath() -> str:
    return f"{CLIENT_JAR}:{LIB}/*"


def _java(
    jvm: Sequence[str], heap: Sequence[str], home: Path, logback: str, main: str, *args: str
) -> list[str]:
    """The command line of one RocketMQ server JVM (what bin/runserver.sh and
    bin/runbroker.sh build, with this benchmark's heaps)."""
    return [
        "java", *heap, *jvm, f"-Duser.home={home}",
        f"-Drmq.logback.configurationFile={logback}",
        "-cp", _classpath(), main, *args,
    ]  # fmt: skip


def _properties(path: Path, values: dict[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}\n"
                            for k, v in values.items()))  # fmt: skip
    return path


def _broker_ports() -> int:
    """A listen port whose neighbours are free too: a broker also listens on port - 2
    (its "fast" channel for internal traffic) and the master on port + 1 (replication)."""
    for _ in range(200):
        port = free_port()
        if port < 1026:
            continue
        with contextlib.ExitStack() as held:
            try:
                for p in (port - 2, port - 1, port + 1):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", p))
            except OSError:
                continue
            return port
    raise RuntimeError("no free block of four loopback ports for a RocketMQ broker")


@dataclass
class RocketmqCluster:
    """Running RocketMQ servers: the nameserver's address, each server's process (for
    its /proc entry), and the gRPC proxy's endpoint where one runs."""

    work: Path
    namesrv: str
    jvm: Sequence[str] = JVM
    servers: list[ServerProcess] = field(default_factory=list)
    brokers: dict[str, ServerProcess] = field(default_factory=dict)
    """Each broker by its name in this cluster (``master``, ``slave``, ``n0``...)."""
    argv: dict[str, list[str]] = field(default_factory=dict)
    """Each broker's command line, to start it again on its store (:func:`restart_broker`)."""
    grpc_endpoint: str | None = None

    def pids(self) -> list[int]:
        """Every server JVM still running: what the CPU figures add up."""
        return [s.proc.pid for s in self.servers if s.proc.poll() is None]

    def stop(self) -> None:
        """SIGKILL to every server's process group: their stores are thrown away after,
        so there is nothing for RocketMQ's shutdown hooks (seconds each) to save."""
        for server in reversed(self.servers):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.proc.pid, signal.SIGKILL)
        for server in self.servers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.proc.wait(30)


def _wait_said(server: ServerProcess, text: str, timeout_s: float) -> None:
    """Until ``text`` is in the server's output; its log in the error otherwise."""
    deadline = time.monotonic() + timeout_s
    while text not in server.log_path.read_text(errors="replace"):
        if server.proc.poll() is not None or time.monotonic() > deadline:
            why = (
                "exited"
                if server.proc.poll() is not None
                else f"did not say {text!r} in {timeout_s} s"
            )
            tail = server.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{server.name} {why}; its log ends:\n{tail}")
        time.sleep(0.1)  # poll interval of a deadline-bound wait


class _Layout:
    """Where one cluster's files go: ``home`` (``ROCKETMQ_HOME``, the configuration) and
    a directory per server (its store, its ``user.home`` and so its logs)."""

    def __init__(self, work: Path, jvm: Sequence[str]) -> None:
        self.work = work
        self.jvm = jvm
        self.home = work / "home"
        (self.home / "conf").mkdir(parents=True, exist_ok=True)
        self.env = {"ROCKETMQ_HOME": str(self.home)}

    def conf(self, name: str) -> Path:
        return self.home / "conf" / name

    def spawn(self, name: str, argv: list[str]) -> ServerProcess:
        return ServerProcess.spawn(name, argv, self.work / name, self.env)


def _start_namesrv(layout: _Layout, cluster: RocketmqCluster, controller_port: int = 0) -> int:
    """The nameserver (and, with ``controller_port``, the controller in its JVM)."""
    port = free_port()
    values: dict[str, object] = {"listenPort": port, "bindAddress": "127.0.0.1"}
    if controller_port:
        store = layout.work / "namesrv" / "controller"
        values.update(
            enableControllerInNamesrv=True,
            controllerType="DLedger",
            controllerDLegerGroup="bench",
            controllerDLegerPeers=f"n0-127.0.0.1:{controller_port}",
            controllerDLegerSelfId="n0",
            controllerStorePath=store,
            # No unclean election: only a replica in the sync set may become master.
            enableElectUncleanMaster=False,
        )
    conf = _properties(layout.conf("namesrv.properties"), values)
    argv = _java(layout.jvm, NAMESRV_HEAP, layout.work / "namesrv", "rmq.namesrv.logback.xml",
                 "org.apache.rocketmq.namesrv.NamesrvStartup", "-c", str(conf))  # fmt: skip
    server = layout.spawn("namesrv", argv)
    cluster.servers.append(server)
    server.ports["namesrv"] = port
    server.wait_listening(port, BOOT_S)
    if controller_port:
        server.ports["controller"] = controller_port
        server.wait_listening(controller_port, BOOT_S)
    return port


def _start_broker(
    layout: _Layout, cluster: RocketmqCluster, name: str, values: dict[str, object],
    *, proxy: bool = False,
) -> ServerProcess:  # fmt: skip
    """One broker JVM; with ``proxy``, RocketMQ's gRPC proxy in local mode around it
    (``mqbroker --enable-proxy``), listening on a port of its own."""
    port = _broker_ports()
    store = layout.work / name / "store"
    conf = _properties(
        layout.conf(f"{name}.properties"),
        {
            "brokerClusterName": CLUSTER,
            "brokerName": GROUP,
            "namesrvAddr": cluster.namesrv,
            "listenPort": port,
            "bindAddress": "127.0.0.1",
            "brokerIP1": "127.0.0.1",
            "brokerIP2": "127.0.0.1",
            "storePathRootDir": store,
            "storePathCommitLog": store / "commitlog",
            "mappedFileSizeCommitLog": COMMITLOG_BYTES,
            **values,
        },
    )
    home = layout.work / name
    if proxy:
        grpc, remoting = free_port(), free_port()
        proxy_conf = layout.conf(f"{name}-proxy.json")
        proxy_conf.write_text(json.dumps({
            "rocketMQClusterName": CLUSTER, "namesrvAddr": cluster.namesrv,
            "grpcServerPort": grpc, "remotingListenPort": remoting,
        }))  # fmt: skip
        argv = _java(layout.jvm, BROKER_HEAP, home, "rmq.proxy.logback.xml",
                     "org.apache.rocketmq.proxy.ProxyStartup",
                     "-pm", "local", "-bc", str(conf), "-pc", str(proxy_conf))  # fmt: skip
    else:
        argv = _java(layout.jvm, BROKER_HEAP, home, "rmq.broker.logback.xml",
                     "org.apache.rocketmq.broker.BrokerStartup", "-c", str(conf))  # fmt: skip
    server = layout.spawn(name, argv)
    cluster.servers.append(server)
    cluster.brokers[name] = server
    cluster.argv[name] = argv
    server.ports["broker"] = port
    # Said once started, after the broker's first registration with the nameserver.
    _wait_said(server, "startup successfully" if proxy else "boot success", BOOT_S)
    if proxy:
        server.ports["grpc"] = grpc
        cluster.grpc_endpoint = f"127.0.0.1:{grpc}"
    return server


@contextlib.contextmanager
def _cluster(
    work: Path, jvm: Sequence[str] = JVM, keep: bool = False
) -> Iterator[tuple[_Layout, RocketmqCluster]]:
    why = missing()
    if why is not None:
        raise RocketmqNotInstalled(why)
    work = work.resolve()  # each JVM runs in a directory of its own: absolute paths
    layout = _Layout(work, jvm)
    cluster = RocketmqCluster(work, "", jvm)
    try:
        yield layout, cluster
    finally:
        cluster.stop()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


ASYNC_FLUSH: Final = {"brokerRole": "ASYNC_MASTER", "flushDiskType": "ASYNC_FLUSH"}


@contextlib.contextmanager
def single(
    work: Path,
    *,
    proxy: bool = True,
    jvm: Sequence[str] = JVM,
    broker: Mapping[str, object] | None = None,
) -> Iterator[RocketmqCluster]:
    """A nameserver and one ``ASYNC_MASTER``/``ASYNC_FLUSH`` broker (with the gRPC proxy
    in its JVM unless ``proxy`` is False), registered with the nameserver; stopped and
    removed however the block ends. ``jvm``: the JVM options of every server and of
    :func:`run_client` (:data:`QUICK_JVM` for a smoke test); ``broker``: settings of the
    broker's properties file on top of these."""
    with _cluster(work, jvm) as (layout, cluster):
        cluster.namesrv = f"127.0.0.1:{_start_namesrv(layout, cluster)}"
        values = {"brokerId": 0, **ASYNC_FLUSH, **(broker or {})}
        _start_broker(layout, cluster, "broker", values, proxy=proxy)
        yield cluster


@contextlib.contextmanager
def sync_pair(work: Path) -> Iterator[RocketmqCluster]:
    """A nameserver, a ``SYNC_MASTER`` and its ``SLAVE`` (``ASYNC_FLUSH`` on both), both
    registered. The slave's replication connection may still be on its way: a topic is
    ready once the client's ``topic`` command got a send acknowledged."""
    with _cluster(work) as (layout, cluster):
        cluster.namesrv = f"127.0.0.1:{_start_namesrv(layout, cluster)}"
        flush = {"flushDiskType": "ASYNC_FLUSH"}
        _start_broker(
            layout, cluster, "master", {"brokerId": 0, "brokerRole": "SYNC_MASTER", **flush}
        )
        _start_broker(layout, cluster, "slave", {"brokerId": 1, "brokerRole": "SLAVE", **flush})
        wait_registered(cluster, 2)
        yield cluster


CONTROLLER_REPLICAS: Final = 3


@contextlib.contextmanager
def controller_group(work: Path, keep: bool = False) -> Iterator[RocketmqCluster]:
    """A nameserver with the controller in its JVM and three brokers of one group in
    controller mode, 2 of 3 copies before the answer; yields once a master is elected
    and registered with both slaves. Its files are removed after unless ``keep``."""
    with _cluster(work, keep=keep) as (layout, cluster):
        controller = free_port()
        cluster.namesrv = f"127.0.0.1:{_start_namesrv(layout, cluster, controller)}"
        for i in range(CONTROLLER_REPLICAS):
            _start_broker(
                layout, cluster, f"n{i}",
                {
                    "brokerId": -1, "brokerRole": "SLAVE", "flushDiskType": "ASYNC_FLUSH",
                    "enableControllerMode": True, "controllerAddr": f"127.0.0.1:{controller}",
                    "totalReplicas": CONTROLLER_REPLICAS, "inSyncReplicas": 2,
                    "minInSyncReplicas": 2, "allAckInSyncStateSet": False,
                },
            )  # fmt: skip
        wait_registered(cluster, CONTROLLER_REPLICAS)
        yield cluster


def kill_broker(cluster: RocketmqCluster, name: str) -> None:
    """``kill -9`` of broker ``name``, reaped."""
    server = cluster.brokers[name]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(30)


def restart_broker(cluster: RocketmqCluster, name: str) -> None:
    """Broker ``name`` started again on its store and ports, until it says it booted."""
    old = cluster.brokers[name]
    server = ServerProcess.spawn(old.name, cluster.argv[name], old.log_path.parent,
                                 {"ROCKETMQ_HOME": str(cluster.work / "home")})  # fmt: skip
    server.ports.update(old.ports)
    cluster.servers[cluster.servers.index(old)] = server
    cluster.brokers[name] = server
    _wait_said(server, "boot success", BOOT_S)


def broker_at(cluster: RocketmqCluster, address: str) -> str | None:
    """The name of the broker listening at ``address`` (host:port), None if none."""
    port = int(address.rpartition(":")[2])
    return next((name for name, b in cluster.brokers.items() if b.ports["broker"] == port), None)


def client_argv(cluster: RocketmqCluster, *command: str) -> list[str]:
    """The Java client's command line: one ``command`` and exit, or with none, commands
    read from stdin."""
    home = cluster.work / "client"
    home.mkdir(parents=True, exist_ok=True)
    return ["java", *CLIENT_HEAP, *cluster.jvm, f"-Duser.home={home}", "-cp", _classpath(),
            "metaq.bench.RocketBench", cluster.namesrv, *command]  # fmt: skip


def run_client(cluster: RocketmqCluster, *command: str, timeout_s: float = CLIENT_CALL_S) -> Any:
    """One command in a JVM of its own; its ``RESULT`` object (an error raises)."""
    done = subprocess.run(
        client_argv(cluster, *command), capture_output=True, timeout=timeout_s, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return _result(done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"),
                   command)  # fmt: skip


def _result(stdout: str, stderr: str, command: Sequence[str]) -> Any:
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line.removeprefix("RESULT "))
            if "error" in result:
                raise RuntimeError(f"RocketMQ client {' '.join(command)}: {result['error']}\n"
                                   f"{stderr[-3000:]}")  # fmt: skip
            return result
    raise RuntimeError(f"RocketMQ client {' '.join(command)} gave no result:\n{stderr[-3000:]}")


def wait_registered(cluster: RocketmqCluster, brokers: int) -> None:
    """Until the nameserver lists ``brokers`` brokers of the group, one of them master."""
    run_client(cluster, "wait", str(brokers), str(int(BOOT_S)), timeout_s=BOOT_S + 60)


class RocketClient:
    """The Java client in one JVM kept for a cluster's length, a command at a time."""

    def __init__(self, cluster: RocketmqCluster) -> None:
        self.cluster = cluster
        self._proc: asyncio.subprocess.Process | None = None
        self._log = cluster.work / "client" / "stderr.log"

    async def start(self) -> None:
        argv = client_argv(self.cluster)
        self._log.parent.mkdir(parents=True, exist_ok=True)
        with self._log.open("wb") as log:
            self._proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=log, limit=1 << 26,
            )  # fmt: skip

    async def call(self, *command: object, timeout_s: float = CLIENT_CALL_S) -> Any:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        words = [str(w) for w in command]
        proc.stdin.write((" ".join(words) + "\n").encode())
        await proc.stdin.drain()
        async with asyncio.timeout(timeout_s):
            while True:
                line = (await proc.stdout.readline()).decode(errors="replace")
                if not line:
                    said = self._log.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"the RocketMQ client exited during {words[0]}:\n{said}")
                if line.startswith("RESULT "):
                    return _result(line, self._log.read_text(errors="replace"), words)

    async def close(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            assert proc.stdin is not None
            proc.stdin.write(b"quit\n")
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


class RocketmqJava:
    """RocketMQ's Java client against a running cluster: its fastest way to publish
    (asynchronous sends, at most :data:`~compare_harness.IN_FLIGHT` unanswered)."""

    in_flight_how = f"Java client, async send, ≤ {IN_FLIGHT:,} unanswered"

    def __init__(self, key: str, label: str, durability: str, cluster: RocketmqCluster) -> None:
        self.key = key
        self.label = label
        self.durability = durability
        self.cluster = cluster
        self._client = RocketClient(cluster)
        self._topics = (f"Bench{n}" for n in itertools.count())
        self._topic = ""
        self.in_flight_latency = Latencies.none()
        """Send latency of the last ``in_flight`` cell (ms)."""
        self.server_pids = cluster.pids()
        """Every server JVM, for the cost cell's CPU reading."""

    async def _new_topic(self) -> str:
        topic = next(self._topics)
        await self._client.call("topic", topic, QUEUES)
        return topic

    async def open(self) -> None:
        await self._client.start()
        self._topic = await self._new_topic()

    async def close(self) -> None:
        await self._client.close()

    async def one_at_a_time(self, body: bytes, budget: Budget) -> list[float]:
        figures = await self._client.call(
            "one", self._topic, len(body), budget.seconds, budget.max_messages, "latencies"
        )
        _account(budget, figures)
        return [us / 1e6 for us in figures["latencies_us"]]

    async def in_flight(self, body: bytes, budget: Budget) -> None:
        figures = await self._client.call(
            "many", self._topic, len(body), budget.seconds, budget.max_messages, IN_FLIGHT
        )
        _account(budget, figures)
        self.in_flight_latency = _latencies(figures)

    async def paced(self, body: bytes, rate: float, seconds: float) -> int:
        """``rate`` msgs/s offered for ``seconds`` on the 1 ms grid, asynchronous sends of
        one message each, at most :data:`~compare_harness.IN_FLIGHT` unanswered (the
        schedule waits while the broker is behind, as metaq's does); how many were
        acknowledged."""
        return (await self.paced_latency(body, rate, seconds))[0]

    async def paced_latency(
        self, body: bytes, rate: float, seconds: float
    ) -> tuple[int, Latencies]:
        """:meth:`paced`, and the acknowledged sends' latency from each send's tick to its
        answer (the client's own timing, in its JVM)."""
        figures = await self._client.call("rate", self._topic, len(body), seconds, rate, IN_FLIGHT)
        return int(figures["acked"]), _latencies(figures)

    async def end_to_end(self, size: int, rate: float, seconds: float) -> EndToEnd:
        topic = await self._new_topic()  # a fresh topic and group: nothing to skip first
        figures = await self._client.call("e2e", topic, size, seconds, rate, E2E_WARMUP_S)
        return EndToEnd(
            figures["offered_msgs_s"], figures["sent"], figures["delivered"], _latencies(figures)
        )


QUEUES: Final = 8
"""Queues of every benchmark topic, on each master: as many as metaq's."""
E2E_WARMUP_S: Final = 1.0


def _account(budget: Budget, figures: dict[str, Any]) -> None:
    """The cell's count and rate as the Java client measured them: the JVM's command
    round trip over a pipe is not the system's time."""
    budget.sent = figures["acked"]
    budget.began = time.perf_counter() - figures["seconds"]


def _latencies(figures: dict[str, Any]) -> Latencies:
    def ms(key: str) -> float:
        value = figures.get(key)
        return math.nan if value is None else float(value)

    return Latencies(ms("p50_ms"), ms("p99_ms"), ms("p999_ms"))


ASYNC_DURABILITY: Final = (
    "1 copy; ASYNC_MASTER, ASYNC_FLUSH: acknowledged once in the page cache, flushed every 500 ms"
)
SYNC_MASTER_DURABILITY: Final = (
    "2 copies: SYNC_MASTER answers once its SLAVE holds it too; ASYNC_FLUSH on both"
)
