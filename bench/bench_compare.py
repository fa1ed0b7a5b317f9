"""metaq side by side with NATS JetStream, RabbitMQ (stream and quorum queue), Redis
streams, Apache Kafka 4 (one broker, acks=1) and Apache RocketMQ 5 (one broker,
ASYNC_FLUSH), on this machine, in one run; and metaq's sync-replicated pair beside the
same peers replicating three ways (NATS JetStream on 3 servers, RabbitMQ on 3 nodes,
Kafka on 3 brokers with acks=all) and beside RocketMQ's SYNC_MASTER and SLAVE.

Every server runs on loopback with its data under one temporary directory, started here
and stopped here by process id however the run ends (``peer_servers.py``). Each system
gets the same workload, 128 B and 1 KiB bodies of random bytes, and three modes:

- **(a) one at a time** — send, wait for the acknowledgement, send the next;
- **(b) in flight** — up to 1,000 unacknowledged sends, batched or pipelined as the
  system's client does best (metaq: ``send_batch``; its pipelined ``send`` too, apart);
- **(c) end to end** — ``--rate`` msgs/s offered open-loop and consumed back in the same
  process, latency from scheduled send to the consumer's callback (p50/p99/p99.9);
- **cost** — for the systems that name their servers' processes (metaq's one broker and
  sync pair, Kafka through confluent-kafka, RocketMQ through its Java client),
  ``--cost-rate`` msgs/s of 1 KiB offered open-loop for ``--cost-seconds`` with no
  consumer: the servers' CPU seconds (``/proc/<pid>/stat``) per million acknowledged
  messages.
- **sweep** (only when named in ``--modes``) — for the systems that time their paced
  sends (metaq, confluent-kafka, RocketMQ's Java client), 1 KiB offered open loop at
  each of ``--sweep-rates`` msgs/s for ``--cost-seconds``: the acknowledged msgs/s and
  the send p50/p99/p99.9 from each send's tick to its answer; ``--chart PATH`` draws
  them (latency against throughput, one line per system).

Kafka runs with two Python clients (confluent-kafka, aiokafka) and, for its servers'
capacity, its own Java ``ProducerPerformance`` ((b) only); its rows need ``make
peers-kafka`` (the jars) and are skipped, saying so, without it. RocketMQ runs with its
own Python client (gRPC, through the proxy) and, for its servers' capacity, its Java
client (``bench/peers/rocketmq``: the remoting protocol, asynchronous sends), every mode;
its rows need ``make peers-rocketmq`` and are skipped the same way.

``--modes`` picks which of (a), (b), (c) and cost run (all by default; ``--modes
end_to_end`` compares end-to-end latency alone). Each cell is bounded in time
(``--seconds``, at most 15) and count; each (b) cell comes after ``WARMUP_S`` of the same
load, unmeasured. metaq runs five times:
one broker under ASYNC flush (its ratios are to the one-replica peers), the same with auth
on (users and signed frames: what auth costs), the same with TLS on every listener, the
same with message trace on in its clients (what tracing every message costs), and a
master/slave pair under sync replication (its ratios are to the three-replica peers, whose
acknowledgement also waits for a second copy: a majority of three). Each row states its
durability.

Writes ``compare.md``, ``compare.png`` and ``compare.json`` to ``--out``; the last line
printed is the JSON object (``ratio_vs_rabbitmq_stream_batched``,
``ratio_vs_nats_batched``, ``ratio_vs_nats_sync``, ``e2e_p99_vs_best_peer_ratio``,
``sync_vs_best_r3_batched_ratio``, ``sync_vs_best_r3_one_ratio``,
``sync_e2e_p99_vs_best_r3_ratio``, ``sync_e2e_p99_vs_best_replicated_ratio`` (RocketMQ's
SYNC_MASTER pair among the peers too), ``sync_vs_async_one_ratio``,
``ratio_vs_kafka_batched``, ``ratio_vs_kafka_acks_all_batched``,
``cpu_per_million_vs_kafka_ratio``, ``send_p50_vs_kafka_ratio``,
``ratio_vs_rocketmq_python_batched``, ``ratio_vs_rocketmq_batched``,
``ratio_vs_rocketmq_sync_master_batched``, ``cpu_per_million_vs_rocketmq_ratio``,
``cpu_per_million_async_vs_rocketmq_ratio``, the targets met, and every cell).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Final

import uvloop
from compare_harness import Latencies as Lat
from compare_harness import LoadTool, System, cpu_seconds
from compare_report import (
    HEADLINE_SIZE,
    METAQ_SYNC,
    PAIR_PEERS,
    R3_PEERS,
    REPLICATED_PEERS,
    TOOL_ROWS,
    Cell,
    SystemInfo,
    chart,
    e2e_p99_vs_best,
    kafka_ratios,
    markdown,
    ratio_to_plain,
    ratios,
    raw,
    rocketmq_ratios,
    strict_json,
    sweep_chart,
    sweep_markdown,
    sync_ratios,
    targets_met,
)
from machine_stalls import StallWatch
from metaq_load import Budget, settle_disk
from metaq_system import (
    Metaq,
    replicated_pair,
    single_broker,
    single_broker_auth,
    tls_broker,
    traced_broker,
)
from peer_kafka import (
    CLUSTER_SIZE as KAFKA_CLUSTER_SIZE,
)
from peer_kafka import (
    KafkaAio,
    KafkaConfluent,
    KafkaNotInstalled,
    KafkaProducerPerf,
    kafka_running,
)
from peer_nats import NatsJetStream, NatsJetStreamR3
from peer_rabbitmq import RabbitQuorum, RabbitQuorumR3, RabbitStream, RabbitStreamR3
from peer_redis import RedisStreams
from peer_rocketmq import (
    ASYNC_DURABILITY,
    SYNC_MASTER_DURABILITY,
    RocketmqJava,
    RocketmqNotInstalled,
)
from peer_rocketmq import single as rocketmq_single
from peer_rocketmq import sync_pair as rocketmq_sync_pair
from peer_servers import (
    ServerProcess,
    running,
    start_nats,
    start_nats_cluster,
    start_rabbitmq,
    start_rabbitmq_cluster,
    start_redis,
)

SIZES: Final = (128, 1024)
MAX_CELL_S: Final = 15.0
MAX_MESSAGES: Final = 5_000_000
WARMUP_S: Final = 2.0
"""Of (b) load, unmeasured, before each (b) cell, for every system."""
PEERS: Final = (
    "rabbitmq_stream", "nats", "rabbitmq_quorum", "redis", "kafka", "kafka_aiokafka",
    "rocketmq", "rocketmq_python",
)  # fmt: skip
COST_SIZE: Final = 1024
CELL_MODES: Final = ("end_to_end", "one_at_a_time", "in_flight", "cost", "sweep")
"""What ``--modes`` picks from: the (c), (a), (b), cost and sweep cells."""
DEFAULT_MODES: Final = CELL_MODES[:4]
"""The sweep runs when asked (``--modes sweep``)."""
SWEEP_RATES: Final = (1000.0, 3000.0, 10000.0, 30000.0)
WARM_UP_S: Final = 3.0

Launcher = Callable[[Path], AbstractContextManager[Sequence[System | LoadTool]]]


@contextmanager
def _metaq(work: Path) -> Iterator[list[System]]:
    with single_broker(work) as system:
        yield [system]


@contextmanager
def _metaq_auth(work: Path) -> Iterator[list[System]]:
    with single_broker_auth(work) as system:
        yield [system]


@contextmanager
def _metaq_tls(work: Path) -> Iterator[list[System]]:
    with tls_broker(work) as system:
        yield [system]


@contextmanager
def _metaq_trace(work: Path) -> Iterator[list[System]]:
    with traced_broker(work) as system:
        yield [system]


@contextmanager
def _metaq_replicated(work: Path) -> Iterator[list[System]]:
    with replicated_pair(work) as system:
        yield [system]


@contextmanager
def _nats(work: Path) -> Iterator[list[System]]:
    servers: list[ServerProcess] = []
    with running(servers):
        servers.append(start_nats(work))
        yield [NatsJetStream(servers[0].ports["client"])]


@contextmanager
def _rabbitmq(work: Path) -> Iterator[list[System]]:
    servers: list[ServerProcess] = []
    with running(servers):
        servers.extend(start_rabbitmq(work))
        rabbit = servers[-1]
        yield [RabbitStream(rabbit.ports["stream"]), RabbitQuorum(rabbit.ports["amqp"])]


@contextmanager
def _nats_r3(work: Path) -> Iterator[list[System]]:
    servers: list[ServerProcess] = []
    with running(servers):
        servers.extend(start_nats_cluster(work))
        yield [NatsJetStreamR3(servers[0].ports["client"])]


@contextmanager
def _rabbitmq_r3(work: Path) -> Iterator[list[System]]:
    servers: list[ServerProcess] = []
    with running(servers):
        servers.extend(start_rabbitmq_cluster(work))
        node = servers[1]  # the first node (servers[0] is epmd)
        yield [RabbitStreamR3(node.ports["stream"]), RabbitQuorumR3(node.ports["amqp"])]


@contextmanager
def _redis(work: Path) -> Iterator[list[System]]:
    servers: list[ServerProcess] = []
    with running(servers):
        servers.append(start_redis(work))
        yield [RedisStreams(servers[0].ports["client"])]


@contextmanager
def _kafka(work: Path) -> Iterator[list[System | LoadTool]]:
    with kafka_running(work) as cluster:
        yield [KafkaConfluent(cluster), KafkaAio(cluster), KafkaProducerPerf(cluster)]


@contextmanager
def _kafka_r3(work: Path) -> Iterator[list[System | LoadTool]]:
    with kafka_running(work, KAFKA_CLUSTER_SIZE) as cluster:
        yield [KafkaConfluent(cluster), KafkaAio(cluster), KafkaProducerPerf(cluster)]


@contextmanager
def _rocketmq(work: Path) -> Iterator[list[System]]:
    # Imported here: the Python client comes with the `bench` group only.
    from peer_rocketmq_grpc import RocketmqPython

    with rocketmq_single(work) as cluster:
        java = RocketmqJava("rocketmq", "RocketMQ 5, Java client", ASYNC_DURABILITY, cluster)
        yield [java, RocketmqPython(cluster)]


@contextmanager
def _rocketmq_sync_master(work: Path) -> Iterator[list[System]]:
    with rocketmq_sync_pair(work) as cluster:
        label = "RocketMQ 5 SYNC_MASTER + SLAVE, Java client"
        yield [RocketmqJava("rocketmq_sync_master", label, SYNC_MASTER_DURABILITY, cluster)]


# What starts each server (or servers), and the keys of the systems it yields.
LAUNCHERS: Final[dict[str, tuple[Launcher, tuple[str, ...]]]] = {
    "metaq": (_metaq, ("metaq",)),
    "metaq_auth": (_metaq_auth, ("metaq_auth",)),
    "metaq_sync_replicated": (_metaq_replicated, ("metaq_sync_replicated",)),
    "metaq_tls": (_metaq_tls, ("metaq_tls",)),
    "metaq_trace": (_metaq_trace, ("metaq_trace",)),
    "nats": (_nats, ("nats",)),
    "rabbitmq": (_rabbitmq, ("rabbitmq_stream", "rabbitmq_quorum")),
    "redis": (_redis, ("redis",)),
    "nats_r3": (_nats_r3, ("nats_r3",)),
    "rabbitmq_r3": (_rabbitmq_r3, ("rabbitmq_stream_r3", "rabbitmq_quorum_r3")),
    "kafka": (_kafka, ("kafka", "kafka_aiokafka", "kafka_perf")),
    "kafka_r3": (_kafka_r3, ("kafka_r3", "kafka_r3_aiokafka", "kafka_r3_perf")),
    "rocketmq": (_rocketmq, ("rocketmq", "rocketmq_python")),
    "rocketmq_sync_master": (_rocketmq_sync_master, ("rocketmq_sync_master",)),
}


async def sweep(system: Any, rates: Sequence[float], seconds: float) -> list[Cell]:
    """1 KiB sends offered open loop at each of ``rates`` for ``seconds``: the
    acknowledged msgs/s and the send latency from each send's tick to its answer."""
    cells: list[Cell] = []
    body = os.urandom(COST_SIZE)
    # An unmeasured pass at the lowest rate first: without it the first point measures
    # each peer's start-up (JIT, connections, first segment files) rather than its load.
    await system.paced_latency(body, min(rates), min(seconds, WARM_UP_S))
    for rate in rates:
        settle_disk()
        began = time.perf_counter()
        acked, latency = await system.paced_latency(body, rate, seconds)
        took = time.perf_counter() - began
        cells.append(Cell(system.key, "sweep", COST_SIZE, acked / took, latency,
                          sent=int(rate * seconds), delivered=acked, note=f"{rate:g}"))  # fmt: skip
        print(f"  {system.label}, sweep {rate:g} msgs/s: {acked / took:,.0f} acked, "
              f"p50 {latency.p50_ms:.1f} ms, p99 {latency.p99_ms:.1f} ms",
              file=sys.stderr, flush=True)  # fmt: skip
    return cells


