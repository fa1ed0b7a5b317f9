"""Brokers and clients per cluster: three real nameservers under simulated brokers and clients.

Three ``metaq-nameserver`` processes (one Raft controller group, started by the testing
``ClusterBuilder``, each with its Raft journal on disk) are driven by simulator processes
that speak the real control plane with the product's own stubs and builders:

- a **broker** holds one ``Session`` stream to each nameserver and sends the registrar's
  own ``heartbeat()`` message every ``heartbeat_interval_ms`` (the broker's default), or
  as seldom as that nameserver's answers ask (the registrar's own ``beat_interval_s``:
  the controller's leader wants a master's beat at that rate, the rest come at the
  standby interval), the topic table only in its first one, as a controlled broker does:
  it reports SLAVE until a ``GroupControl`` names it master, then MASTER at that epoch
  with its group in sync, and it heartbeats at once when its role changes. A group is a
  master and a slave, each with ``TOPICS_PER_GROUP`` topics; a topic is served by
  ``GROUPS_PER_TOPIC`` groups.
- a **client** asks ``GetRoute`` for its topic every ``route_refresh_interval_s`` (the
  producer's default), of the nameserver a ``RouteCache`` asks first (a random one of
  the three; it moves only when that one fails). Client heartbeats go to brokers, not
  nameservers, so they are not simulated here.

Each simulator process is one asyncio loop multiplexing its brokers' streams and its
clients' calls over ``CHANNELS`` gRPC channels per nameserver. Per point, after every
group is bootstrapped by the controller and its in-sync set committed, a window of
``--ns-window-s`` seconds measures each nameserver's CPU (``/proc``), RSS, the heartbeats
it answered, the route queries' latency as the clients saw it, and the simulators' own
CPU. Then one group's master stops heartbeating (its stream stays open, as a hung broker's
would): the time until the controller elects its slave (the slave hears it), and until
every client of the group's topics has a route naming the new master.

The Raft figures: the journal on disk after the bootstrap, and a snapshot (pysyncobj's
full dump) of the controller's state for the same number of groups, made in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

# (groups, clients, broker heartbeat interval in s; None: the broker's default). Every
# point runs at the products' defaults: at 1,000 groups the nameservers and simulators
# fill this machine's two cores, so the busiest nameserver's cost with every heartbeat
# answered is also projected from its CPU per heartbeat (every figure says which).
POINTS: Final = ((10, 1_000, None), (100, 5_000, None), (300, 10_000, None), (1_000, 20_000, None))
QUICK_POINTS: Final = ((3, 60, None), (6, 120, None), (12, 240, None), (24, 480, None))
TOPICS_PER_GROUP: Final = 100
QUICK_TOPICS_PER_GROUP: Final = 12
GROUPS_PER_TOPIC: Final = 4
CHANNELS: Final = 4
"""gRPC channels per nameserver in each simulator process."""
CLUSTER: Final = "ScaleCluster"
TICK_S: Final = 0.01


def default_periods() -> tuple[float, float]:
    """(broker heartbeat interval, client route refresh interval), from the products."""
    from metaq.broker.config import BrokerConfig
    from metaq.client.producer import ProducerConfig

    return BrokerConfig().heartbeat_interval_ms / 1000, ProducerConfig().route_refresh_interval_s


def group_name(index: int) -> str:
    return f"scale-g{index:04d}"


def topics_of_group(index: int, groups: int, per_group: int) -> list[str]:
    """The group's topics: topic ``(f, j)`` lives on groups f, f+1, ... f+spread-1 (mod
    ``groups``), so each is on ``GROUPS_PER_TOPIC`` groups (all of them when fewer)."""
    spread = min(GROUPS_PER_TOPIC, groups)
    return [
        f"ScaleT{(index - offset) % groups:04d}x{j:03d}"
        for offset in range(spread)
        for j in range(per_group // spread)
    ]


def cluster_topics(groups: int, per_group: int) -> dict[str, list[int]]:
    """Every topic and the groups serving it."""
    served: dict[str, list[int]] = {}
    for index in range(groups):
        for topic in topics_of_group(index, groups, per_group):
            served.setdefault(topic, []).append(index)
    return served


# --- the simulator: one process, many brokers and clients -------------------------------


class _Broker:
    """One simulated broker of a controlled group and its sessions with every nameserver."""

    def __init__(self, sim: _Simulator, group: int, broker_id: int, topics: list[str]) -> None:
        from metaq.broker.registration import FixedTopics
        from metaq.common.model import BrokerKey, BrokerState, Permission, Role, TopicConfig

        self.sim = sim
        self.name = group_name(group)
        self.broker_id = broker_id
        port = 20_000 + group * 2 + broker_id
        self.state = BrokerState(
            cluster=CLUSTER,
            key=BrokerKey(self.name, broker_id),
            role=Role.SLAVE,
            data_address=f"127.0.0.1:{port}",
            controlled=True,
            configured_master=broker_id == 0,
            in_sync_ids=(),
        )
        self.topics = FixedTopics(
            tuple(TopicConfig(t, 8, 8, Permission.READ_WRITE) for t in sorted(topics))
        )
        self.silent = False
        self.committed_in_sync = 0
        self.elected_at: float | None = None
        self.wake = [asyncio.Event() for _ in sim.addresses]
        self.interval_s = [sim.heartbeat_s for _ in sim.addresses]

    def on_answer(self, registered: Any, index: int) -> None:
        """Beat nameserver ``index`` as often as it asks, as the registrar does; follow the
        controller: master at its epoch when it names this broker (with its group in
        sync, as a master whose slave keeps up reports), else slave."""
        from metaq.broker.registration import beat_interval_s
        from metaq.common.model import Role

        interval_s = beat_interval_s(self.sim.heartbeat_s, registered)
        if interval_s < self.interval_s[index]:
            self.wake[index].set()
        self.interval_s[index] = interval_s
        if not registered.HasField("control"):
            return
        control = registered.control
        self.committed_in_sync = len(control.in_sync_ids)
        me = control.master_id == self.broker_id
        role = Role.MASTER if me else Role.SLAVE
        if (role, control.epoch) == (self.state.role, self.state.epoch):
            return
        if me and self.elected_at is None:
            self.elected_at = time.time()
        self.state = dataclasses.replace(
            self.state, role=role, epoch=control.epoch, in_sync_ids=(0, 1) if me else ()
        )
        for wake in self.wake:
            wake.set()  # a role change is told at once, as the broker's registrar does

    async def session(self, index: int) -> None:
        """Sessions with nameserver ``index``, one after another: a lost one is opened
        again after a random back-off, as the broker's registrar does."""
        import grpc

        await asyncio.sleep(random.random() * self.sim.heartbeat_s)
        backoff_s = 0.1
        while True:
            try:
                await self._session(index)
            except (grpc.aio.AioRpcError, RuntimeError):
                self.sim.sessions_lost += 1
            await asyncio.sleep(random.uniform(0, backoff_s))
            backoff_s = min(backoff_s * 2, 2.0)

    async def _session(self, index: int) -> None:
        from metaq.broker.registration import BrokerDescription, heartbeat
        from metaq.common.auth import session_identity, session_metadata
        from metaq.common.server_names import target_of
        from metaq.common.v1 import control_pb2 as pb

        sim = self.sim
        address = sim.addresses[index]
        identity = session_identity(CLUSTER, self.name, self.broker_id, self.state.data_address)
        metadata = session_metadata(sim.secret, target_of(address), identity, time.time())
        stub = sim.stub(index, hash((self.name, self.broker_id)))
        call = stub.Session(metadata=metadata)
        answers: dict[int, asyncio.Future[None]] = {}

        async def read() -> None:
            while True:
                event = await call.read()
                if not isinstance(event, pb.SessionEvent):
                    raise RuntimeError(f"nameserver {address} ended the session")
                self.on_answer(event.registered, index)
                waiter = answers.pop(event.answers, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)

        reader = asyncio.get_running_loop().create_task(read())
        loop = asyncio.get_running_loop()
        sequence = 0
        wake = self.wake[index]
        try:
            while True:
                if not self.silent:
                    sequence += 1
                    message = heartbeat(
                        BrokerDescription(self.state, self.topics), with_topics=sequence == 1
                    )
                    message.sequence = sequence
                    answered = answers[sequence] = loop.create_future()
                    await call.write(message)
                    await asyncio.wait({answered, reader}, return_when=asyncio.FIRST_COMPLETED)
                    if reader.done():
                        reader.result()
                    sim.heartbeats[index] += 1
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval_s[index]):
                        await wake.wait()
                wake.clear()
        finally:
            reader.cancel()
            call.cancel()


