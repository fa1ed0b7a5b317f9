"""Test support: real ``metaq-nameserver`` processes and deadline-bound waiting.

Tests (this repository's and anyone's built on metaq) start nameservers as processes on
free ports, wait for the readiness line, and stop them even when the test fails::

    server = start_nameserver(tmp_path, "--broker-expiry-s", "2")
    try:
        ...  # talk to server.grpc_address
    finally:
        server.stop()

:func:`start_controller_group` starts several whose controllers form one Raft group on
loopback ports; :mod:`metaq.testing.nameserver_fakes` stands in for brokers.

Waiting is always on a condition with a deadline (``metaq.testing.waiting``), never on a
fixed sleep.
"""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar

import grpc
from google.protobuf.message import Message

from metaq.common.auth import ClusterSecret, call_metadata, session_identity, session_metadata
from metaq.common.server_names import target_of
from metaq.common.tls import TlsConfig, grpc_channel
from metaq.common.v1 import control_pb2 as pb
from metaq.testing.waiting import cluster_secret_for_tests, deadline, secret_env

READY: Final = re.compile(
    r"^metaq-nameserver ready grpc=(\S+)(?: http=(\S+))?(?: raft=(\S+))?$", re.MULTILINE
)
POLL_S: Final = 0.01
FOLLOW_POLL_S: Final = 0.1
"""How often an echoed nameserver's output files are read for new lines."""
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


def nameserver_command() -> list[str]:
    """The installed console script next to this interpreter, else ``python -m``."""
    script = Path(sys.executable).with_name("metaq-nameserver")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "metaq.nameserver"]


@dataclass
class NameServerProcess:
    """A running ``metaq-nameserver``; its stdout and stderr go to files in ``work_dir``."""

    process: subprocess.Popen[bytes]
    work_dir: Path
    grpc_address: str = ""
    http_address: str = ""
    # The controller's Raft address, when it was started with peers.
    raft_address: str = ""
    args: tuple[str, ...] = field(default_factory=tuple)

    @property
    def grpc_port(self) -> int:
        return int(self.grpc_address.rpartition(":")[2])

    @property
    def stdout_path(self) -> Path:
        return self.work_dir / "stdout.txt"

    @property
    def stderr_path(self) -> Path:
        return self.work_dir / "stderr.txt"

    def output(self) -> str:
        """Everything the process wrote so far, for failure messages."""
        parts = []
        for path in (self.stdout_path, self.stderr_path):
            if path.exists():
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')}")
        return "\n".join(parts)

    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """kill -9 and reap."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM (after SIGCONT, in case it is paused), then kill -9 past the deadline."""
        if self.process.poll() is None:
            self.resume()
            self.process.terminate()
            try:
                return self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


def start_nameserver(
    work_dir: Path,
    *args: str,
    timeout_s: float = 20.0,
    env: dict[str, str] | None = None,
    command: list[str] | None = None,
    echo: Callable[[str], None] | None = None,
) -> NameServerProcess:
    """Start a nameserver (on a free gRPC port unless ``args`` name one) and wait until ready.

    ``command`` replaces :func:`nameserver_command` (say, to run it inside a network
    namespace with ``ip netns exec``); it must exec the nameserver, so signals reach it.
    It runs with the tests' cluster secret (``metaq.testing.waiting.secret_env``) unless
    ``env`` sets another. ``echo`` is given every line it writes to its output files, as
    it writes it; it then runs in a session of its own, out of reach of the terminal's
    Ctrl-C.

    Raises RuntimeError with the process output if it exits or is not ready in time (the
    deadline scaled by ``METAQ_TEST_DEADLINE_SCALE``); the process is stopped in that case.
    :func:`spawn_nameserver` and :func:`wait_nameserver_ready` are the same in two halves,
    for starting several at once.
    """
    server = spawn_nameserver(work_dir, *args, env=env, command=command, echo=echo)
    wait_nameserver_ready(server, timeout_s)
    return server


def spawn_nameserver(
    work_dir: Path,
    *args: str,
    env: dict[str, str] | None = None,
    command: list[str] | None = None,
    echo: Callable[[str], None] | None = None,
) -> NameServerProcess:
    """Start the nameserver's process (as :func:`start_nameserver` does) without waiting."""
    work_dir.mkdir(parents=True, exist_ok=True)
    argv = list(args)
    if "--grpc-port" not in argv:
        argv = ["--grpc-port", "0", *argv]
    with (
        (work_dir / "stdout.txt").open("wb") as stdout,
        (work_dir / "stderr.txt").open("wb") as stderr,
    ):
        process = subprocess.Popen(
            [*(command or nameserver_command()), *argv],
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            env=secret_env(env),
            start_new_session=echo is not None,
        )
    server = NameServerProcess(process=process, work_dir=work_dir, args=tuple(argv))
    if echo is not None:
        threading.Thread(
            target=_follow, args=(server, echo), name="nameserver-output", daemon=True
        ).start()
    return server


