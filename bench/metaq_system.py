"""metaq in the side-by-side benchmark: a nameserver and one broker (ASYNC flush), the
same with TLS on every listener, or a master/slave group under sync replication, driven
by metaq's own client with the load shapes of ``bench_e2e.py`` (:mod:`metaq_load`) and,
end to end, by ``bench_e2e_latency.py``'s measurement itself."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from bench_e2e_latency import measure as measure_e2e
from compare_harness import IN_FLIGHT, EndToEnd, Latencies, offer
from metaq_load import Budget, batched, one_at_a_time, pipelined, ready_producer, wait_routed

from metaq.client.admin import Admin, TopicSettings
from metaq.client.producer import Producer
from metaq.common import acl
from metaq.common.acl import Acl, Grant, User
from metaq.common.tls import TlsConfig
from metaq.common.users import ACCESS_KEY_ENV, SECRET_KEY_ENV, Credentials, Verifier
from metaq.testing import BrokerProcess
from metaq.testing.nameserver_process import NameServerProcess, start_nameserver
from metaq.testing.waiting import wait_until

TOPIC: Final = "BenchCompare"
QUEUES: Final = 8
BATCH_CALLERS: Final = 4
# 256 MiB segments, and the newest 256 MiB of the log kept in the page cache: the pages
# behind it go back to the kernel and serve the next appends (docs/benchmarks.md).
STORE: Final = (
    *("--set", "store.commitlog_segment_bytes=268435456"),
    *("--set", "store.commitlog_cache_bytes=268435456"),
)
ASYNC_FLUSH: Final = "ASYNC flush: the page cache before the ack, fdatasync every 500 ms"


class Metaq:
    """metaq's client against a running nameserver and master broker."""

    in_flight_how = f"{BATCH_CALLERS} callers × send_batch of {IN_FLIGHT // BATCH_CALLERS}"

    def __init__(
        self,
        key: str,
        label: str,
        durability: str,
        nameserver: str,
        http_url: str,
        *,
        admin: Credentials | None = None,
        tls: TlsConfig | None = None,
    ):
        self.key = key
        self.admin = admin
        """Who creates the topic on a broker with auth_enabled."""
        self.label = label
        self.durability = durability
        self.nameserver = nameserver
        self.http_url = http_url
        self.tls = tls
        self._producer: Producer | None = None
        self.broker_pid: int | None = None
        """The (master) broker's process id, for what reads its /proc entry or profiles it."""
        self.server_pids: list[int] = []
        """Every server process (nameserver, brokers), for the cost cell's CPU reading."""

    @property
    def producer(self) -> Producer:
        assert self._producer is not None, "open() first"
        return self._producer

    async def open(self) -> None:
        tls = self.tls
        await Admin(credentials=self.admin, tls=tls).put_topic(
            self.http_url, TOPIC, TopicSettings(read_queues=QUEUES, write_queues=QUEUES)
        )
        await wait_routed(self.nameserver, TOPIC, QUEUES, tls=tls)
        self._producer = await ready_producer(self.nameserver, TOPIC, tls=tls)

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.close()

    async def one_at_a_time(self, body: bytes, budget: Budget) -> list[float]:
        return (await one_at_a_time(self.producer, TOPIC, body, budget))[1]

    async def in_flight(self, body: bytes, budget: Budget) -> None:
        await batched(self.producer, TOPIC, body, budget, BATCH_CALLERS, IN_FLIGHT // BATCH_CALLERS)

    async def pipelined(self, body: bytes, budget: Budget) -> list[float]:
        """The other way to have many sends in flight: concurrent ``send`` calls that the
        accumulator coalesces."""
        return (await pipelined(self.producer, TOPIC, body, budget, IN_FLIGHT))[1]

    async def paced(self, body: bytes, rate: float, seconds: float) -> int:
        """``rate`` msgs/s offered for ``seconds`` as pipelined ``send`` calls (the
        accumulator coalesces them), at most :data:`IN_FLIGHT` unacknowledged (a
        schedule the broker falls behind waits, as the peers' clients do); how many were
        acknowledged."""
        sends: list[asyncio.Task[object]] = []
        window = asyncio.Semaphore(IN_FLIGHT)

        async def send(count: int) -> None:
            for _ in range(count):
                await window.acquire()
                task = asyncio.create_task(self.producer.send(TOPIC, body))
                task.add_done_callback(lambda _: window.release())
                sends.append(task)

        await offer(rate, seconds, send)
        answers = await asyncio.gather(*sends, return_exceptions=True)
        return sum(1 for answer in answers if not isinstance(answer, BaseException))

    async def end_to_end(self, size: int, rate: float, seconds: float) -> EndToEnd:
        figures = await measure_e2e(
            self.nameserver, self.http_url, rate=rate, seconds=seconds, warmup_s=1.0,
            size=size, queues=QUEUES, tls=self.tls, credentials=self.admin,
        )  # fmt: skip
        return EndToEnd(
            offered_msgs_s=figures["sent_msgs_per_s"],
            sent=figures["messages"],
            delivered=figures["delivered"],
            latency=Latencies(figures["e2e_p50_ms"], figures["e2e_p99_ms"], figures["e2e_p999_ms"]),
        )


@contextmanager
def single_broker(work: Path, store: Sequence[str] = STORE) -> Iterator[Metaq]:
    """One nameserver and one broker, ASYNC flush, with ``store``'s settings (flags);
    stopped however the block ends."""
    nameserver = start_nameserver(work / "ns")
    try:
        with BrokerProcess.start(
            work / "broker",
            *("--nameserver", nameserver.grpc_address, "--flush-mode", "async", *store),
            small_store=False,
            ready_timeout_s=60,
        ) as broker:
            system = Metaq(
                "metaq", "metaq", f"1 copy; {ASYNC_FLUSH}",
                nameserver.grpc_address, broker.http_url,
            )  # fmt: skip
            system.broker_pid = broker.proc.pid
            system.server_pids = [nameserver.process.pid, broker.proc.pid]
            yield system
    finally:
        nameserver.stop()


BENCH_USER: Final = Credentials("bench", "bench-user-secret-key-not-for-real-use")


@contextmanager
def single_broker_auth(work: Path) -> Iterator[Metaq]:
    """:func:`single_broker` with auth_enabled on both servers: every connection proves a
    user (AUTH) and every frame is signed. The clients find the user in the environment
    (METAQ_ACCESS_KEY / METAQ_SECRET_KEY), set here for the block's length."""
    work.mkdir(parents=True, exist_ok=True)
    acl_file = work / "acl.json"
    user = User(BENCH_USER.access_key, Verifier.make(BENCH_USER.access_key, BENCH_USER.secret_key))
    acl.save(acl_file, Acl().with_user(user).grant(user.access_key, Grant("admin", "cluster")))
    saved = {k: os.environ.get(k) for k in (ACCESS_KEY_ENV, SECRET_KEY_ENV)}
    os.environ[ACCESS_KEY_ENV], os.environ[SECRET_KEY_ENV] = (
        BENCH_USER.access_key, BENCH_USER.secret_key,
    )  # fmt: skip
    nameserver = start_nameserver(
        work / "ns", "--auth-enabled", "true", "--auth-acl-file", str(acl_file)
    )
    try:
        with BrokerProcess.start(
            work / "broker",
            *("--nameserver", nameserver.grpc_address, "--flush-mode", "async", *STORE),
            *("--set", "auth_enabled=true", "--set", f"auth_acl_file={acl_file}"),
            small_store=False,
            ready_timeout_s=60,
        ) as broker:
            yield Metaq(
                "metaq_auth", "metaq auth", f"1 copy; {ASYNC_FLUSH}; users and signed frames",
                nameserver.grpc_address, broker.http_url, admin=BENCH_USER,
            )  # fmt: skip
    finally:
        nameserver.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_certificates(directory: Path) -> TlsConfig:
    """A CA and a certificate for 127.0.0.1 it signs (OpenSSL 3), as a server's settings."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, node = directory / "ca", directory / "node"
    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-noenc", "-days", "2")
    _openssl("req", "-x509", *key, "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
             "-subj", "/CN=bench CA", "-addext", "basicConstraints=critical,CA:TRUE")  # fmt: skip
    _openssl("req", "-x509", *key, "-keyout", f"{node}.key", "-out", f"{node}.crt",
             "-subj", "/CN=127.0.0.1", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-addext", "subjectAltName=IP:127.0.0.1")  # fmt: skip
    return TlsConfig(f"{node}.crt", f"{node}.key", f"{ca}.crt")


@contextmanager
def tls_broker(work: Path) -> Iterator[Metaq]:
    """As :func:`single_broker`, with TLS on the data plane, HTTP and gRPC (the client
    verifies the servers; the servers do not ask for client certificates)."""
    tls = make_certificates(work / "tls")
    flags = ("--tls-cert-file", tls.cert_file, "--tls-key-file", tls.key_file)
    client = TlsConfig(ca_file=tls.ca_file)
    nameserver = start_nameserver(work / "ns", *flags)
    try:
        with BrokerProcess.start(
            work / "broker",
            *("--nameserver", nameserver.grpc_address, "--flush-mode", "async", *STORE),
            *flags, "--tls-ca-file", tls.ca_file,
            small_store=False,
            ready_timeout_s=60,
            tls=client,
        ) as broker:  # fmt: skip
            yield Metaq(
                "metaq_tls", "metaq, TLS", f"1 copy; {ASYNC_FLUSH}; TLS 1.2+ on every listener",
                nameserver.grpc_address, broker.http_url, tls=client,
            )  # fmt: skip
    finally:
        nameserver.stop()


def _is_master(broker: BrokerProcess) -> bool:
    state = broker.health()
    return state is not None and state["role"] == "master"


def _both_in_sync(master: BrokerProcess) -> bool:
    state = master.health()
    return state is not None and len(state["in_sync_ids"]) == 2


@contextmanager
def replicated_pair(work: Path) -> Iterator[Metaq]:
    """A master and a slave under sync replication (both copies before the answer,
    ``min_in_sync_replicas = 2``), ASYNC flush on both, the controller on a nameserver."""
    nameserver: NameServerProcess = start_nameserver(work / "ns")
    brokers: list[BrokerProcess] = []
    try:
        args = [
            "--nameserver", nameserver.grpc_address, "--broker-name", "bench-pair",
            "--flush-mode", "async", *STORE,
            "--set", "replication_mode=sync", "--set", "min_in_sync_replicas=2",
        ]  # fmt: skip
        for broker_id in (0, 1):
            brokers.append(
                BrokerProcess.start(
                    work / f"broker-{broker_id}",
                    "--broker-id",
                    str(broker_id),
                    *args,
                    small_store=False,
                    ready_timeout_s=60,
                )
            )
        masters: list[BrokerProcess] = []

        def one_master() -> bool:
            masters[:] = [b for b in brokers if _is_master(b)]
            return len(masters) == 1

        wait_until(one_master, 60, "the pair has one master")
        master = masters[0]
        # The topic goes to the master; the slave copies it with the log.
        asyncio.run(
            Admin().put_topic(
                master.http_url, TOPIC, TopicSettings(read_queues=QUEUES, write_queues=QUEUES)
            )
        )
        wait_until(lambda: _both_in_sync(master), 60, "the slave is in sync")
        system = Metaq(
            "metaq_sync_replicated", "metaq, sync replication",
            f"2 copies: answered once the slave holds it too (sync replication); {ASYNC_FLUSH}",
            nameserver.grpc_address, master.http_url,
        )  # fmt: skip
        system.broker_pid = master.proc.pid
        system.server_pids = [nameserver.process.pid, *(b.proc.pid for b in brokers)]
        yield system
    finally:
        for broker in brokers:
            broker.kill()
        nameserver.stop()