@dataclasses.dataclass
class _Client:
    topic: str
    nameserver: int
    """The nameserver it asks: a ``RouteCache`` starts at a random one."""
    watch: str = ""
    """Set during a failover: the group whose new master this client waits to see."""
    learned_at: float | None = None
    seen: str = ""
    """While it waits: the master its last answer named, and when (for a report)."""


class _Simulator:
    def __init__(self, args: argparse.Namespace) -> None:
        import grpc

        from metaq.common.tls import grpc_channel
        from metaq.common.v1.control_pb2_grpc import NameServerStub
        from metaq.testing.waiting import cluster_secret_for_tests

        self.addresses: list[str] = args.nameservers.split(",")
        self.secret = cluster_secret_for_tests()
        self.heartbeat_s: float = args.heartbeat_s
        self.route_s: float = args.route_s
        # A local subchannel pool each: channels to one address would share one connection.
        options = [("grpc.use_local_subchannel_pool", 1)]
        self.channels: list[list[grpc.aio.Channel]] = [
            [grpc_channel(a, None, options=options) for _ in range(CHANNELS)]
            for a in self.addresses
        ]
        self.stubs = [[NameServerStub(c) for c in row] for row in self.channels]
        self.heartbeats = [0] * len(self.addresses)
        self.sessions_lost = 0
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}
        groups, per_group = args.groups, args.topics_per_group
        first, last = (int(x) for x in args.group_range.split(":"))
        self.brokers = {
            (group_name(g), b): _Broker(self, g, b, topics_of_group(g, groups, per_group))
            for g in range(first, last)
            for b in (0, 1)
        }
        topics = sorted(cluster_topics(groups, per_group))
        rng = random.Random(args.seed)
        self.clients = [
            _Client(rng.choice(topics), rng.randrange(len(self.addresses)))
            for _ in range(args.clients)
        ]
        self.queries = [0] * len(self.addresses)
        self.watched_master = ""

    def stub(self, index: int, spread: int) -> Any:
        return self.stubs[index][spread % CHANNELS]

    async def query(self, client: _Client) -> None:
        import grpc

        from metaq.common.model import TopicRoute
        from metaq.common.v1 import control_pb2 as pb

        began = time.perf_counter()
        stub = self.stub(client.nameserver, id(client) // 16)
        self.queries[client.nameserver] += 1
        try:
            reply = await stub.GetRoute(pb.GetRouteRequest(topic=client.topic), timeout=5.0)
        except grpc.aio.AioRpcError as exc:
            self.errors[exc.code().name] = self.errors.get(exc.code().name, 0) + 1
            return
        self.latencies.append(time.perf_counter() - began)
        if client.watch and client.learned_at is None:
            group = TopicRoute.from_proto(reply.route).group(client.watch)
            if group is not None and group.master_address == self.watched_master:
                client.learned_at = time.time()
            else:
                master = "no group" if group is None else group.master_address or "no master"
                client.seen = f"{master} at {time.time():.1f}"

    async def clients_loop(self) -> None:
        """Every client asks once per period, at its own phase: due ones each tick."""
        loop = asyncio.get_running_loop()
        count = len(self.clients)
        order = list(range(count))
        random.shuffle(order)
        began = loop.time()
        sent = 0
        pending: set[asyncio.Task[None]] = set()
        while True:
            due = int((loop.time() - began) / self.route_s * count)
            while sent < due:
                task = loop.create_task(self.query(self.clients[order[sent % count]]))
                pending.add(task)
                task.add_done_callback(pending.discard)
                sent += 1
            await asyncio.sleep(TICK_S)

    def fail(self, name: str) -> dict[str, Any]:
        """Silence the group's master (its streams stay open, as a hung broker's)."""
        master = next(
            b for (n, _), b in self.brokers.items() if n == name and b.state.role.value == "master"
        )
        slave = self.brokers[(name, 1 - master.broker_id)]
        master.silent = True
        slave.elected_at = None
        return {"stopped_at": time.time(), "successor": slave.state.data_address}

    def watch(self, name: str, address: str) -> dict[str, Any]:
        """From now on each client notes when its route first names ``address`` master
        of group ``name``."""
        self.watched_master = address
        for client in self.clients:
            client.watch = name
        return {}

    def failover_report(self, name: str) -> dict[str, Any]:
        """When the silenced master's slave heard it was elected (None: not yet)."""
        slave = next(b for (n, _), b in self.brokers.items() if n == name and not b.silent)
        return {"elected_at": slave.elected_at, "role": slave.state.role.value}

    def learned(self, topics: set[str]) -> dict[str, Any]:
        mine = [c for c in self.clients if c.topic in topics]
        times = [c.learned_at for c in mine if c.learned_at is not None]
        waiting = [
            f"{c.topic} from nameserver {c.nameserver}: {c.seen or 'not asked yet'}"
            for c in mine
            if c.learned_at is None
        ]
        return {
            "clients": len(mine), "learned": len(times), "last_at": max(times, default=None),
            "waiting": waiting[:5],
        }  # fmt: skip

    def window(self) -> dict[str, Any]:
        latencies, self.latencies = self.latencies, []
        heartbeats, self.heartbeats = self.heartbeats, [0] * len(self.addresses)
        errors, self.errors = self.errors, {}
        lost, self.sessions_lost = self.sessions_lost, 0
        queries, self.queries = self.queries, [0] * len(self.addresses)
        return {
            "latencies": latencies, "heartbeats": heartbeats, "errors": errors,
            "sessions_lost": lost, "queries": queries,
        }  # fmt: skip

    def roles(self) -> dict[str, Any]:
        masters = sum(1 for b in self.brokers.values() if b.state.role.value == "master")
        in_sync = sum(
            1 for b in self.brokers.values()
            if b.state.role.value == "master" and b.committed_in_sync == 2
        )  # fmt: skip
        return {"masters": masters, "in_sync_masters": in_sync, "groups": len(self.brokers) // 2}


async def simulate(args: argparse.Namespace) -> None:
    sim = _Simulator(args)
    loop = asyncio.get_running_loop()
    tasks = [
        loop.create_task(broker.session(i))
        for broker in sim.brokers.values()
        for i in range(len(sim.addresses))
    ]
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def say(value: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(value) + "\n")
        sys.stdout.flush()

    say({"ready": True})
    while True:
        line = (await reader.readline()).decode().split()
        if not line or line[0] == "quit":
            break
        command = line[0]
        failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception()]
        if failed:
            say({"error": repr(failed[0].exception())})
            break
        if command == "roles":
            say(sim.roles())
        elif command == "window":
            say(sim.window())
        elif command == "clients":
            tasks.append(loop.create_task(sim.clients_loop()))
            say({})
        elif command == "fail":
            say(sim.fail(line[1]))
        elif command == "watch":
            say(sim.watch(line[1], line[2]))
        elif command == "elected":
            say(sim.failover_report(line[1]))
        elif command == "learned":
            say(sim.learned(set(line[1:])))
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# --- the parent ---------------------------------------------------------------------------


class _SimProcess:
    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self.ask_raw("")

    def ask_raw(self, line: str) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        if line:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"simulator died: {self.process.stderr.read()[-2000:]}")  # type: ignore[union-attr]
        value: dict[str, Any] = json.loads(answer)
        if "error" in value:
            raise RuntimeError(f"simulator failed: {value['error']}")
        return value

    def ask(self, line: str) -> dict[str, Any]:
        return self.ask_raw(line)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            assert self.process.stdin is not None
            self.process.stdin.write("quit\n")
            self.process.stdin.flush()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _wait(what: str, check: Any, timeout_s: float, poll_s: float = 0.2) -> float:
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout_s:
            raise TimeoutError(f"{what} not within {timeout_s:.0f} s")
        time.sleep(poll_s)
    return time.monotonic() - began


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def snapshot_figures(groups: int) -> dict[str, Any]:
    """pysyncobj's full dump of a controller state of ``groups`` groups: size and time."""
    from metaq.nameserver.raft import ControlRaft

    work = Path(tempfile.mkdtemp(prefix="metaq-scale-raft-"))
    try:
        raft = ControlRaft(directory=work)
        raft.start(lambda _snapshot: None)
        log = raft._log
        assert log is not None
        _wait("a Raft leader", lambda: raft.is_leader, 10)
        done: list[int] = []
        for index in range(groups):
            log.bootstrap(group_name(index), 0, 1, "bench", callback=lambda *_: done.append(1))
        _wait("the bootstrap entries", lambda: len(done) == groups, 60)
        dump = work / "raft-dump.bin"
        began = time.perf_counter()
        log.forceLogCompaction()
        _wait("the dump", lambda: dump.exists() and dump.stat().st_size > 0, 60, poll_s=0.002)
        took = time.perf_counter() - began
        return {"snapshot_bytes": dump.stat().st_size, "snapshot_s": round(took, 3)}
    finally:
        asyncio.run(raft.stop())
        shutil.rmtree(work, ignore_errors=True)


