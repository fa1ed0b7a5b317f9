"""A whole cluster on several hosts: three nameservers (one Raft group hosting the
failover controller), two broker groups of a master and a slave, and a client host for
the workload — each node in its own network namespace (:mod:`chaoslib.net`).

The processes are started by the testing member's ``ClusterBuilder`` (the network here
is its :class:`~metaq.testing.cluster.Hosts`). The cluster writes every fault it makes
into the history, so the checker knows what happened when. Brokers keep their data
directories across restarts, as rebooted machines would. :meth:`Cluster.close` kills
whatever is still running and removes the namespaces, on success and on failure alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc

from chaoslib import disk
from chaoslib.history import HistoryTail, HistoryWriter
from chaoslib.net import Network
from chaoslib.workload import ConsumerSpec, ProducerSpec, WorkloadSpec
from metaq.client.routes import RouteCache
from metaq.common.users import ACCESS_KEY_ENV, SECRET_KEY_ENV, Credentials
from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1 import control_pb2_grpc
from metaq.testing import BrokerProcess
from metaq.testing.cluster import Cluster as Processes
from metaq.testing.cluster import ClusterBuilder, broker_node
from metaq.testing.nameserver_process import NameServerProcess, signed_channel
from metaq.testing.waiting import wait_until

CHAOS_DIR: Final = Path(__file__).resolve().parent.parent
GROUPS: Final = ("a", "b")
NAMESERVERS: Final = ("ns0", "ns1", "ns2")
BROKERS: Final = ("a0", "a1", "b0", "b1")
CLIENT: Final = "client"
QUEUES: Final = 4
# topic -> (broker group holding it, ordered)
TOPICS: Final = {"chaos-a": ("a", False), "chaos-b": ("b", False), "chaos-ordered": ("a", True)}
# Failure detection as the failover tests use it; the rest are the production defaults.
FAST: Final = ("replica_lag_max_ms=2000", "replication_timeout_ms=1000")
POLL_S: Final = 0.05
SCRAPE_TOKEN: Final = "chaos-scrape-token-0123456789abcdef"
SEGMENT_BYTES: Final = 4194304  # BrokerProcess's small store


def python_path() -> str:
    """``PYTHONPATH=...`` that finds chaoslib in a child process (``env`` execs it)."""
    inherited = os.environ.get("PYTHONPATH", "")
    return f"PYTHONPATH={CHAOS_DIR}" + (f":{inherited}" if inherited else "")


def broker_name(group: str) -> str:
    return f"broker-{group}"


def group_of(node: str) -> str:
    return node[0]


def broker_id(node: str) -> int:
    return int(node[1:])


@dataclass
class ClusterSpec:
    brokers: tuple[str, ...] = BROKERS
    """The broker nodes, named by group letter and broker id."""
    replication_mode: str = "sync"
    min_in_sync: int = 1
    flush_mode: str = "sync"
    settings: tuple[str, ...] = FAST
    """``--set KEY=VALUE`` for every broker."""
    lossy: bool = False
    """Brokers run under chaoslib.lossy_broker, so a power loss can be simulated."""
    nameserver_args: tuple[str, ...] = ()
    loopback: bool = False
    small_disks: tuple[str, ...] = ()
    """Brokers whose data directory is a loop-mounted filesystem of ``small_disk_mib``."""
    small_disk_mib: int = 256
    auth: bool = False
    """Users on every server (the builder's ``auth``): the workload and the observer's
    route checks sign as its admin, the observer's controller questions as a member."""
    metrics_auth: bool = False
    """``metrics_auth = bearer`` on every server with :data:`SCRAPE_TOKEN`, which the
    observer's ``/health`` questions carry (:attr:`Cluster.scrape_headers`)."""


@dataclass(frozen=True)
class OnNetwork:
    """The chaos network as the cluster builder's hosts (:class:`metaq.testing.cluster.Hosts`):
    the builder's ``broker-a-0`` is node ``a0`` here, its ``ns0`` is ``ns0``."""

    net: Network

    def address(self, node: str) -> str:
        return self.net.address(_node(node))

    def command(self, node: str, argv: Sequence[str]) -> list[str]:
        return self.net.command(_node(node), argv)


def _node(builder_node: str) -> str:
    group, _, broker_id = builder_node.rpartition("-")
    return f"{group.removeprefix('broker-')}{broker_id}" if group else builder_node


@dataclass
class Cluster:
    work_dir: Path
    spec: ClusterSpec
    history: HistoryWriter
    net: Network = field(init=False)
    processes: Processes | None = None
    """The nameservers and brokers, started by the testing member's ClusterBuilder."""
    workload: subprocess.Popen[bytes] | None = None
    tail: HistoryTail = field(init=False)

    def __post_init__(self) -> None:
        self.tail = HistoryTail(self.history.path)

    # --- start and stop -----------------------------------------------------------------

    def start(self) -> None:
        self.net = Network.create([*NAMESERVERS, *self.spec.brokers, CLIENT],
                                  loopback=self.spec.loopback)  # fmt: skip
        self.history.write(
            "network", namespaces=self.net.namespaces, why_loopback=self.net.why_loopback,
            hosts={n: h.address for n, h in self.net.hosts.items()},
        )  # fmt: skip
        self.processes = Processes(self._builder(), self.work_dir)
        for node in self.spec.small_disks:
            disk.mount_small_disk(self.data_dir(node), self.spec.small_disk_mib)
        self.processes.start()
        for group in GROUPS:
            self.wait_master(group)
        for topic, (group, ordered) in TOPICS.items():
            asyncio.run(self.processes.create_topic(
                topic, queues=QUEUES, groups=[broker_name(group)], ordered=ordered, timeout_s=30
            ))  # fmt: skip
        for group in GROUPS:
            self.wait_in_sync(group)

    def _builder(self) -> ClusterBuilder:
        """Three nameservers (one controller group) and the spec's brokers, each on its own
        host when the network has namespaces (then on the deployed ports)."""
        replicas = Counter(group_of(node) for node in self.spec.brokers)
        lossy = ["env", python_path(), sys.executable, "-m", "chaoslib.lossy_broker"]
        settings = list(self.spec.settings)
        nameserver_args = list(self.spec.nameserver_args)
        if self.spec.metrics_auth:
            token = self.work_dir / "scrape-token"
            token.write_text(SCRAPE_TOKEN + "\n")
            token.chmod(0o600)
            settings += ["metrics_auth=bearer", f"metrics_auth_file={token}"]
            nameserver_args += ["--metrics-auth", "bearer", "--metrics-auth-file", str(token)]
        return ClusterBuilder(
            nameservers=len(NAMESERVERS),
            groups=tuple(broker_name(g) for g in GROUPS),
            group_replicas={broker_name(g): count for g, count in replicas.items()},
            replication_mode=self.spec.replication_mode,
            min_in_sync=self.spec.min_in_sync,
            auth=self.spec.auth,
            nameserver_args=nameserver_args,
            broker_args=("--flush-mode", self.spec.flush_mode,
                         *(arg for setting in settings for arg in ("--set", setting))),
            broker_command=lossy if self.spec.lossy else None,
            hosts=OnNetwork(self.net) if self.net.namespaces else None,
            health_headers=self.scrape_headers,
        )  # fmt: skip

    @property
    def scrape_headers(self) -> dict[str, str]:
        """What a request for ``/metrics`` or ``/health``'s detail carries."""
        return {"Authorization": f"Bearer {SCRAPE_TOKEN}"} if self.spec.metrics_auth else {}

    @property
    def credentials(self) -> Credentials | None:
        """The admin the workload and the observer sign as, on a cluster with users."""
        return self._started().admin

    def _started(self) -> Processes:
        assert self.processes is not None, "start() first"
        return self.processes

    @property
    def nameservers(self) -> dict[str, NameServerProcess]:
        started = self.processes.nameservers if self.processes is not None else []
        return dict(zip(NAMESERVERS, started, strict=False))

    @property
    def brokers(self) -> dict[str, BrokerProcess]:
        started = self.processes.brokers if self.processes is not None else {}
        return {_node(broker_node(name, i)): b for (name, i), b in started.items()}

    def start_nameserver(self, node: str) -> NameServerProcess:
        """Start ``node`` again, on its directory, address and ports."""
        return self._started().start_nameserver(NAMESERVERS.index(node))

    def raft_address(self, node: str) -> str:
        """The nameserver's controller (Raft) address, host:port."""
        return self.nameservers[node].raft_address

    @property
    def nameserver_addresses(self) -> list[str]:
        return self._started().nameserver_addresses

    def data_dir(self, node: str) -> Path:
        return self._started().data_dir(broker_name(group_of(node)), broker_id(node))

    def start_broker(self, node: str) -> BrokerProcess:
        """Start ``node`` again, on its data."""
        return self._started().start_broker(broker_name(group_of(node)), broker_id(node))

    def close(self) -> None:
        """Kill everything still running and remove the network; never raises."""
        with contextlib.suppress(Exception):
            self.stop_workload(timeout_s=5.0, drain=False)
        for broker in self.brokers.values():
            with contextlib.suppress(Exception):
                broker.resume()
                broker.kill()
        for server in self.nameservers.values():
            with contextlib.suppress(Exception):
                server.resume()
                server.kill()
        with contextlib.suppress(Exception):
            self.net.destroy()
        for node in self.spec.small_disks:
            with contextlib.suppress(Exception):
                disk.unmount_small_disk(self.data_dir(node))

    def stop_brokers_cleanly(self) -> None:
        for broker in self.brokers.values():
            broker.resume()
            if broker.proc.poll() is None:
                broker.terminate(30.0)

    # --- the workload -------------------------------------------------------------------

    def start_workload(self, producers: Sequence[ProducerSpec],
                       consumers: Sequence[ConsumerSpec]) -> None:  # fmt: skip
        spec = WorkloadSpec(
            nameservers=self.nameserver_addresses, history=str(self.history.path),
            producers=list(producers), consumers=list(consumers),
        )  # fmt: skip
        spec_path = self.work_dir / "workload.json"
        spec_path.write_text(spec.dump())
        argv = ["env", python_path(), sys.executable, "-m", "chaoslib.workload", str(spec_path)]
        env = dict(os.environ)
        if self.credentials is not None:  # the clients read their user from these
            env[ACCESS_KEY_ENV] = self.credentials.access_key
            env[SECRET_KEY_ENV] = self.credentials.secret_key
        with (self.work_dir / "workload.log").open("wb") as log:
            self.workload = subprocess.Popen(
                self.net.command(CLIENT, argv), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env,
            )  # fmt: skip
        wait_until(lambda: self._workload_phase("started"), 60.0, "the workload started",
                   poll_s=POLL_S)  # fmt: skip

    def _workload_phase(self, phase: str) -> bool:
        if self.workload is not None and self.workload.poll() is not None and phase != "stopped":
            log = (self.work_dir / "workload.log").read_text(errors="replace")
            raise AssertionError(f"the workload exited early:\n{log[-4000:]}")
        self.tail.poll()
        return any(e.get("phase") == phase for e in self.tail.workload_events)

    def stop_workload(self, timeout_s: float = 240.0, *, drain: bool = True) -> None:
        """SIGTERM the workload: it stops producing, drains its consumers and exits."""
        process = self.workload
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM if drain else signal.SIGKILL)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError(f"the workload did not stop within {timeout_s} s") from None
        finally:
            self.workload = None
        if drain and process.returncode != 0:
            log = (self.work_dir / "workload.log").read_text(errors="replace")
            raise AssertionError(f"the workload failed ({process.returncode}):\n{log[-4000:]}")

    def release_held_consumers(self) -> None:
        """Held consumer groups start handling (SIGUSR1 to the workload)."""
        if self.workload is not None:
            self.workload.send_signal(signal.SIGUSR1)

    def wait_acked(self, group: str, count: int, timeout_s: float = 30.0, *,
                   since: float | None = None) -> None:  # fmt: skip
        """Until ``count`` sends to ``group`` were acknowledged (after ``since``)."""

        def enough() -> bool:
            if since is None:
                return self.tail.acked_in(group) >= count
            return self.tail.acked_since(group, since) >= count

        try:
            wait_until(enough, timeout_s, f"{count} sends acknowledged by group {group}",
                       poll_s=POLL_S)  # fmt: skip
        except AssertionError as exc:
            last = [e.get("error") or e.get("status") for e in self.tail.failures[-3:]]
            raise AssertionError(f"{exc}; last failures: {last}") from None

    # --- observing ----------------------------------------------------------------------

    def health(self, node: str) -> dict[str, Any] | None:
        broker = self.brokers.get(node)
        return broker.health(timeout_s=1.0) if broker is not None else None

    def members(self, group: str) -> list[str]:
        return [n for n in self.spec.brokers if group_of(n) == group]

    def masters(self, group: str) -> list[str]:
        found = []
        for node in self.members(group):
            state = self.health(node)
            if state is not None and state["role"] == "master":
                found.append(node)
        return found

    def wait_master(self, group: str, timeout_s: float = 30.0, *,
                    other_than: str | None = None) -> str:  # fmt: skip
        """The node that is the group's one master (waiting for there to be one)."""
        found: list[str] = []

        def one() -> bool:
            found[:] = [n for n in self.masters(group) if n != other_than]
            return len(found) == 1

        wait_until(
            one,
            timeout_s,
            f"group {group} has one master" + (f" other than {other_than}" if other_than else ""),
            poll_s=POLL_S,
        )
        return found[0]

    def wait_new_master(self, group: str, old: str, since: float,
                        timeout_s: float = 20.0) -> str:  # fmt: skip
        """Until a broker other than ``old`` is the group's master; records how long
        after ``since`` (the fault) the observer saw it."""
        new = self.wait_master(group, timeout_s, other_than=old)
        self.history.write("elected", group=group, node=new, replaces=old,
                           after_s=round(time.monotonic() - since, 3))  # fmt: skip
        return new

    def controller(self) -> pb.GetControllerStateResponse | None:
        """The controller's state from the first nameserver that answers, the leader first."""
        answers = []
        for node in NAMESERVERS:
            server = self.nameservers.get(node)
            if server is None or server.process.poll() is not None:
                continue
            with contextlib.suppress(grpc.RpcError, TimeoutError):
                answer = asyncio.run(controller_state(server.grpc_address))
                if answer.is_leader:
                    return answer
                answers.append(answer)
        return answers[0] if answers else None

    def committed(self, group: str) -> pb.GroupControl | None:
        state = self.controller()
        if state is None:
            return None
        return next((g for g in state.groups if g.broker_name == broker_name(group)), None)

    def wait_in_sync(self, group: str, timeout_s: float = 40.0) -> None:
        """Until the group's master and the controller both have every member in sync."""
        ids = sorted(broker_id(n) for n in self.members(group))

        def in_sync() -> bool:
            masters = self.masters(group)
            if len(masters) != 1:
                return False
            state = self.health(masters[0])
            control = self.committed(group)
            return (state is not None and sorted(state["in_sync_ids"]) == ids
                    and control is not None and sorted(control.in_sync_ids) == ids)  # fmt: skip

        wait_until(in_sync, timeout_s, f"group {group} has {ids} in sync", poll_s=0.1)

    def wait_caught_up(self, node: str, timeout_s: float = 40.0) -> None:
        group = group_of(node)

        def caught_up() -> bool:
            masters = self.masters(group)
            if len(masters) != 1 or masters[0] == node:
                return False
            master, slave = self.health(masters[0]), self.health(node)
            return (
                master is not None
                and slave is not None
                and slave["commitlog_write_offset"] == master["commitlog_write_offset"]
            )

        wait_until(caught_up, timeout_s, f"{node} caught up with its master", poll_s=0.1)

    # --- faults (each one recorded) -------------------------------------------------------

    def fault(self, phase: str, fault: str, **fields: Any) -> float:
        event = self.history.write("fault", phase=phase, fault=fault, **fields)
        t: float = event["t"]
        return t

    # A fault is recorded once it is in place (the process is dead or stopped), so
    # anything invoked after the event certainly met the fault.

    def kill(self, node: str, *, failover: bool = False) -> float:
        self.brokers[node].kill()
        return self.fault("start", "kill", node=node, group=group_of(node), failover=failover)

    def restart(self, node: str, fault: str = "kill") -> float:
        self.start_broker(node)
        return self.fault("end", fault, node=node, group=group_of(node))

    def pause(self, node: str, *, failover: bool = False) -> float:
        self.brokers[node].pause()
        wait_until(lambda: _stopped(self.brokers[node].proc.pid), 5.0, f"{node} is stopped")
        return self.fault("start", "pause", node=node, group=group_of(node), failover=failover)

    def resume(self, node: str) -> float:
        self.brokers[node].resume()
        return self.fault("end", "pause", node=node, group=group_of(node))

    def partition(self, side: set[str], other: set[str], *, node: str = "", group: str = "",
                  failover: bool = False, fault: str = "partition") -> float:  # fmt: skip
        """Cut every link between ``side`` and ``other``."""
        self.net.partition(side, other)
        return self.fault("start", fault, node=node, group=group, failover=failover,
                          detail=f"{sorted(side)} cut from {sorted(other)}")  # fmt: skip

    def heal(self, *, node: str = "", group: str = "", fault: str = "partition") -> float:
        self.net.heal()
        return self.fault("end", fault, node=node, group=group)

    def power_loss(self, node: str, *, failover: bool = False) -> float:
        """kill -9 and drop what the node never synced (needs ``spec.lossy``)."""
        assert self.spec.lossy, "power loss needs brokers started under chaoslib.lossy_broker"
        self.brokers[node].kill()
        t = self.fault("start", "power-loss", node=node, group=group_of(node), failover=failover)
        before = list(disk.scan(self.data_dir(node)))
        dropped = disk.drop_unsynced(self.data_dir(node))
        after = list(disk.scan(self.data_dir(node)))
        self.history.write("power-loss", node=node, bytes_zeroed=dropped,
                           records_before=len(before), records_after=len(after),
                           records_lost=len(before) - len(after))  # fmt: skip
        return t

    def record_stored(self, node: str, when: str) -> list[str]:
        """Write the ids a (stopped) broker's commitlog holds into the history."""
        ids = disk.stored_ids(self.data_dir(node), list(TOPICS))
        self.history.write("stored", node=node, group=group_of(node), when=when, ids=ids)
        return ids

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.history.write("check", name=name, ok=ok, detail=detail)
        return ok

    def check_prefixes(self) -> None:
        """Per group: every broker's commitlog is byte-identical to the master's."""
        for group in GROUPS:
            master = self.wait_master(group)
            for node in self.members(group):
                if node != master:
                    self.wait_caught_up(node)
            for node in self.members(group):
                if node == master:
                    continue
                # The workload still writes: compare what both hold, read after their
                # ends were (the slave's last, so the master holds at least as much).
                master_state, slave_state = self.health(master), self.health(node)
                assert master_state is not None and slave_state is not None
                end = min(master_state["commitlog_write_offset"],
                          slave_state["commitlog_write_offset"])  # fmt: skip
                reference = disk.commitlog_bytes(self.data_dir(master), end)
                copy = disk.commitlog_bytes(self.data_dir(node), end)
                same = copy == reference
                where = next((i for i, (x, y) in enumerate(zip(copy, reference, strict=False))
                              if x != y), min(len(copy), len(reference)))  # fmt: skip
                self.check(f"prefix-{group}-{node}", same,
                           f"{end} bytes identical to {master}" if same
                           else f"differs from {master} at byte {where} of {end}")  # fmt: skip


def _stopped(pid: int) -> bool:
    """Whether the process is in the stopped state (T) after SIGSTOP."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] in ("T", "t")


async def controller_state(address: str) -> pb.GetControllerStateResponse:
    # Signed as a cluster member, so that nameservers with users answer too.
    async with signed_channel(address) as channel:
        stub = control_pb2_grpc.NameServerStub(channel)
        response: pb.GetControllerStateResponse = await stub.GetControllerState(
            pb.GetControllerStateRequest(), timeout=2
        )
        return response


async def all_routed(nameservers: Sequence[str], credentials: Credentials | None = None) -> bool:
    for address in nameservers:
        async with RouteCache([address], rpc_timeout_s=2.0, credentials=credentials) as routes:
            for topic in TOPICS:
                try:
                    route = await routes.route(topic, refresh=True)
                except Exception:
                    return False
                if len(route.write_queues) != QUEUES:
                    return False
    return True
