"""``make run``: a local cluster in the foreground — one nameserver and two brokers.

Each process is a real ``metaq-nameserver`` / ``metaq-broker`` on fixed ports with its data
under ``run-data/cluster/``, proving a random cluster secret kept in
``run-data/cluster/cluster-secret`` (made on first run, mode 600); their logs are
interleaved here with a name in front. It is started by the one launcher the tests use
(:class:`metaq.testing.cluster.ClusterBuilder`), so it comes up as theirs do: ready, each
group with its master. Ctrl-C (or SIGTERM) stops the brokers first, then the nameserver,
each with SIGTERM so they flush and leave cleanly; a process that does not stop within
the grace period is killed.

With ``--replicas N`` (``make run RUN_ARGS="--replicas 2"``) each of the two broker groups
is N brokers with sync replication (``min_in_sync_replicas`` 1): the nameserver's
controller elects a master per group, and a master killed (``kill -9``) is replaced by a
slave, for trying failover. Broker id ``i`` of a group listens on the group's ports plus
``20 * i``.
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

from metaq.testing.cluster import Cluster, ClusterBuilder, broker_node

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
REPLICA_PORT_STEP: Final = 20
"""Broker id i of a group listens on the group's data and HTTP ports plus 20 * i."""
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


def ports(replicas: int) -> dict[int, str]:
    """Every port the cluster binds (port: what listens on it)."""
    if replicas <= 1:
        return PORTS
    found = {NAMESERVER_PORT: "nameserver", NAMESERVER_HTTP_PORT: "nameserver HTTP"}
    for name, _, port in BROKERS:
        for broker_id in range(replicas):
            at = port + REPLICA_PORT_STEP * broker_id
            found[at] = f"{name}-{broker_id}"
            found[at + 1] = f"{name}-{broker_id} HTTP"
    return found


def builder(flush: str, secret: Path, replicas: int = 1) -> ClusterBuilder:
    """The cluster: one nameserver and ``replicas`` brokers a group, each on its fixed
    ports (a replicated group's brokers with sync replication)."""
    proof = ("--cluster-secret-file", str(secret))
    return ClusterBuilder(
        groups=tuple(name for name, _, _ in BROKERS),
        replicas=replicas,
        replication_mode="sync" if replicas > 1 else None,
        min_in_sync=1 if replicas > 1 else None,
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
        group_args={name: ("--computer-room", room) for name, room, _ in BROKERS},
        node_args={
            broker_node(name, broker_id): (
                *("--data-port", str(port + REPLICA_PORT_STEP * broker_id)),
                *("--http-port", str(port + REPLICA_PORT_STEP * broker_id + 1)),
            )
            for name, _, port in BROKERS
            for broker_id in range(replicas)
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
    parser.add_argument(
        "--replicas", type=int, default=1, help="brokers per group, sync replication (2-3)"
    )
    args = parser.parse_args()
    if not 1 <= args.replicas <= 5:
        parser.error(f"--replicas {args.replicas}: give 1 (no replication) to 5")

    taken = taken_ports(ports(args.replicas))
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
        cluster: Cluster = builder(args.flush, secret, args.replicas).start(args.data_dir)
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
        if args.replicas > 1:
            listed = ", ".join(f"{w} {p}" for p, w in ports(args.replicas).items() if "-" in w)
            print(
                f"replicated: {listed}. `uv run metaq cluster list` names each group's "
                "master; kill -9 its pid (ps -ef | grep <data-port>) to see a slave promoted",
                flush=True,
            )
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