def handler_figures(groups: int, per_group: int) -> dict[str, Any]:
    """CPU of the nameserver's own handlers, in this process (no gRPC, no other load): one
    ``GetRoute`` over ``groups`` registered groups (built, then kept: asked again), and one
    heartbeat that changes nothing.
    The figures the shared machine cannot blur."""
    from metaq.broker.registration import BrokerDescription, FixedTopics, heartbeat
    from metaq.common.model import BrokerKey, BrokerState, Role, TopicConfig
    from metaq.common.server_names import ServerNames
    from metaq.common.v1 import control_pb2 as pb
    from metaq.nameserver.controller import Controller, ControllerSettings
    from metaq.nameserver.registry import Registry
    from metaq.nameserver.service import NameServerService, _Stream
    from metaq.nameserver.user_auth import UserCalls

    class Context:
        def invocation_metadata(self) -> tuple[()]:
            return ()

        async def abort(self, code: object, details: str) -> None:
            raise RuntimeError(details)

    registry = Registry(10.0, clock=lambda: 0.0)  # nothing expires while it registers
    service = NameServerService(
        registry, Controller(registry, ControllerSettings()), None,
        UserCalls(None, None, ServerNames(())),
    )  # fmt: skip
    for index in range(groups):
        table = {t: TopicConfig(t, 8, 8) for t in topics_of_group(index, groups, per_group)}
        for broker_id in (0, 1):
            role = Role.MASTER if broker_id == 0 else Role.SLAVE
            key = BrokerKey(group_name(index), broker_id)
            registry.register(BrokerState(CLUSTER, key, role, f"127.0.0.1:{index + 2}"), table)
    topics = sorted(cluster_topics(groups, per_group))
    context: Any = Context()
    count = 2000

    async def routes() -> float:
        began = time.process_time()
        for n in range(count):
            request = pb.GetRouteRequest(topic=topics[n * 7919 % len(topics)])
            (await service.GetRoute(request, context)).SerializeToString()
        return time.process_time() - began

    route_s = asyncio.run(routes())
    kept_route_s = asyncio.run(routes())  # the same topics again: the routes kept
    state = BrokerState(CLUSTER, BrokerKey("scale-hb", 0), Role.MASTER, "127.0.0.1:1")
    description = BrokerDescription(state, FixedTopics((TopicConfig("ScaleHb", 8, 8),)))
    stream = _Stream(1, context)
    service._heartbeat(heartbeat(description, with_topics=True), stream)
    message = heartbeat(description, with_topics=False)
    began = time.process_time()
    for n in range(count):
        message.sequence = n
        service._heartbeat(message, stream).SerializeToString()  # type: ignore[union-attr]
    heartbeat_s = time.process_time() - began
    return {
        "route_handler_cpu_us": round(route_s / count * 1e6, 1),
        "route_handler_kept_cpu_us": round(kept_route_s / count * 1e6, 1),
        "heartbeat_handler_cpu_us": round(heartbeat_s / count * 1e6, 1),
        "controller_round_ms": controller_round_ms(groups),
    }


