"""``make run``: a local cluster in the foreground — one nameserver and two brokers.

Each process is a real ``metaq-nameserver`` / ``metaq-broker`` on fixed ports with its data
under ``run-data/cluster/``, proving a random cluster secret kept in
``run-data/cluster/cluster-secret`` (made on first run, mode 600); their logs are
interleaved here with a name in front. It is started by the one launcher the tests use
(:class:`metaq.testing.cluster.ClusterBuilder`), so it comes up as theirs do: ready, each
group with its master. Ctrl-C (or SIGTERM) stops the brokers first, then the nameserver,
each with SIGTERM so they flush and leave cleanly; a process that does not stop within
the grace period is killed.
"""

from __future__ import annotations

import argparse
import base64
import os
import secrets
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Final, NoReturn

from metaq.testing.cluster import Cluster, ClusterBuilder

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


def echo(node: str, line: str) -> None:
    sys.stdout.write(f"[{node:<10}] {line}\n")
    sys.stdout.flush()


def _secret_file(data_root: Path) -> Path:
    """The cluster's secret, made on first run and kept (readable by this user only)."""
    path = data_root / "cluster-secret"
    if not path.exists():
        data_root.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(base64.b64encode(secrets.token_bytes(32)).decode() + "\n")
    return path


def builder(flush: str, secret: Path) -> ClusterBuilder:
    """The cluster: one nameserver and a broker a group, each on its fixed ports."""
    proof = ("--cluster-secret-file", str(secret))
    return ClusterBuilder(
        groups=tuple(name for name, _, _ in BROKERS),
        small_store=False,
        ready_timeout_s=READY_TIMEOUT_S,
        nameserver_args=(
            *("--grpc-port", str(NAMESERVER_PORT), "--http-port", str(NAMESERVER_HTTP_PORT)),
            *proof,
        ),
        # 256 MiB segments keep the disk a playground reserves small.
        broker_args=(
            *("--flush-mode", flush, "--set", "store.commitlog_segment_bytes=268435456"),
            *proof,
        ),
        group_args={
            name: ("--computer-room", room, "--data-port", str(port), "--http-port", str(port + 1))
            for name, room, port in BROKERS
        },
        echo=echo,
    )


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


def _interrupted(*_: object) -> NoReturn:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", type=Path, default=Path("run-data/cluster"))
    parser.add_argument("--flush", choices=("async", "sync"), default="async")
    args = parser.parse_args()

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
    # While it starts, a stop ends the start: the builder stops what it started.
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        cluster: Cluster = builder(args.flush, secret).start(args.data_dir)
    except KeyboardInterrupt:
        print("local cluster: stopped while starting", file=sys.stderr)
        return 1
    except (RuntimeError, AssertionError) as exc:
        print(f"local cluster: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    code = 0
    try:
        print(BANNER.format(data_dir=args.data_dir, secret=secret), flush=True)
        while not stop.is_set():
            dead = cluster.exited()
            if dead:
                print(f"local cluster: {', '.join(dead)} exited unexpectedly", file=sys.stderr)
                code = 1
                break
            stop.wait(0.5)
    finally:
        for node, status in cluster.terminate(GRACE_S).items():
            if status not in (0, -signal.SIGTERM) and code == 0:
                code = 1
            print(f"[{node:<10}] stopped (exit {status})", flush=True)
    return code


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