async def cost(system: Any, rate: float, seconds: float) -> Cell:
    """The servers' CPU seconds per million acknowledged 1 KiB messages, ``rate`` msgs/s
    offered for ``seconds`` (``Cell.msgs_s``: the acknowledged rate)."""
    settle_disk()
    body = os.urandom(COST_SIZE)
    began, cpu = time.perf_counter(), cpu_seconds(system.server_pids)
    acked: int = await system.paced(body, rate, seconds)
    used, took = cpu_seconds(system.server_pids) - cpu, time.perf_counter() - began
    per_million = used / acked * 1e6 if acked else None
    return Cell(system.key, "cost", COST_SIZE, acked / took, cpu_per_million=per_million,
                sent=int(rate * seconds), delivered=acked)  # fmt: skip


def _throughput_only(system: LoadTool, seconds: float, modes: Sequence[str]) -> list[Cell]:
    """A load generator of its own ((b) only): its throughput at each size."""
    cells: list[Cell] = []
    if "in_flight" not in modes:
        return cells
    for size in SIZES:
        cells.append(
            Cell(system.key, "in_flight", size, system.throughput(size, WARMUP_S, seconds))
        )
        cells += [Cell(system.key, mode, size, None, note="—")
                  for mode in ("one_at_a_time", "end_to_end")]  # fmt: skip
        print(f"  {system.label}, {size} B: done", file=sys.stderr, flush=True)
    return cells