def controller_round_ms(groups: int) -> float:
    """CPU of one of the leader's decision rounds (10 a second) over ``groups`` settled
    groups, in this process: every master reporting MASTER with its slave in sync, as
    between failovers."""
    from metaq.common.model import BrokerKey, BrokerState, GroupControl, Role
    from metaq.nameserver.controller import Controller, ControllerSettings
    from metaq.nameserver.registry import Registry

    registry = Registry(10.0, clock=lambda: 0.0)
    controller = Controller(registry, ControllerSettings(), clock=lambda: 0.0)
    committed = {}
    for index in range(groups):
        name = group_name(index)
        for broker_id in (0, 1):
            registry.register(
                BrokerState(
                    CLUSTER, BrokerKey(name, broker_id),
                    Role.MASTER if broker_id == 0 else Role.SLAVE,
                    f"127.0.0.1:{20_000 + index * 2 + broker_id}", epoch=1, controlled=True,
                    configured_master=broker_id == 0, in_sync_ids=(0, 1) if broker_id == 0 else (),
                ),
                {},
            )  # fmt: skip
        committed[name] = GroupControl(name, 1, 0, (0, 1))
    controller._take(committed)
    controller.proposals()  # the first round decides every group and finds each settled
    rounds = 20
    began = time.process_time()
    for _ in range(rounds):
        controller.proposals()
    return round((time.process_time() - began) / rounds * 1e3, 2)


