"""The peers' servers for the side-by-side benchmark, started by hand on loopback with
their data under one directory, and stopped by process id however the benchmark ends.

Each server runs in a session of its own (``start_new_session``), so stopping it signals
its whole process group: SIGTERM, a grace period, then SIGKILL. Nothing here goes
through an init system, and nothing stays running or enabled afterwards. Each runs at
the CPU priority metaq's broker takes by default (``nice``, docs/broker.md), so that
the clients sharing the cores wait for every server alike.

- **NATS** — ``nats-server`` with JetStream on file storage (``store_dir``).
- **RabbitMQ** — ``rabbitmq-server`` in the foreground with the ``rabbitmq_stream``
  plugin, its node name, ports, Mnesia and log directories and ``HOME`` (the Erlang
  cookie) all pointed into the data directory, and a private ``epmd`` on a port of its
  own (the node would otherwise start a system-wide daemon that outlives it).
- **Redis** — ``redis-server`` with the append-only file, ``appendfsync everysec``.

Three-replica peers, compared with metaq's sync-replicated rows (all three servers on
this host, on loopback):

- **NATS, 3 servers** — three ``nats-server`` processes routed into one cluster, each
  with its own ``server_name``, ports and ``store_dir``; JetStream elects its meta leader
  among them.
- **RabbitMQ, 3 nodes** — three ``rabbitmq-server`` nodes, each with its own node name,
  ports, Mnesia and log directories, sharing one ``HOME`` (so one Erlang cookie) and one
  private ``epmd``. The first boots alone; the other two find it through
  ``classic_config`` peer discovery and join it, and the cluster is ready once
  ``rabbitmqctl await_online_nodes`` sees all three.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from metaq.broker.config import BrokerConfig

RABBITMQ_SERVER: Final = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
RABBITMQCTL: Final = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")
CLUSTER_SIZE: Final = 3
RABBITMQ_BOOT_S: Final = 120.0
STOP_GRACE_S: Final = 15.0
SERVER_NICE: Final = BrokerConfig().nice


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class ServerProcess:
    """One started server; its output goes to ``<name>.log`` in its directory."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    ports: dict[str, int] = field(default_factory=dict)

    @classmethod
    def spawn(
        cls, name: str, argv: Sequence[str], work: Path, env: Mapping[str, str] | None = None
    ) -> ServerProcess:
        work.mkdir(parents=True, exist_ok=True)
        log_path = work / f"{name}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                ["nice", "-n", str(SERVER_NICE), *argv],  # nice execs: same pid
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=work,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        return cls(name, proc, log_path)

    def wait_listening(self, port: int, timeout_s: float) -> None:
        """Until ``port`` accepts connections; the server's log in the error otherwise."""
        deadline = time.monotonic() + timeout_s
        while not _listening(port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = "exited" if self.proc.poll() is not None else f"not up in {timeout_s} s"
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{self.name} {why}; its log ends:\n{tail}")
            time.sleep(0.1)  # poll interval of a deadline-bound wait

    def stop(self) -> None:
        """SIGTERM to the process group, then SIGKILL after the grace period."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(STOP_GRACE_S)
        # Whatever of the group is left (helpers of a server that exited) goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


def start_nats(work: Path) -> ServerProcess:
    port = free_port()
    config = work / "nats.conf"
    work.mkdir(parents=True, exist_ok=True)
    config.write_text(
        f'listen: "127.0.0.1:{port}"\njetstream {{\n  store_dir: "{work / "jetstream"}"\n}}\n'
    )
    server = ServerProcess.spawn("nats-server", ["nats-server", "-c", str(config)], work)
    server.ports["client"] = port
    server.wait_listening(port, 30)
    return server


def start_redis(work: Path) -> ServerProcess:
    port = free_port()
    argv = [
        "redis-server",
        "--bind", "127.0.0.1", "--port", str(port), "--dir", str(work),
        "--appendonly", "yes", "--appendfsync", "everysec",
        "--save", "", "--daemonize", "no", "--protected-mode", "no",
    ]  # fmt: skip
    server = ServerProcess.spawn("redis-server", argv, work)
    server.ports["client"] = port
    server.wait_listening(port, 30)
    return server


def start_nats_cluster(work: Path, size: int = CLUSTER_SIZE) -> list[ServerProcess]:
    """``size`` JetStream servers routed into one cluster; stop them in any order."""
    work.mkdir(parents=True, exist_ok=True)
    clients = [free_port() for _ in range(size)]
    routes = [free_port() for _ in range(size)]
    servers: list[ServerProcess] = []
    try:
        for i in range(size):
            others = ", ".join(f'"nats-route://127.0.0.1:{routes[j]}"'
                               for j in range(size) if j != i)  # fmt: skip
            config = work / f"nats-{i}.conf"
            config.write_text(
                f'server_name: "bench-{i}"\nlisten: "127.0.0.1:{clients[i]}"\n'
                f'jetstream {{\n  store_dir: "{work / f"jetstream-{i}"}"\n}}\n'
                f'cluster {{\n  name: "bench"\n  listen: "127.0.0.1:{routes[i]}"\n'
                f"  routes: [{others}]\n}}\n"
            )
            argv = ["nats-server", "-c", str(config)]
            server = ServerProcess.spawn(f"nats-server-{i}", argv, work)
            server.ports["client"] = clients[i]
            servers.append(server)
        for server in servers:
            server.wait_listening(server.ports["client"], 30)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def _rabbitmq_env(work: Path, epmd_port: int) -> dict[str, str]:
    """What every node (and rabbitmqctl) of one data directory shares: ``HOME``, so the
    Erlang cookie, and the private epmd."""
    return {"HOME": str(work), "ERL_EPMD_PORT": str(epmd_port)}


def _start_epmd(work: Path) -> tuple[ServerProcess, int]:
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    epmd = ServerProcess.spawn("epmd", ["epmd", "-port", str(port), "-address", "127.0.0.1"], work)
    try:
        epmd.wait_listening(port, 10)
    except BaseException:
        epmd.stop()
        raise
    return epmd, port


def _spawn_rabbit(work: Path, epmd_port: int, name: str, extra_config: str = "") -> ServerProcess:
    """One node named ``name``@localhost, its files under ``work/name``."""
    amqp, stream, dist = (free_port() for _ in range(3))
    home = work / name
    home.mkdir(parents=True, exist_ok=True)
    (home / "rabbitmq.conf").write_text(
        f"listeners.tcp.1 = 127.0.0.1:{amqp}\nstream.listeners.tcp.1 = 127.0.0.1:{stream}\n"
        # Stream clients connect to a stream's leader at the address its node advertises
        # (the host name by default): loopback, like everything here.
        "stream.advertised_host = 127.0.0.1\n" + extra_config
    )
    (home / "enabled_plugins").write_text("[rabbitmq_stream].\n")
    env = {
        **_rabbitmq_env(work, epmd_port),
        "RABBITMQ_NODENAME": f"{name}@localhost",
        "RABBITMQ_NODE_PORT": str(amqp),
        "RABBITMQ_DIST_PORT": str(dist),
        "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"),
        "RABBITMQ_MNESIA_BASE": str(home / "mnesia"),
        "RABBITMQ_LOG_BASE": str(home / "log"),
        "RABBITMQ_LOGS": "-",
    }
    rabbit = ServerProcess.spawn(f"rabbitmq-server-{name}", [str(RABBITMQ_SERVER)], home, env)
    rabbit.ports.update(amqp=amqp, stream=stream)
    return rabbit


def _wait_rabbit(rabbit: ServerProcess) -> None:
    # The stream listener is the last to open: the node and the plugin are up.
    rabbit.wait_listening(rabbit.ports["stream"], RABBITMQ_BOOT_S)


def start_rabbitmq(work: Path) -> tuple[ServerProcess, ServerProcess]:
    """(epmd, rabbitmq); stop them in the reverse order."""
    epmd, epmd_port = _start_epmd(work)
    try:
        rabbit = _spawn_rabbit(work, epmd_port, f"bench{free_port()}")
        try:
            _wait_rabbit(rabbit)
        except BaseException:
            rabbit.stop()
            raise
    except BaseException:
        epmd.stop()
        raise
    return epmd, rabbit


def start_rabbitmq_cluster(work: Path, size: int = CLUSTER_SIZE) -> list[ServerProcess]:
    """epmd, then ``size`` nodes in one cluster; stop them in the reverse order."""
    epmd, epmd_port = _start_epmd(work)
    servers = [epmd]
    try:
        # One cookie for every node: the cluster's nodes must share it to talk at all.
        cookie = work / ".erlang.cookie"
        cookie.write_text(os.urandom(16).hex())
        cookie.chmod(0o400)
        names = [f"bench{free_port()}r{i}" for i in range(size)]
        first = _spawn_rabbit(work, epmd_port, names[0])
        servers.append(first)
        _wait_rabbit(first)
        # The others find the first (already up) and join it, at once rather than after
        # the random start-up delay meant for nodes of a fleet booting together.
        join = (
            "cluster_formation.peer_discovery_backend = classic_config\n"
            f"cluster_formation.classic_config.nodes.1 = {names[0]}@localhost\n"
            "cluster_formation.randomized_startup_delay_range.min = 0\n"
            "cluster_formation.randomized_startup_delay_range.max = 1\n"
        )
        others = [_spawn_rabbit(work, epmd_port, name, join) for name in names[1:]]
        servers.extend(others)
        for rabbit in others:
            _wait_rabbit(rabbit)
        _await_online(work, epmd_port, names[0], size)
    except BaseException:
        for server in reversed(servers):
            server.stop()
        raise
    return servers


def _await_online(work: Path, epmd_port: int, node: str, size: int) -> None:
    """Until ``node``'s cluster has ``size`` running nodes; rabbitmqctl's words otherwise."""
    argv = [str(RABBITMQCTL), "-n", f"{node}@localhost", "await_online_nodes", str(size),
            "--timeout", str(int(RABBITMQ_BOOT_S))]  # fmt: skip
    done = subprocess.run(
        argv, env={**os.environ, **_rabbitmq_env(work, epmd_port)}, capture_output=True,
        timeout=RABBITMQ_BOOT_S + 30, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        said = (done.stdout + done.stderr).decode(errors="replace")[-3000:]
        raise RuntimeError(f"the RabbitMQ nodes did not form a {size}-node cluster:\n{said}")


@contextlib.contextmanager
def running(servers: list[ServerProcess]) -> Iterator[list[ServerProcess]]:
    """Stops every server put in ``servers``, last started first, however the block ends."""
    try:
        yield servers
    finally:
        for server in reversed(servers):
            server.stop()