async def drive(
    system: System, seconds: float, e2e_seconds: float, rate: float, stalls: StallWatch,
    cost_rate: float = 0.0, cost_seconds: float = 0.0, modes: Sequence[str] = DEFAULT_MODES,
    sweep_rates: Sequence[float] = SWEEP_RATES,
) -> list[Cell]:  # fmt: skip
    """Every mode in ``modes`` and size of one system. The end-to-end cells go first,
    while the server is quiet, each after what earlier cells (of this system or the last
    one) left dirty is written back; the cost cell, where the system has one, last."""
    cells: list[Cell] = []
    await system.open()
    try:
        for size in SIZES if "end_to_end" in modes else ():
            settle_disk()
            began = time.monotonic()
            e2e = await system.end_to_end(size, rate, e2e_seconds)
            cells.append(
                Cell(system.key, "end_to_end", size, e2e.offered_msgs_s, e2e.latency,
                     delivered=e2e.delivered, sent=e2e.sent,
                     stalls=stalls.between(began, time.monotonic()))
            )  # fmt: skip
        for size in SIZES if {"one_at_a_time", "in_flight"} & set(modes) else ():
            body = os.urandom(size)  # incompressible, so no client or server shrinks it
            if "one_at_a_time" in modes:
                budget = Budget(seconds, MAX_MESSAGES)
                latencies = await system.one_at_a_time(body, budget)
                cells.append(
                    Cell(system.key, "one_at_a_time", size, budget.rate(), Lat.of(latencies))
                )
            if "in_flight" not in modes:
                continue
            # Not measured: throughput is a server's steady state, not its first
            # gigabyte, whose fresh page-cache pages this VM makes dear (docs/benchmarks.md).
            await system.in_flight(body, Budget(WARMUP_S, MAX_MESSAGES))
            budget = Budget(seconds, MAX_MESSAGES)
            await system.in_flight(body, budget)
            latency = getattr(system, "in_flight_latency", Lat.none())  # where a client times it
            cells.append(Cell(system.key, "in_flight", size, budget.rate(), latency))
            if isinstance(system, Metaq):
                budget = Budget(seconds, MAX_MESSAGES)
                latencies = await system.pipelined(body, budget)
                cells.append(Cell(system.key, "pipelined", size, budget.rate(), Lat.of(latencies)))
            print(f"  {system.label}, {size} B: done", file=sys.stderr, flush=True)
        if (
            "cost" in modes
            and cost_rate
            and hasattr(system, "paced")
            and getattr(system, "server_pids", None)
        ):
            cells.append(await cost(system, cost_rate, cost_seconds))
            print(f"  {system.label}, cost: done", file=sys.stderr, flush=True)
        if "sweep" in modes and hasattr(system, "paced_latency"):
            cells += await sweep(system, sweep_rates, cost_seconds)
    finally:
        await system.close()
    return cells