def measure_point(
    args: argparse.Namespace, work: Path, groups: int, clients: int, heartbeat_s: float
) -> dict[str, Any]:
    from metaq.common.v1 import control_pb2 as pb
    from metaq.testing.cluster import ClusterBuilder, nameserver_node

    route_s = args.route_s
    per_group = args.topics_per_group
    row: dict[str, Any] = {
        "groups": groups, "brokers": groups * 2, "clients": clients,
        "topics": len(cluster_topics(groups, per_group)), "topics_per_group": per_group,
        "heartbeat_s": heartbeat_s, "route_refresh_s": route_s,
    }  # fmt: skip
    here = work / f"g{groups}"
    builder = ClusterBuilder(
        nameservers=3,
        groups=(),
        node_args={
            nameserver_node(i): ["--controller-dir", str(here / nameserver_node(i) / "raft")]
            for i in range(3)
        },
    )
    cluster = builder.start(here)
    sims: list[_SimProcess] = []
    try:
        pids = [ns.process.pid for ns in cluster.nameservers]
        idle0 = [_cpu_s(p) for p in pids]
        time.sleep(args.idle_s)
        idle = [(_cpu_s(p) - c) / args.idle_s for p, c in zip(pids, idle0, strict=True)]
        row["ns_idle_cpu_cores"] = [round(c, 3) for c in idle]
        addresses = ",".join(cluster.nameserver_addresses)
        procs = max(1, min(args.sim_processes, groups))
        cuts = [groups * i // procs for i in range(procs + 1)]
        for i in range(procs):
            sims.append(_SimProcess([
                sys.executable, __file__, "--simulate", "--nameservers", addresses,
                "--groups", str(groups), "--group-range", f"{cuts[i]}:{cuts[i + 1]}",
                "--clients", str(clients // procs), "--topics-per-group", str(per_group),
                "--heartbeat-s", str(heartbeat_s), "--route-s", str(route_s),
                "--seed", str(i),
            ]))  # fmt: skip
        began = time.monotonic()

        def settled() -> bool:
            roles = [s.ask("roles") for s in sims]
            return bool(sum(r["in_sync_masters"] for r in roles) == groups)

        _wait(f"{groups} groups with a master and its slave in sync", settled, args.settle_s)
        row["settle_s"] = round(time.monotonic() - began, 1)
        row["raft_journal_bytes_after_bootstrap"] = (
            sum(_dir_bytes(here / nameserver_node(i) / "raft") for i in range(3)) // 3
        )
        # Heartbeats alone first: each nameserver's CPU per heartbeat, apart from routes.
        for sim in sims:
            sim.ask("window")
        cpu0 = [_cpu_s(p) for p in pids]
        t0 = time.monotonic()
        time.sleep(args.beats_window_s)
        beats_elapsed = time.monotonic() - t0
        beats_cpu = [(_cpu_s(p) - c) / beats_elapsed for p, c in zip(pids, cpu0, strict=True)]
        beats_windows = [s.ask("window") for s in sims]
        beats_rate = [sum(w["heartbeats"][i] for w in beats_windows) / beats_elapsed
                      for i in range(3)]  # fmt: skip
        for sim in sims:
            sim.ask("clients")
        # Warm up (the clients' phases spread from when they start), then the window.
        time.sleep(args.warm_up_s)
        for sim in sims:
            sim.ask("window")
        cpu0 = [_cpu_s(p) for p in pids]
        sim_cpu0 = [_cpu_s(s.process.pid) for s in sims]
        t0 = time.monotonic()
        time.sleep(args.window_s)
        elapsed = time.monotonic() - t0
        cpu = [(_cpu_s(p) - c) / elapsed for p, c in zip(pids, cpu0, strict=True)]
        sim_cpu = [
            (_cpu_s(s.process.pid) - c) / elapsed for s, c in zip(sims, sim_cpu0, strict=True)
        ]
        windows = [s.ask("window") for s in sims]
        # The journal file's size (pysyncobj grows it in steps): heartbeats are not
        # written to it, only the controller's decisions.
        row["raft_journal_bytes_after_window"] = (
            sum(_dir_bytes(here / nameserver_node(i) / "raft") for i in range(3)) // 3
        )
        latencies = [x for w in windows for x in w["latencies"]]
        heartbeats = [sum(w["heartbeats"][i] for w in windows) for i in range(3)]
        errors: dict[str, int] = {}
        row["sessions_lost"] = sum(w["sessions_lost"] for w in windows)
        for w in windows:
            for k, v in w["errors"].items():
                errors[k] = errors.get(k, 0) + v
        leader = next(
            (i for i, ns in enumerate(cluster.nameservers) if cluster.controller(i).is_leader),
            None,
        )
        queries = [sum(w["queries"][i] for w in windows) for i in range(3)]
        offered_hb = _offered_heartbeats(groups, heartbeat_s, leader)
        row.update(
            ns_cpu_cores=[round(c, 3) for c in cpu],
            ns_cpu_cores_max=round(max(cpu), 3),
            ns_rss_mib=[_rss_mib(p) for p in pids],
            leader=leader,
            heartbeats_per_s_offered=[round(h, 1) for h in offered_hb],
            heartbeats_per_s_answered=[round(h / elapsed, 1) for h in heartbeats],
            route_queries_per_s=round(len(latencies) / elapsed, 1),
            route_queries_per_s_asked=[round(q / elapsed, 1) for q in queries],
            route_query_errors=errors,
            route_query_p50_ms=_ms(_percentile(latencies, 0.5)),
            route_query_p99_ms=_ms(_percentile(latencies, 0.99)),
            sim_processes=len(sims),
            sim_channels_per_nameserver=CHANNELS * len(sims),
            sim_cpu_cores=[round(c, 3) for c in sim_cpu],
            window_s=round(elapsed, 1),
            # The machine is shared: a load far above its 2 cores stretches latencies.
            load_average_1m=round(os.getloadavg()[0], 1),
        )
        # CPU per heartbeat and per route query: every nameserver's CPU above its idle
        # (Raft ticks, the controller's rounds, the sweeper) is heartbeats and queries;
        # the leader answers more heartbeats than the followers, the clients ask all
        # three alike, so the three nameservers give both costs (least squares).
        fitted = _fit(
            [(c - i) * elapsed for c, i in zip(cpu, idle, strict=True)], heartbeats, queries
        )
        # The same from the window of heartbeats alone: each nameserver's CPU above idle
        # per heartbeat there, and what the clients' window adds beyond its heartbeats
        # per route query. Not a fit over the three: nothing to tell apart.
        hb_alone = [
            (c - i) / r if r > 0 else None
            for c, i, r in zip(beats_cpu, idle, beats_rate, strict=True)
        ]
        row["ns_cpu_cores_heartbeats_alone"] = [round(c, 3) for c in beats_cpu]
        row["heartbeats_per_s_answered_alone"] = [round(r, 1) for r in beats_rate]
        row["ns_cpu_us_per_heartbeat_alone"] = [
            None if h is None else round(h * 1e6, 1) for h in hb_alone
        ]
        per_query = [
            (c - i - h * hb / elapsed) / (q / elapsed)
            for c, i, h, hb, q in zip(cpu, idle, hb_alone, heartbeats, queries, strict=True)
            if h is not None and q > 0
        ]
        if per_query:
            row["ns_cpu_us_per_route_query_apart"] = round(sum(per_query) / len(per_query) * 1e6, 1)
        if all(h is not None for h in hb_alone) and per_query:
            default_hb = _offered_heartbeats(groups, args.heartbeat_s, leader)
            query = sum(per_query) / len(per_query)
            row["ns_cpu_cores_projected_busiest_apart"] = round(
                max(
                    idle[i] + default_hb[i] * (hb_alone[i] or 0.0) + clients / route_s / 3 * query
                    for i in range(3)
                ),
                3,
            )
        if fitted is not None:
            hb_cost, query_cost = fitted
            row["ns_cpu_us_per_heartbeat"] = round(hb_cost * 1e6, 1)
            row["ns_cpu_us_per_route_query"] = round(query_cost * 1e6, 1)
            # What the busiest would use were the default load all answered: the machine
            # is shared, and a starved nameserver answers less than it is offered.
            default_hb = _offered_heartbeats(groups, args.heartbeat_s, leader)
            row["ns_cpu_cores_projected_busiest"] = round(
                max(
                    idle[i] + default_hb[i] * hb_cost + clients / route_s / 3 * query_cost
                    for i in range(3)
                ),
                3,
            )
        if args.failover:
            row.update(failover(args, cluster, sims, groups, pb))
    finally:
        for sim in sims:
            sim.stop()
        cluster.stop()
        shutil.rmtree(here, ignore_errors=True)
    return row


def failover(
    args: argparse.Namespace, cluster: Any, sims: list[_SimProcess], groups: int, pb: Any
) -> dict[str, Any]:
    name = group_name(0)
    topics = {
        t for t, served in cluster_topics(groups, args.topics_per_group).items() if 0 in served
    }
    stopped = sims[0].ask(f"fail {name}")  # the first simulator has the first groups
    stopped_at = stopped["stopped_at"]
    for sim in sims:
        sim.ask(f"watch {name} {stopped['successor']}")
    out: dict[str, Any] = {}
    elected: dict[str, Any] = {}

    def decided() -> bool:
        elected.update(sims[0].ask(f"elected {name}"))
        return elected.get("elected_at") is not None

    try:
        _wait("the controller's failover decision", decided, 60)
        out["failover_decision_s"] = round(elected["elected_at"] - stopped_at, 2)
    except TimeoutError as exc:
        out["failover_failed"] = str(exc)
        return out
    answers: list[dict[str, Any]] = []

    def all_learned() -> bool:
        answers[:] = [s.ask("learned " + " ".join(sorted(topics))) for s in sims]
        return bool(sum(a["learned"] for a in answers) == sum(a["clients"] for a in answers))

    try:
        _wait("every client of the group's topics learning", all_learned, args.route_s * 2 + 30)
        last = max((a["last_at"] for a in answers if a["last_at"]), default=stopped_at)
        out["failover_all_clients_learned_s"] = round(last - stopped_at, 2)
    except TimeoutError as exc:
        waiting = [w for a in answers for w in a["waiting"]][:5]
        out["failover_failed"] = f"{exc}; still waiting at {time.time():.1f}: {waiting}"
    out["failover_clients_watching"] = sum(a["clients"] for a in answers)
    return out


def _offered_heartbeats(groups: int, heartbeat_s: float, leader: int | None) -> list[float]:
    """Heartbeats per second each nameserver is offered, as its answers ask: the leader
    hears each group's master at ``heartbeat_s``, everything else comes at the standby
    interval (when it is longer)."""
    from metaq.nameserver.config import NameServerConfig

    standby_s = max(heartbeat_s, NameServerConfig().standby_heartbeat_interval_ms / 1000)
    return [
        groups / heartbeat_s + groups / standby_s if i == leader else 2 * groups / standby_s
        for i in range(3)
    ]


def _fit(costs: list[float], xs: list[int], ys: list[int]) -> tuple[float, float] | None:
    """(a, b) minimising the squares of ``cost - a x - b y``, both kept at least 0; None
    when the counts cannot tell the two apart."""
    sxx = sum(x * x for x in xs)
    syy = sum(y * y for y in ys)
    sxy = sum(x * y for x, y in zip(xs, ys, strict=True))
    sxc = sum(x * c for x, c in zip(xs, costs, strict=True))
    syc = sum(y * c for y, c in zip(ys, costs, strict=True))
    det = sxx * syy - sxy * sxy
    if not sxx or not syy or det <= 1e-6 * sxx * syy:
        return None
    a = (sxc * syy - syc * sxy) / det
    b = (syc * sxx - sxc * sxy) / det
    if a < 0:
        return 0.0, max(0.0, syc / syy)
    if b < 0:
        return max(0.0, sxc / sxx), 0.0
    return a, b


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every point; the figures for bench-scale's JSON, with the rows."""
    work = Path(tempfile.mkdtemp(prefix="metaq-bench-scale-ns-"))
    rows: list[dict[str, Any]] = []
    try:
        for groups, clients, heartbeat_s in args.ns_points:
            print(f"{groups:,} groups, {clients:,} clients: measuring", file=sys.stderr, flush=True)
            args.failover = groups == args.ns_points[-1][0]
            try:
                row = measure_point(args, work, groups, clients, heartbeat_s or args.heartbeat_s)
            except (TimeoutError, RuntimeError) as exc:
                row = {"groups": groups, "clients": clients, "failed": str(exc)[-1500:]}
            row.update(snapshot_figures(groups))
            row.update(handler_figures(groups, args.topics_per_group))
            rows.append(row)
            print(f"  {row}", file=sys.stderr, flush=True)
            if "failed" in row:
                break
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return figures(rows)


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in rows if "failed" not in r]
    top = next((r for r in done if (r["groups"], r["clients"]) == (1_000, 20_000)), None)
    out: dict[str, Any] = {"nameserver_rows": rows}
    out["nameserver_cpu_cores_at_1000_groups_20000_clients"] = (
        None if top is None else top["ns_cpu_cores_max"]
    )
    out["nameserver_cpu_cores_projected_at_1000_groups_20000_clients"] = (
        None if top is None else top.get("ns_cpu_cores_projected_busiest")
    )
    largest = done[-1] if done else None
    out["route_query_p99_ms_at_scale"] = None if largest is None else largest["route_query_p99_ms"]
    if largest is not None:
        out["nameserver_largest_point"] = [largest["groups"], largest["clients"]]
        for key in ("failover_decision_s", "failover_all_clients_learned_s"):
            if key in largest:
                out[key] = largest[key]
    if top is not None:
        out["nameserver_targets_met"] = {
            "cpu_under_half_core_each": top["ns_cpu_cores_max"] < 0.5,
            "projected_cpu_under_half_core_each": (top.get("ns_cpu_cores_projected_busiest") or 1e9)
            < 0.5,
            "route_query_p99_at_most_20_ms": (top["route_query_p99_ms"] or 1e9) <= 20,
        }
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        "| groups | brokers | clients | ns CPU cores (each) | µs/heartbeat | hb/s answered "
        "(each) | route q/s | route p50 ms | route p99 ms | RSS MiB | simulator cores |"
    )
    print("|---:|---:|---:|---|---:|---|---:|---:|---:|---|---|")
    for r in rows:
        if "failed" in r:
            print(f"| {r['groups']:,} | | {r['clients']:,} | failed: {r['failed'][:200]} |")
            continue
        print(
            f"| {r['groups']:,} | {r['brokers']:,} | {r['clients']:,} | {r['ns_cpu_cores']} "
            f"| {r.get('ns_cpu_us_per_heartbeat')} | {r['heartbeats_per_s_answered']} "
            f"| {r['route_queries_per_s']} | {r['route_query_p50_ms']} "
            f"| {r['route_query_p99_ms']} | {r['ns_rss_mib']} | {r['sim_cpu_cores']} |"
        )


