"""metaq in the side-by-side benchmark: a nameserver and one broker (ASYNC flush), the
same with TLS on every listener, or a master/slave group under sync replication, driven
by metaq's own client with the load shapes of ``bench_e2e.py`` (:mod:`metaq_load`) and,
end to end, by ``bench_e2e_latency.py``'s measurement itself."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from bench_e2e_latency import measure as measure_e2e
from compare_harness import IN_FLIGHT, EndToEnd, Latencies, offer
from metaq_load import Budget, batched, one_at_a_time, pipelined, ready_producer, wait_routed

from metaq.client.admin import Admin, TopicSettings
from metaq.client.producer import Producer
from metaq.common.tls import TlsConfig
from metaq.common.users import ACCESS_KEY_ENV, SECRET_KEY_ENV, Credentials
from metaq.testing.cluster import Cluster, ClusterBuilder

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
        trace: bool = False,
    ):
        self.key = key
        self.trace = trace
        """The clients write message trace (``trace=True``)."""
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
        self.data_dir: Path | None = None
        """The (master) broker's data directory."""

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
        self._producer = await ready_producer(self.nameserver, TOPIC, tls=tls, trace=self.trace)

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
        return (await self.paced_latency(body, rate, seconds))[0]

    async def paced_latency(
        self, body: bytes, rate: float, seconds: float
    ) -> tuple[int, Latencies]:
        """:meth:`paced`, and the acknowledged sends' latency, each from the tick that
        made it due (a wait for room in the window counts)."""
        sends: list[asyncio.Task[None]] = []
        window = asyncio.Semaphore(IN_FLIGHT)
        latencies: list[float] = []
        clock = time.perf_counter

        async def one(due: float) -> None:
            try:
                await self.producer.send(TOPIC, body)
            finally:
                window.release()
            latencies.append(clock() - due)

        async def send(count: int) -> None:
            due = clock()
            for _ in range(count):
                await window.acquire()
                sends.append(asyncio.create_task(one(due)))

        await offer(rate, seconds, send)
        await asyncio.gather(*sends, return_exceptions=True)
        return len(latencies), Latencies.of(latencies)

    async def end_to_end(self, size: int, rate: float, seconds: float) -> EndToEnd:
        figures = await measure_e2e(
            self.nameserver, self.http_url, rate=rate, seconds=seconds, warmup_s=1.0,
            size=size, queues=QUEUES, tls=self.tls, credentials=self.admin, trace=self.trace,
        )  # fmt: skip
        return EndToEnd(
            offered_msgs_s=figures["sent_msgs_per_s"],
            sent=figures["messages"],
            delivered=figures["delivered"],
            latency=Latencies(figures["e2e_p50_ms"], figures["e2e_p99_ms"], figures["e2e_p999_ms"]),
        )


def system(*, store: Sequence[str] = STORE, **changes: Any) -> ClusterBuilder:
    """The cluster every metaq of this benchmark is: ASYNC flush, ``store``'s settings
    (flags), full-size files, a minute to start; ``changes`` to the builder on top."""
    return ClusterBuilder(
        broker_args=("--flush-mode", "async", *store),
        small_store=False,
        ready_timeout_s=60,
        **changes,
    )


PAIR: Final = system(groups=("bench-pair",), replicas=2, replication_mode="sync", min_in_sync=2)
"""A master and a slave under sync replication (both copies before the answer)."""


def _metaq(cluster: Cluster, key: str, label: str, durability: str, group: str) -> Metaq:
    """The benchmark's client of ``cluster``, whose ``group`` takes the writes."""
    master = cluster.master(group)
    metaq = Metaq(
        key, label, durability, cluster.nameserver_addresses[0], master.http_url,
        admin=cluster.admin, tls=cluster.tls,
    )  # fmt: skip
    metaq.broker_pid = master.proc.pid
    metaq.data_dir = master.data_dir
    return metaq


def _server_pids(cluster: Cluster) -> list[int]:
    return [*(ns.process.pid for ns in cluster.nameservers),
            *(b.proc.pid for b in cluster.brokers.values())]  # fmt: skip


@contextmanager
def single_broker(work: Path, store: Sequence[str] = STORE) -> Iterator[Metaq]:
    """One nameserver and one broker, ASYNC flush, with ``store``'s settings (flags);
    stopped however the block ends."""
    with system(store=store).start(work) as cluster:
        metaq = _metaq(cluster, "metaq", "metaq", f"1 copy; {ASYNC_FLUSH}", "broker-a")
        metaq.server_pids = _server_pids(cluster)
        yield metaq


@contextmanager
def traced_broker(work: Path) -> Iterator[Metaq]:
    """:func:`single_broker` with message trace on in the benchmark's producers and
    consumer: what tracing every message costs."""
    with system().start(work) as cluster:
        metaq = _metaq(
            cluster, "metaq_trace", "metaq, trace on",
            f"1 copy; {ASYNC_FLUSH}; every message traced", "broker-a",
        )  # fmt: skip
        metaq.trace = True
        metaq.server_pids = _server_pids(cluster)
        yield metaq


BENCH_USER: Final = Credentials("bench", "bench-user-secret-key-not-for-real-use")


@contextmanager
def single_broker_auth(work: Path) -> Iterator[Metaq]:
    """:func:`single_broker` with auth_enabled on both servers: every connection proves a
    user (AUTH) and every frame is signed. The clients find the user in the environment
    (METAQ_ACCESS_KEY / METAQ_SECRET_KEY), set here for the block's length."""
    saved = {k: os.environ.get(k) for k in (ACCESS_KEY_ENV, SECRET_KEY_ENV)}
    os.environ[ACCESS_KEY_ENV], os.environ[SECRET_KEY_ENV] = (
        BENCH_USER.access_key, BENCH_USER.secret_key,
    )  # fmt: skip
    try:
        with system(auth=True, admin=BENCH_USER).start(work) as cluster:
            metaq = _metaq(
                cluster, "metaq_auth", "metaq auth",
                f"1 copy; {ASYNC_FLUSH}; users and signed frames", "broker-a",
            )  # fmt: skip
            metaq.server_pids = _server_pids(cluster)
            yield metaq
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def tls_broker(work: Path) -> Iterator[Metaq]:
    """As :func:`single_broker`, with TLS on the data plane, HTTP and gRPC (the client
    verifies the servers; the servers do not ask for client certificates)."""
    with system(tls=True).start(work) as cluster:
        metaq = _metaq(
            cluster, "metaq_tls", "metaq, TLS",
            f"1 copy; {ASYNC_FLUSH}; TLS 1.2+ on every listener", "broker-a",
        )  # fmt: skip
        metaq.server_pids = _server_pids(cluster)
        yield metaq


@contextmanager
def replicated_pair(work: Path) -> Iterator[Metaq]:
    """A master and a slave under sync replication (both copies before the answer,
    ``min_in_sync_replicas = 2``), ASYNC flush on both, the controller on a nameserver."""
    with PAIR.start(work) as cluster:
        (group,) = PAIR.groups
        # The topic goes to the master; the slave copies it with the log.
        asyncio.run(cluster.create_topic(TOPIC, queues=QUEUES, timeout_s=60))
        cluster.wait_in_sync(group, [0, 1], 60)
        metaq = _metaq(
            cluster, "metaq_sync_replicated", "metaq, sync replication",
            f"2 copies: answered once the slave holds it too (sync replication); {ASYNC_FLUSH}",
            group,
        )  # fmt: skip
        metaq.server_pids = _server_pids(cluster)
        yield metaq