def _failed(system: str, note: str) -> list[Cell]:
    return [Cell(system, mode, size, None, note=note) for size in SIZES
            for mode in ("one_at_a_time", "in_flight", "end_to_end")]  # fmt: skip


def _drive_or_fail(
    system: System | LoadTool, args: argparse.Namespace, stalls: StallWatch
) -> list[Cell]:
    try:
        if isinstance(system, LoadTool):
            return _throughput_only(system, args.seconds, args.modes)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(
                drive(system, args.seconds, args.e2e_seconds, args.rate, stalls,
                      args.cost_rate, args.cost_seconds, args.modes, args.sweep_rates)
            )  # fmt: skip
    except Exception as exc:  # the cells say so; the other systems still run
        traceback.print_exc()
        return _failed(system.key, f"failed: {type(exc).__name__}")


def _info(system: System | LoadTool) -> SystemInfo:
    return SystemInfo(system.key, system.label, system.durability, system.in_flight_how)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per (a)/(b) cell")
    parser.add_argument("--e2e-seconds", type=float, default=12.0, help="measured seconds of (c)")
    parser.add_argument("--rate", type=float, default=5000.0, help="(c) offered msgs/s")
    parser.add_argument(
        "--cost-rate",
        type=float,
        default=20000.0,
        help="msgs/s offered in the cost cell (0: no cost cells)",
    )
    parser.add_argument("--cost-seconds", type=float, default=5.0, help="seconds of the cost cell")
    parser.add_argument("--only", default=",".join(LAUNCHERS), help="comma-separated launchers")
    parser.add_argument(
        "--modes",
        default=",".join(DEFAULT_MODES),
        help="comma-separated cells to run: end_to_end, one_at_a_time, in_flight, cost "
        "(the default), sweep",
    )
    parser.add_argument(
        "--sweep-rates",
        default=",".join(f"{r:g}" for r in SWEEP_RATES),
        help="msgs/s of 1 KiB the sweep offers each system, --cost-seconds each",
    )
    parser.add_argument(
        "--chart",
        type=Path,
        default=None,
        help="write the sweep's send latency against acknowledged msgs/s here (PNG)",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    if (not 0 < args.seconds <= MAX_CELL_S or not 0 < args.e2e_seconds + 1 <= MAX_CELL_S
            or not 0 < args.cost_seconds <= MAX_CELL_S):  # fmt: skip
        parser.error(f"every cell must take at most {MAX_CELL_S:.0f} s")
    args.modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    wrong = [mode for mode in args.modes if mode not in CELL_MODES]
    if wrong or not args.modes:
        parser.error(
            f"--modes: unknown {', '.join(wrong) or '(nothing named)'}; "
            f"name one or more of {', '.join(CELL_MODES)}, comma-separated"
        )
    try:
        args.sweep_rates = [float(r) for r in args.sweep_rates.split(",") if r.strip()]
    except ValueError:
        parser.error(f"--sweep-rates {args.sweep_rates!r}: msgs/s, comma-separated")
    if not args.sweep_rates or min(args.sweep_rates) <= 0:
        parser.error("--sweep-rates: one or more positive msgs/s, comma-separated")
    if args.chart is not None and "sweep" not in args.modes:
        parser.error("--chart draws the sweep: add sweep to --modes")
    names = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in names if name not in LAUNCHERS]
    if unknown or not names:
        parser.error(
            f"--only {args.only!r}: unknown {', '.join(unknown) or '(nothing named)'}; "
            f"name one or more of {', '.join(LAUNCHERS)}, comma-separated"
        )

    # A SIGTERM (a timeout, a CI cancel) unwinds like Ctrl-C, so every server is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    work = Path(tempfile.mkdtemp(prefix="metaq-bench-compare-"))
    cells: list[Cell] = []
    systems: list[SystemInfo] = []
    with StallWatch() as stalls:
        try:
            for name in names:
                print(f"{name}: starting", file=sys.stderr, flush=True)
                launcher, keys = LAUNCHERS[name]
                driven: set[str] = set()
                try:
                    with launcher(work / name) as launched:
                        for system in launched:
                            systems.append(_info(system))
                            driven.add(system.key)
                            cells += _drive_or_fail(system, args, stalls)
                except Exception as exc:  # one server failing leaves the others' figures
                    if isinstance(exc, KafkaNotInstalled | RocketmqNotInstalled):
                        print(f"{name}: skipped: {exc}", file=sys.stderr, flush=True)
                        target = (
                            "peers-kafka"
                            if isinstance(exc, KafkaNotInstalled)
                            else "peers-rocketmq"
                        )
                        why = f"skipped: make {target}"
                    else:
                        traceback.print_exc()
                        why = f"failed to start: {type(exc).__name__}"
                    for key in keys:
                        if key not in driven:
                            systems.append(SystemInfo(key, key, "—", "—"))
                            cells += _failed(key, why)
        finally:
            shutil.rmtree(work, ignore_errors=True)  # gigabytes of logs and segments

    peers = [p for p in PEERS if any(s.key == p for s in systems)]
    headline: dict[str, Any] = {
        k: v
        for k, v in ratios(cells, peers, HEADLINE_SIZE).items()
        if k in ("ratio_vs_rabbitmq_stream_batched", "ratio_vs_nats_batched",
                 "ratio_vs_nats_sync", "e2e_p99_vs_best_peer_ratio")
    }  # fmt: skip
    headline["ratio_auth_vs_plain_batched"] = ratio_to_plain(cells, "metaq_auth", HEADLINE_SIZE)
    headline["ratio_tls_vs_plain_batched"] = ratio_to_plain(cells, "metaq_tls", HEADLINE_SIZE)
    headline["ratio_trace_vs_plain_batched"] = ratio_to_plain(cells, "metaq_trace", HEADLINE_SIZE)
    r3_peers = [p for p in R3_PEERS if any(s.key == p for s in systems)]
    headline.update(
        {k: v for k, v in sync_ratios(cells, r3_peers, HEADLINE_SIZE).items()
         if k in ("sync_vs_best_r3_batched_ratio", "sync_vs_best_r3_one_ratio",
                  "sync_e2e_p99_vs_best_r3_ratio", "sync_vs_async_one_ratio")}
    )  # fmt: skip
    # The replicated class's end to end beside every peer that answers after two copies,
    # RocketMQ's SYNC_MASTER pair included (the three-replica ratios above leave it out).
    replicated_peers = [p for p in REPLICATED_PEERS if any(s.key == p for s in systems)]
    headline["sync_e2e_p99_vs_best_replicated_ratio"] = e2e_p99_vs_best(
        cells, METAQ_SYNC, replicated_peers, HEADLINE_SIZE
    )
    headline.update(kafka_ratios(cells, HEADLINE_SIZE))
    headline.update(rocketmq_ratios(cells, HEADLINE_SIZE))
    headline["targets_met"] = targets_met(headline)
    ordered = [s for key in ("metaq", "metaq_auth", "metaq_sync_replicated", "metaq_tls",
                             "metaq_trace",
                             *PEERS, *R3_PEERS, *PAIR_PEERS, *TOOL_ROWS)
               for s in systems if s.key == key]  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    table = markdown(cells, ordered, SIZES, args.rate, headline, when)
    if "sweep" in args.modes:
        table += sweep_markdown(cells, ordered)
    (args.out / "compare.md").write_text(table)
    chart(cells, ordered, SIZES, args.out / "compare.png")
    if args.chart is not None:
        sweep_chart(cells, ordered, args.chart)
        print(f"written: {args.chart}")
    figures = strict_json(
        {
            **headline,
            "measured_at": when,
            "seconds_per_cell": args.seconds,
            "e2e_seconds": args.e2e_seconds,
            "e2e_offered_msgs_s": args.rate,
            "cost_offered_msgs_s": args.cost_rate,
            **{
                f"{size}b": {
                    **ratios(cells, peers, size),
                    **sync_ratios(cells, r3_peers, size),
                    **kafka_ratios(cells, size),
                    **rocketmq_ratios(cells, size),
                }
                for size in SIZES
            },
            **raw(cells, ordered),
        }
    )
    (args.out / "compare.json").write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    print(table)
    print(f"written: {args.out / 'compare.md'}, compare.png, compare.json")
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