def chart(rows: list[dict[str, Any]], before: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("ns_cpu_cores_max", "busiest nameserver, CPU cores"),
        ("ns_cpu_us_per_heartbeat", "nameserver CPU per heartbeat, µs"),
        ("route_handler_cpu_us", "GetRoute handler CPU per query (in process), µs"),
        ("route_query_p99_ms", "route query p99 (shared machine), ms"),
        ("ns_rss_max_mib", "nameserver RSS, MiB"),
        ("raft_journal_bytes_after_bootstrap", "Raft journal after bootstrap, bytes"),
        ("snapshot_s", "Raft snapshot (full dump), s"),
        ("heartbeat_handler_cpu_us", "heartbeat handler CPU (in process), µs"),
    )
    figure, axes = plt.subplots(2, 4, figsize=(18, 7))
    for ax, (key, title) in zip(axes.flat, panels, strict=True):
        for series, label, style in ((before, "before", "o--"), (rows, "after", "o-")):
            points = [
                (r["groups"], _value(r, key)) for r in series
                if "failed" not in r and _value(r, key) is not None
            ]  # fmt: skip
            if points:
                ax.plot(*zip(*points, strict=True), style, label=label)
        ax.set_xscale("log")
        ax.set_title(title)
        ax.set_xlabel("broker groups")
        ax.grid(True, alpha=0.3)
        ax.legend()
    figure.suptitle(
        "Three nameservers under simulated broker groups (a master and a slave, 100 topics)"
        " and 1,000 to 20,000 clients, 2 shared cores"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def _value(row: dict[str, Any], key: str) -> Any:
    if key == "ns_rss_max_mib":
        return max(row["ns_rss_mib"]) if "ns_rss_mib" in row else None
    return row.get(key)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ns-points",
        help="nameserver points as groups:clients[:heartbeat_s], comma-separated (10:1000,...)",
    )
    parser.add_argument("--ns-window-s", type=float, help="seconds measured per point")
    parser.add_argument("--ns-before", type=Path, help="an earlier run's JSON, drawn as 'before'")
    parser.add_argument("--sim-processes", type=int, default=2, help="simulator processes")