def wait_nameserver_ready(server: NameServerProcess, timeout_s: float = 20.0) -> None:
    """Until a nameserver :func:`spawn_nameserver` started prints its readiness line (its
    addresses are then set); RuntimeError and the process stopped as in
    :func:`start_nameserver`."""
    process = server.process
    timeout_s = deadline(timeout_s)
    give_up = time.monotonic() + timeout_s
    while True:
        found = READY.search(server.stdout_path.read_text(errors="replace"))
        if found:
            server.grpc_address = found.group(1)
            server.http_address = found.group(2) or ""
            server.raft_address = found.group(3) or ""
            return
        failure = ""
        if process.poll() is not None:
            failure = f"metaq-nameserver exited with {process.returncode} before it was ready"
        elif time.monotonic() > give_up:
            failure = f"metaq-nameserver was not ready within {timeout_s} s"
        if failure:
            with contextlib.suppress(Exception):
                server.stop()
            raise RuntimeError(f"{failure}\n{server.output()}")
        time.sleep(POLL_S)


def _follow(server: NameServerProcess, echo: Callable[[str], None]) -> None:
    """Give ``echo`` each line the nameserver writes to its output files, until it has
    exited and every line is read."""
    files = [path.open(errors="replace") for path in (server.stdout_path, server.stderr_path)]
    partial = ["" for _ in files]
    try:
        while True:
            exited = server.process.poll() is not None
            read = False
            for index, file in enumerate(files):
                chunk = file.read()
                if chunk:
                    read = True
                    *lines, partial[index] = (partial[index] + chunk).split("\n")
                    for line in lines:
                        echo(line)
            if exited and not read:
                return
            if not read:
                time.sleep(FOLLOW_POLL_S)  # a file has no readiness to wait on
    finally:
        for file in files:
            file.close()


class _SigningInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """Adds the proof of ``secret`` to every unary call to the nameserver at ``address``,
    as brokers and tools do."""

    def __init__(self, secret: ClusterSecret, address: str) -> None:
        self._secret = secret
        self._target = target_of(address)

    async def intercept_unary_unary(
        self,
        continuation: Callable[
            [grpc.aio.ClientCallDetails, _Request],
            Awaitable[grpc.aio.UnaryUnaryCall[_Request, _Response]],
        ],
        client_call_details: grpc.aio.ClientCallDetails,
        request: _Request,
    ) -> _Response | grpc.aio.UnaryUnaryCall[_Request, _Response]:
        details = client_call_details
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        assert isinstance(request, Message)
        body = request.SerializeToString(deterministic=True)
        proof = call_metadata(
            self._secret, method.rpartition("/")[2], self._target, body, time.time()
        )
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *proof)
        signed = grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )
        return await continuation(signed, request)


def signed_channel(
    address: str, secret: ClusterSecret | None = None, *, tls: TlsConfig | None = None
) -> grpc.aio.Channel:
    """A gRPC channel to a nameserver (over TLS with ``tls``) whose unary calls prove
    ``secret`` (by default the tests' one); a Session stream opened on it must pass its
    own metadata."""
    secret = secret or cluster_secret_for_tests()
    return grpc_channel(address, tls, interceptors=[_SigningInterceptor(secret, address)])


def session_proof(
    address: str, secret: ClusterSecret | None = None, *, broker: pb.BrokerState | None = None
) -> tuple[tuple[str, str | bytes], ...]:
    """The metadata a Session stream to the nameserver at ``address`` opens with, proving
    ``secret`` (the tests' one) for ``broker`` (its cluster, name, id and data address):
    the nameserver refuses heartbeats for any other broker on that stream. Without
    ``broker``, for one that is never sent."""
    if broker is None:
        broker = pb.BrokerState(
            cluster="none", broker_name="unnamed", broker_id=0, data_address="127.0.0.1:1"
        )
    identity = session_identity(
        broker.cluster, broker.broker_name, broker.broker_id, broker.data_address
    )
    secret = secret or cluster_secret_for_tests()
    return session_metadata(secret, target_of(address), identity, time.time())


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``host`` now (another process may take one later)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def controller_flags(addresses: Sequence[str]) -> list[list[str]]:
    """Each nameserver's flags to host one controller (Raft) group on ``addresses``."""
    peers = ",".join(addresses)
    return [["--controller-address", address, "--controller-peers", peers] for address in addresses]


def start_controller_group(
    work_dir: Path, count: int, *args: str, timeout_s: float = 20.0
) -> list[NameServerProcess]:
    """``count`` nameservers whose controllers are one Raft group on loopback ports.

    Each lives in ``work_dir/ns<i>``; ``args`` go to every one. If one fails to start, the
    others are stopped and the error raised.
    """
    addresses = [f"127.0.0.1:{port}" for port in free_ports(count)]
    started: list[NameServerProcess] = []
    try:
        # All at once, then the waits: their start-ups overlap.
        for index, flags in enumerate(controller_flags(addresses)):
            started.append(spawn_nameserver(work_dir / f"ns{index}", *flags, *args))
        for server in started:
            wait_nameserver_ready(server, timeout_s)
    except BaseException:
        for server in started:
            server.stop()
        raise
    return started
