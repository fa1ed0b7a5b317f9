"""``make run``: a local cluster in the foreground — one nameserver and two brokers.

Each process is a real ``metaq-nameserver`` / ``metaq-broker`` on fixed ports with its data
under ``run-data/cluster/``, proving a random cluster secret kept in
``run-data/cluster/cluster-secret`` (made on first run, mode 600); their logs are
interleaved here with a name in front. Ctrl-C (or SIGTERM) stops the brokers first, then
the nameserver, each with SIGTERM so they flush and leave cleanly; a process that does
not stop within the grace period is killed.
"""

from __future__ import annotations

import argparse
import base64
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

NAMESERVER_PORT: Final = 9876
NAMESERVER_HTTP_PORT: Final = 9880
BROKERS: Final = (("broker-a", "room-1", 10911), ("broker-b", "room-2", 11011))
"""Name, computer room and data port; each broker's HTTP port is the next one."""
PORTS: Final = {
    NAMESERVER_PORT: "nameserver",
    NAMESERVER_HTTP_PORT: "nameserver HTTP",
    **{port: name for name, _, port in BROKERS},
    **{port + 1: f"{name} HTTP" for name, _, port in BROKERS},
}
GRACE_S: Final = 30.0
READY_TIMEOUT_S: Final = 60.0
BANNER: Final = """
local cluster up: nameserver 127.0.0.1:9876; brokers broker-a (data 10911, HTTP 10912)
and broker-b (data 11011, HTTP 11012). Web console: http://127.0.0.1:9880/console/
In another terminal:
  uv run metaq cluster list
  uv run metaq topic create demo
  uv run metaq send demo 'hello'
  uv run metaq consume demo --group demo-group --from first --count 1
  uv run python examples/quickstart.py
  uv run metaq cluster switchover --group broker-a --to 1 --cluster-secret-file {secret}
Ctrl-C stops it; data stays in {data_dir}
"""


@dataclass
class Node:
    name: str
    argv: list[str]
    process: subprocess.Popen[str] | None = None
    ready: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            # Own process group: a Ctrl-C in the terminal reaches only this launcher,
            # which then stops the nodes in order.
            start_new_session=True,
        )
        threading.Thread(target=self._relay, name=f"{self.name}-log", daemon=True).start()

    def _relay(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            if " ready " in line and line.startswith("metaq-"):
                self.ready.set()
            sys.stdout.write(f"[{self.name:<10}] {line}")
            sys.stdout.flush()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(GRACE_S)
            except subprocess.TimeoutExpired:
                print(f"[{self.name:<10}] did not stop within {GRACE_S:.0f} s; killing it")
                self.process.kill()
        return self.process.wait()


def _tool(name: str) -> str:
    """The console script beside this interpreter (the project's venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        sys.exit(f"{name} not found: run `make setup` first")
    return found


def _secret_file(data_root: Path) -> Path:
    """The cluster's secret, made on first run and kept (readable by this user only)."""
    path = data_root / "cluster-secret"
    if not path.exists():
        data_root.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(base64.b64encode(secrets.token_bytes(32)).decode() + "\n")
    return path


def _nodes(data_root: Path, flush: str, secret: Path) -> list[Node]:
    nameserver = f"127.0.0.1:{NAMESERVER_PORT}"
    nodes = [
        Node(
            "nameserver",
            [
                _tool("metaq-nameserver"),
                "--grpc-port",
                str(NAMESERVER_PORT),
                "--http-port",
                str(NAMESERVER_HTTP_PORT),
                "--cluster-secret-file",
                str(secret),
            ],
        )
    ]
    for name, room, data_port in BROKERS:
        flags = {
            "--broker-name": name,
            "--computer-room": room,
            "--data-dir": str(data_root / name),
            "--listen-host": "127.0.0.1",
            "--data-port": str(data_port),
            "--http-port": str(data_port + 1),
            "--nameserver": nameserver,
            "--flush-mode": flush,
            "--cluster-secret-file": str(secret),
            # 256 MiB segments keep the disk a playground reserves small.
            "--set": "store.commitlog_segment_bytes=268435456",
        }
        argv = [_tool("metaq-broker"), *(part for pair in flags.items() for part in pair)]
        nodes.append(Node(name, argv))
    return nodes


def taken_ports(ports: dict[int, str], host: str = "127.0.0.1") -> list[str]:
    """The ports of ``ports`` (port: what listens on it) that something on ``host``
    already holds, named: a node that cannot bind would only die with its own log line."""
    taken = []
    for port, what in ports.items():
        with socket.socket() as probe:
            # As the servers bind: a port left in TIME_WAIT by an earlier run is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError:
                taken.append(f"{host}:{port} ({what})")
    return taken


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", type=Path, default=Path("run-data/cluster"))
    parser.add_argument("--flush", choices=("async", "sync"), default="async")
    args = parser.parse_args()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    taken = taken_ports(PORTS)
    if taken:
        print(
            f"local cluster: port {', '.join(taken)} is in use; another `make run` may be up "
            "(use it: METAQ_NAMESERVERS=127.0.0.1:9876), or stop what holds the port",
            file=sys.stderr,
            flush=True,
        )
        return 1
    secret = _secret_file(args.data_dir)
    nodes = _nodes(args.data_dir, args.flush, secret)
    started: list[Node] = []
    code = 0
    try:
        for node in nodes:
            node.start()
            started.append(node)
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not node.ready.wait(0.1):
                if stop.is_set() or not node.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"{node.name} did not become ready")
        print(BANNER.format(data_dir=args.data_dir, secret=secret), flush=True)
        while not stop.is_set():
            dead = [n.name for n in started if not n.alive()]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited unexpectedly")
            stop.wait(0.5)
    except RuntimeError as exc:
        print(f"local cluster: {exc}", file=sys.stderr)
        code = 1
    finally:
        for node in reversed(started):
            status = node.stop()
            if status not in (0, None, -signal.SIGTERM) and code == 0:
                code = 1
            print(f"[{node.name:<10}] stopped (exit {status})", flush=True)
    return code


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
