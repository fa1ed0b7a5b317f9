"""The peers' servers for the side-by-side benchmark, started by hand on loopback with
their data under one directory, and stopped by process id however the benchmark ends.

Each server runs in a session of its own (``start_new_session``), so stopping it signals
its whole process group: SIGTERM, a grace period, then SIGKILL. Nothing here goes
through an init system, and nothing stays running or enabled afterwards.

- **NATS** — ``nats-server`` with JetStream on file storage (``store_dir``).
- **RabbitMQ** — ``rabbitmq-server`` in the foreground with the ``rabbitmq_stream``
  plugin, its node name, ports, Mnesia and log directories and ``HOME`` (the Erlang
  cookie) all pointed into the data directory, and a private ``epmd`` on a port of its
  own (the node would otherwise start a system-wide daemon that outlives it).
- **Redis** — ``redis-server`` with the append-only file, ``appendfsync everysec``.
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

RABBITMQ_SERVER: Final = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
STOP_GRACE_S: Final = 15.0


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
                list(argv),
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


def start_rabbitmq(work: Path) -> tuple[ServerProcess, ServerProcess]:
    """(epmd, rabbitmq); stop them in the reverse order."""
    work.mkdir(parents=True, exist_ok=True)
    epmd_port, amqp, stream, dist = (free_port() for _ in range(4))
    epmd = ServerProcess.spawn(
        "epmd", ["epmd", "-port", str(epmd_port), "-address", "127.0.0.1"], work
    )
    try:
        epmd.wait_listening(epmd_port, 10)
        (work / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{amqp}\nstream.listeners.tcp.1 = 127.0.0.1:{stream}\n"
        )
        (work / "enabled_plugins").write_text("[rabbitmq_stream].\n")
        env = {
            "HOME": str(work),
            "ERL_EPMD_PORT": str(epmd_port),
            "RABBITMQ_NODENAME": f"bench{amqp}@localhost",
            "RABBITMQ_NODE_PORT": str(amqp),
            "RABBITMQ_DIST_PORT": str(dist),
            "RABBITMQ_CONFIG_FILE": str(work / "rabbitmq"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(work / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(work / "mnesia"),
            "RABBITMQ_LOG_BASE": str(work / "log"),
            "RABBITMQ_LOGS": "-",
        }
        rabbit = ServerProcess.spawn("rabbitmq-server", [str(RABBITMQ_SERVER)], work, env)
        rabbit.ports.update(amqp=amqp, stream=stream)
        try:
            # The stream listener is the last to open: the node and the plugin are up.
            rabbit.wait_listening(stream, 120)
        except BaseException:
            rabbit.stop()
            raise
    except BaseException:
        epmd.stop()
        raise
    return epmd, rabbit


@contextlib.contextmanager
def running(servers: list[ServerProcess]) -> Iterator[list[ServerProcess]]:
    """Stops every server put in ``servers``, last started first, however the block ends."""
    try:
        yield servers
    finally:
        for server in reversed(servers):
            server.stop()
