"""A real ``metaq-broker`` process for tests: ephemeral ports, readiness from its output,
teardown that always happens.

    with BrokerProcess.start(tmp_path / "broker") as broker:
        ... broker.data_port, broker.http_url ...

``start`` waits for the readiness line (``metaq-broker ready data=H:P http=H:P``) with a
deadline and fails with the process's output if it does not come. Leaving the ``with``
block kills a broker still running; :meth:`terminate` is the clean stop (SIGTERM).
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from metaq.common.tls import TlsConfig
from metaq.testing.waiting import deadline, secret_env, wait_until

_READY: Final = re.compile(r"metaq-broker ready data=(\S+):(\d+) http=(\S+):(\d+)")
# Small files everywhere: start-up stays fast and nothing preallocates a gigabyte.
SMALL_STORE: Final = (
    "store.commitlog_segment_bytes=4194304",
    "store.max_message_bytes=262144",
    "store.consume_queue_segment_entries=4096",
    "store.index_slots=1024",
    "store.index_entries=8192",
)


def broker_command() -> list[str]:
    """The installed ``metaq-broker`` script beside this interpreter, else ``-m``."""
    script = Path(sys.executable).with_name("metaq-broker")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "metaq.broker"]


class BrokerProcess:
    """A started broker; ``output`` holds everything it printed (stdout and stderr)."""

    def __init__(
        self,
        data_dir: Path,
        args: Sequence[str],
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        tls: TlsConfig | None = None,
        health_headers: Mapping[str, str] | None = None,
        echo: Callable[[str], None] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.tls = tls
        """How the tests reach a broker serving TLS (its HTTP port included)."""
        self.health_headers = dict(health_headers or {})
        """What :meth:`health` sends: the credentials of a broker with ``metrics_auth``."""
        self._http_tls: ssl.SSLContext | None = tls.client_context() if tls else None
        self.args = list(args)
        self.command = list(command) if command is not None else broker_command()
        self.lines: list[str] = []
        self._echo = echo
        self._cond = threading.Condition()
        self._eof = False
        self.proc = subprocess.Popen(
            [*self.command, "--data-dir", str(data_dir), *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=secret_env(env),
            # Echoed: a cluster run in the foreground, whose terminal's Ctrl-C is for the
            # launcher alone, which stops the processes in order.
            start_new_session=echo is not None,
        )
        self._reader = threading.Thread(target=self._read, name="broker-output", daemon=True)
        self._reader.start()
        self.data_host = self.http_host = ""
        self.data_port = self.http_port = 0

    @classmethod
    def start(
        cls,
        data_dir: Path,
        *args: str,
        small_store: bool = True,
        ready_timeout_s: float = 30.0,
        wait_for_master: bool | None = None,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        tls: TlsConfig | None = None,
        health_headers: Mapping[str, str] | None = None,
        echo: Callable[[str], None] | None = None,
    ) -> BrokerProcess:
        """Start a broker and wait for its readiness line.

        It runs with the tests' cluster secret (``metaq.testing.waiting.secret_env``)
        unless ``env`` sets another.

        ``command`` replaces :func:`broker_command` (say, to run it inside a network
        namespace with ``ip netns exec``); it must exec the broker so that signals sent to
        the process reach it. Flags in ``args`` win over the defaults set here.

        A broker with nameservers is controlled: it takes writes (and topic changes) only
        once the controller names it master. ``wait_for_master`` (by default: with
        nameservers and no ``--broker-id``, i.e. a deployed master) also waits for that.

        ``tls`` is how the tests themselves reach a broker started with ``--tls-*`` flags:
        its ``/health`` over HTTPS, with a client certificate if the broker wants one.
        ``health_headers`` go with every ``/health`` the tests ask (``Authorization`` for
        a broker started with ``metrics_auth``).

        ``echo`` is given every line the broker prints as it prints it; the broker then
        runs in a session of its own, out of reach of the terminal's Ctrl-C.

        :meth:`spawn` and :meth:`wait_started` are the same in two halves, for starting
        several brokers at once.
        """
        broker = cls.spawn(
            data_dir,
            *args,
            small_store=small_store,
            command=command,
            env=env,
            tls=tls,
            health_headers=health_headers,
            echo=echo,
        )
        broker.wait_started(ready_timeout_s, wait_for_master)
        return broker

    @classmethod
    def spawn(
        cls,
        data_dir: Path,
        *args: str,
        small_store: bool = True,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        tls: TlsConfig | None = None,
        health_headers: Mapping[str, str] | None = None,
        echo: Callable[[str], None] | None = None,
    ) -> BrokerProcess:
        """Start the broker's process (as :meth:`start` does) without waiting for it."""
        argv = ["--listen-host", "127.0.0.1", "--data-port", "0", "--http-port", "0"]
        if "--nameserver" not in args:
            # No nameserver to host a controller: the broker keeps its deployed role.
            argv += ["--set", "failover=false"]
        if small_store:
            for setting in SMALL_STORE:
                argv += ["--set", setting]
        return cls(data_dir, [*argv, *args], command, env, tls, health_headers, echo)

    def wait_started(self, ready_timeout_s: float, wait_for_master: bool | None = None) -> None:
        """Wait for the readiness line of a broker :meth:`spawn` started, and with
        ``wait_for_master`` (default as :meth:`start` says) until it is master; the
        broker is killed if either does not come."""
        if wait_for_master is None:
            wait_for_master = "--nameserver" in self.args and "--broker-id" not in self.args
        try:
            self.wait_ready(ready_timeout_s)
            if wait_for_master:
                self.wait_master(ready_timeout_s)
        except BaseException:
            self.kill()
            raise

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if self._echo is not None:
                self._echo(line)
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    @property
    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_for_line(self, pattern: str | re.Pattern[str], timeout_s: float) -> re.Match[str]:
        """The first output line matching ``pattern``; AssertionError at the deadline
        (``timeout_s`` through :func:`~metaq.testing.waiting.deadline`)."""
        regex = re.compile(pattern)
        timeout_s = deadline(timeout_s)
        give_up = time.monotonic() + timeout_s
        with self._cond:
            seen = 0
            while True:
                for line in self.lines[seen:]:
                    match = regex.search(line)
                    if match:
                        return match
                seen = len(self.lines)
                remaining = give_up - time.monotonic()
                if self._eof or remaining <= 0:
                    why = "the broker exited" if self._eof else f"{timeout_s} s passed"
                    raise AssertionError(
                        f"no line matching {regex.pattern!r} ({why}); output:\n"
                        + "\n".join(self.lines)
                    )
                self._cond.wait(remaining)

    def wait_ready(self, timeout_s: float) -> None:
        match = self.wait_for_line(_READY, timeout_s)
        self.data_host, self.data_port = match.group(1), int(match.group(2))
        self.http_host, self.http_port = match.group(3), int(match.group(4))

    def health(self, timeout_s: float = 5.0) -> dict[str, Any] | None:
        """The broker's ``/health`` (also when it answers 503, not writable); None while
        it cannot be reached or has exited."""
        if self.proc.poll() is not None:
            return None
        try:
            request = urllib.request.Request(f"{self.http_url}/health", headers=self.health_headers)
            with urllib.request.urlopen(
                request, timeout=timeout_s, context=self._http_tls
            ) as answer:
                body: dict[str, Any] = json.load(answer)
        except urllib.error.HTTPError as answered:
            body = json.load(answered)
        except (OSError, ValueError):
            return None
        return body

    def wait_master(self, timeout_s: float) -> None:
        """Until the broker says it is its group's master (``/health``)."""

        def is_master() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError("the broker exited; output:\n" + "\n".join(self.lines))
            health = self.health()
            return health is not None and health["role"] == "master"

        # Each look is an HTTP request the starting broker answers: every 20 ms, not every
        # 2 ms, leaves its CPU to the start-up being waited for.
        wait_until(is_master, timeout_s, "the broker is its group's master", poll_s=0.02)

    @property
    def http_url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.http_host}:{self.http_port}"

    @property
    def abort_marker(self) -> Path:
        return self.data_dir / "abort"

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout_s)

    def pause(self) -> None:
        """SIGSTOP: the process hangs with its connections open (a GC pause, a VM freeze)."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> int:
        """SIGKILL (as a crash would) and wait; the exit code."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        return self.wait(30.0)

    def wait(self, timeout_s: float) -> int:
        code = self.proc.wait(timeout_s)
        self._reader.join(timeout_s)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()