def configure(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fill in the nameserver dimension's settings from the parsed arguments."""
    heartbeat_s, route_s = default_periods()
    args.heartbeat_s, args.route_s = heartbeat_s, route_s
    if args.quick:
        args.route_s = 3.0  # the smoke run waits for every client to learn a failover
    if args.ns_points:
        try:
            args.ns_points = [_point(p) for p in args.ns_points.split(",")]
        except ValueError:
            parser.error(
                "--ns-points takes groups:clients[:heartbeat_s] like 10:1000,1000:20000:2 "
                f"(heartbeat_s: the brokers' interval, default theirs): not {args.ns_points!r}"
            )
    else:
        args.ns_points = QUICK_POINTS if args.quick else POINTS
    args.window_s = args.ns_window_s or (3.0 if args.quick else 20.0)
    args.topics_per_group = QUICK_TOPICS_PER_GROUP if args.quick else TOPICS_PER_GROUP
    args.settle_s = 120.0 if args.quick else 600.0
    # The idle CPU measured before the simulators start, and the warm-up after every group
    # settled: the clients' phases spread from when the simulators start, so a quick run
    # (whose groups settle in a second or two) needs only a short one.
    args.idle_s = 1.0 if args.quick else 2.0
    args.warm_up_s = 1.0 if args.quick else min(args.window_s, 5.0)
    args.beats_window_s = 1.0 if args.quick else args.window_s / 2


def _point(text: str) -> tuple[int, int, float | None]:
    groups, clients, *heartbeat = text.split(":")
    if len(heartbeat) > 1:
        raise ValueError(text)
    return int(groups), int(clients), float(heartbeat[0]) if heartbeat else None


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run over small counts")
    parser.add_argument("--chart", type=Path, help="draw the curves into this PNG")
    add_arguments(parser)
    parser.add_argument("--simulate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--nameservers", help=argparse.SUPPRESS)
    parser.add_argument("--groups", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--group-range", help=argparse.SUPPRESS)
    parser.add_argument("--clients", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--topics-per-group", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--heartbeat-s", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--route-s", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.simulate:
        asyncio.run(simulate(args))
        return
    configure(args, parser)
    out = run(args)
    finish(out, args.chart, args.ns_before)
    print(json.dumps(out, sort_keys=True))


def finish(out: dict[str, Any], chart_path: Path | None, before_path: Path | None) -> None:
    """The table, and the chart when asked for (``before_path``: an earlier run's output,
    drawn as "before")."""
    print_table(out["nameserver_rows"])
    if chart_path is not None:
        before = []
        if before_path is not None:
            before = json.loads(before_path.read_text().strip().splitlines()[-1])["nameserver_rows"]
        chart(out["nameserver_rows"], before, chart_path)
        print(f"chart: {chart_path}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
