"""The one way tests, benchmarks and the chaos suite start a real metaq cluster:
nameservers × broker groups × replicas, optionally with users (auth) and TLS on every
listener, as processes on free ports (or each on a host of its own, :class:`Hosts`) with
their data in a directory.

    with ClusterBuilder(groups=("broker-a", "broker-b")).start(tmp_path) as cluster:
        await cluster.create_topic("orders")
        ... cluster.nameserver_addresses, cluster.broker("broker-a").data_port ...

``start`` returns once every process is ready and every group has one master; when any
step fails, what was started is stopped before the error propagates, and leaving the
``with`` block stops everything (brokers first, a paused process resumed first). The
``cluster_factory`` fixture of this plugin does the same at the end of a test.
"""

from __future__ import annotations

import asyncio
import functools
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Final, Protocol

from metaq.client.admin import Admin, TopicSettings
from metaq.common import acl
from metaq.common.acl import Acl, Grant, User
from metaq.common.model import TopicRoute
from metaq.common.tls import TlsConfig
from metaq.common.users import Credentials, Verifier
from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1 import control_pb2_grpc
from metaq.testing.broker_process import BrokerProcess, broker_command
from metaq.testing.certs import Pki, make_pki
from metaq.testing.nameserver_process import (
    NameServerProcess,
    controller_flags,
    free_ports,
    nameserver_command,
    signed_channel,
    spawn_nameserver,
    wait_nameserver_ready,
)
from metaq.testing.waiting import deadline, wait_until

ADMIN: Final = Credentials("test-admin", "test-admin-secret-key-never-use-elsewhere")
"""The user a cluster with ``auth`` and no ``admin`` of the test's own grants cluster admin."""

GRPC_PORT, RAFT_PORT, DATA_PORT, HTTP_PORT = 9876, 9877, 10911, 10912
"""The ports every process takes on a host of its own (the deployed defaults)."""


class Hosts(Protocol):
    """Where each process runs when every one has a host of its own (a network namespace,
    say), named as the builder names them: ``ns0``, ``ns1``, … and ``<group>-<broker id>``."""

    def address(self, node: str) -> str:
        """The host's address, which the process listens on."""
        ...

    def command(self, node: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run on the host; it must exec ``argv`` so that signals reach it."""
        ...


@dataclass(frozen=True)
class ClusterBuilder:
    """What to start; :meth:`start` starts it under a directory.

    ``replicas`` 1 starts each group's broker as its deployed master (no ``--broker-id``);
    more start ids 0..replicas-1 and let the controller pick the master.
    ``group_replicas[group]`` overrides ``replicas`` for one group.
    ``replication_mode`` and ``min_in_sync`` set the brokers' settings of those names.
    ``auth`` turns users on everywhere with ``acl_file`` (or one granting ``admin``, by
    default :data:`ADMIN`, cluster admin); ``admin`` is who creates topics. ``tls`` makes
    a throwaway CA and serves TLS on every listener (``verify_client``: servers ask for a
    certificate). ``nameserver_args``, ``broker_args``, ``group_args[group]`` and
    ``node_args[node]`` (one process, named as :class:`Hosts` names it) go to the
    processes last, in that order, so they win over what the builder sets. ``broker_command``
    replaces the installed ``metaq-broker`` (it must exec the broker). With ``hosts``
    every process runs on its own host, on the deployed ports; without, all run on
    loopback on free ports. ``health_headers`` go with every ``/health`` the builder and
    the tests ask a broker (the scrape credentials of brokers with ``metrics_auth``).
    ``echo`` runs the cluster in the foreground (``make run``): it is given the node's
    name and each line every process prints, as it prints it, and the processes run in
    sessions of their own, so the terminal's Ctrl-C reaches the caller alone, which
    stops them in order (:meth:`Cluster.terminate`).
    """

    nameservers: int = 1
    groups: Sequence[str] = ("broker-a",)
    replicas: int = 1
    group_replicas: Mapping[str, int] = field(default_factory=dict)
    replication_mode: str | None = None
    min_in_sync: int | None = None
    auth: bool = False
    acl_file: Path | None = None
    admin: Credentials | None = None
    tls: bool = False
    verify_client: bool = False
    small_store: bool = True
    ready_timeout_s: float = 30.0
    nameserver_args: Sequence[str] = ()
    broker_args: Sequence[str] = ()
    group_args: Mapping[str, Sequence[str]] = field(default_factory=dict)
    node_args: Mapping[str, Sequence[str]] = field(default_factory=dict)
    broker_command: Sequence[str] | None = None
    hosts: Hosts | None = None
    health_headers: Mapping[str, str] = field(default_factory=dict)
    echo: Callable[[str, str], None] | None = None

    def start(self, work_dir: Path) -> Cluster:
        """Start the cluster under ``work_dir`` (see :meth:`Cluster.start`)."""
        return Cluster(self, work_dir).start()

    def echo_of(self, node: str) -> Callable[[str], None] | None:
        """What ``node``'s lines go to (None: kept for the tests only)."""
        return None if self.echo is None else functools.partial(self.echo, node)

    def replicas_of(self, group: str) -> int:
        return self.group_replicas.get(group, self.replicas)

    def broker_flags(self, cluster: Cluster, group: str, broker_id: int) -> list[str]:
        """Every flag a broker of ``group`` starts with."""
        flags = ["--broker-name", group]
        if self.replicas_of(group) > 1 or broker_id != 0:
            flags += ["--broker-id", str(broker_id)]
        if self.hosts is not None:
            host = self.hosts.address(broker_node(group, broker_id))
            flags += ["--listen-host", host, "--data-port", str(DATA_PORT)]
            flags += ["--http-port", str(HTTP_PORT)]
        for address in cluster.nameserver_addresses:
            flags += ["--nameserver", address]
        if self.replication_mode is not None:
            flags += ["--set", f"replication_mode={self.replication_mode}"]
        if self.min_in_sync is not None:
            flags += ["--set", f"min_in_sync_replicas={self.min_in_sync}"]
        if cluster.acl_file is not None:
            flags += ["--set", "auth_enabled=true", "--set", f"auth_acl_file={cluster.acl_file}"]
        if cluster.pki is not None:
            flags += cluster.pki.server_flags(verify_client=self.verify_client)
        own = self.node_args.get(broker_node(group, broker_id), ())
        return [*flags, *self.broker_args, *self.group_args.get(group, ()), *own]

    def nameserver_flags(self, cluster: Cluster) -> list[list[str]]:
        """Every flag each nameserver starts with, by index."""
        hosts = self.hosts
        count = self.nameservers
        nodes = [nameserver_node(index) for index in range(count)]
        if hosts is not None:
            flags = [["--listen-host", hosts.address(n), "--grpc-port", str(GRPC_PORT)]
                     for n in nodes]  # fmt: skip
        else:
            flags = [[] for _ in nodes]
        if count > 1:
            if hosts is not None:
                raft = [f"{hosts.address(n)}:{RAFT_PORT}" for n in nodes]
            else:
                raft = [f"127.0.0.1:{port}" for port in free_ports(count)]
            for own, controller in zip(flags, controller_flags(raft), strict=True):
                own += controller
        common: list[str] = []
        if cluster.acl_file is not None:
            common += ["--auth-enabled", "true", "--auth-acl-file", str(cluster.acl_file)]
        if cluster.pki is not None:
            common += cluster.pki.server_flags(verify_client=self.verify_client)
        return [
            [*own, *common, *self.nameserver_args, *self.node_args.get(node, ())]
            for node, own in zip(nodes, flags, strict=True)
        ]

    def acl(self, work_dir: Path) -> Path | None:
        """The ACL the servers load: ``acl_file``, else one granting the admin cluster
        admin, written under ``work_dir``; None without ``auth``."""
        if not self.auth:
            return None
        if self.acl_file is not None:
            return self.acl_file
        admin = self.admin or ADMIN
        path = work_dir / "acl.json"
        user = User(admin.access_key, Verifier.make(admin.access_key, admin.secret_key))
        acl.save(path, Acl().with_user(user).grant(user.access_key, Grant("admin", "cluster")))
        return path


def nameserver_node(index: int) -> str:
    """The name of nameserver ``index`` in :class:`Hosts` and under the work directory."""
    return f"ns{index}"


def broker_node(group: str, broker_id: int) -> str:
    """The name of a broker in :class:`Hosts` and under the work directory."""
    return f"{group}-{broker_id}"


@dataclass
class Cluster:
    """A cluster: its nameservers by index, its brokers by (group, broker id)."""

    builder: ClusterBuilder
    work_dir: Path
    nameservers: list[NameServerProcess] = field(default_factory=list)
    brokers: dict[tuple[str, int], BrokerProcess] = field(default_factory=dict)
    pki: Pki | None = None
    acl_file: Path | None = None
    admin: Credentials | None = None
    """Who creates topics (None: the cluster has no users)."""
    outsiders: list[BrokerProcess] = field(default_factory=list)
    """Brokers started by :meth:`start_outsider`."""
    _nameserver_flags: list[list[str]] = field(default_factory=list)

    def start(self) -> Cluster:
        """Start every nameserver, then every broker, and wait until each group with
        replicas has one master; on any failure stop what was started and re-raise."""
        builder = self.builder
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.pki = make_pki(self.work_dir / "pki") if builder.tls else None
            self.acl_file = builder.acl(self.work_dir)
            self.admin = builder.admin or (ADMIN if builder.auth else None)
            self._nameserver_flags = builder.nameserver_flags(self)
            # Every nameserver's process at once, then the waits, and so for the brokers:
            # their start-ups (mostly imports, a core each) overlap instead of queueing.
            for server in [self.spawn_nameserver(i) for i in range(builder.nameservers)]:
                wait_nameserver_ready(server, builder.ready_timeout_s)
            spawned = [self.spawn_broker(group, broker_id)
                       for group in builder.groups
                       for broker_id in range(builder.replicas_of(group))]  # fmt: skip
            for broker in spawned:
                broker.wait_started(builder.ready_timeout_s)
            for group in builder.groups:
                if builder.replicas_of(group) > 1:
                    self.master_id(group, builder.ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def tls(self) -> TlsConfig | None:
        """How a client reaches the cluster (with a certificate, should servers ask)."""
        return None if self.pki is None else self.pki.client_tls(with_cert=True)

    @property
    def nameserver_addresses(self) -> list[str]:
        return [ns.grpc_address for ns in self.nameservers]

    @property
    def nameserver_list(self) -> str:
        """The addresses comma-separated, as ``METAQ_NAMESERVERS`` and Spark's option take them."""
        return ",".join(self.nameserver_addresses)

    def start_nameserver(self, index: int) -> NameServerProcess:
        """Start (or start again, on its directory and ports) nameserver ``index``."""
        server = self.spawn_nameserver(index)
        wait_nameserver_ready(server, self.builder.ready_timeout_s)
        return server

    def spawn_nameserver(self, index: int) -> NameServerProcess:
        """:meth:`start_nameserver` without the wait for it to be ready."""
        node = nameserver_node(index)
        hosts = self.builder.hosts
        flags = self._nameserver_flags[index]
        if index < len(self.nameservers) and hosts is None:
            # Back on its port, where the brokers and its peers look for it.
            flags = ["--grpc-port", str(self.nameservers[index].grpc_port), *flags]
        server = spawn_nameserver(
            self.work_dir / node,
            *flags,
            command=None if hosts is None else hosts.command(node, nameserver_command()),
            echo=self.builder.echo_of(node),
        )
        if index < len(self.nameservers):
            self.nameservers[index] = server
        else:
            self.nameservers.append(server)
        return server

    def broker(self, group: str, broker_id: int = 0) -> BrokerProcess:
        return self.brokers[(group, broker_id)]

    def brokers_of(self, group: str) -> dict[int, BrokerProcess]:
        """The brokers of ``group`` started so far, by id."""
        return {i: b for (name, i), b in self.brokers.items() if name == group}

    def group(self, name: str) -> Group:
        return Group(self, name)

    def data_address(self, group: str, broker_id: int = 0) -> str:
        broker = self.broker(group, broker_id)
        return f"{broker.data_host}:{broker.data_port}"

    def data_dir(self, group: str, broker_id: int = 0) -> Path:
        """Where the broker keeps its data: the same across restarts, as on a machine."""
        return self.work_dir / broker_node(group, broker_id)

    def start_broker(self, group: str, broker_id: int = 0, *extra: str) -> BrokerProcess:
        """Start (or restart, on its data) a broker of ``group`` with the builder's flags
        and ``extra`` after them."""
        broker = self.spawn_broker(group, broker_id, *extra)
        broker.wait_started(self.builder.ready_timeout_s)
        return broker

    def spawn_broker(self, group: str, broker_id: int = 0, *extra: str) -> BrokerProcess:
        """:meth:`start_broker` without the wait for it to be ready (and master)."""
        builder = self.builder
        command = builder.broker_command
        if builder.hosts is not None:
            node = broker_node(group, broker_id)
            command = builder.hosts.command(node, command or broker_command())
        broker = BrokerProcess.spawn(
            self.data_dir(group, broker_id),
            *builder.broker_flags(self, group, broker_id),
            *extra,
            small_store=builder.small_store,
            command=command,
            tls=self.tls,
            health_headers=builder.health_headers,
            echo=builder.echo_of(broker_node(group, broker_id)),
        )
        self.brokers[(group, broker_id)] = broker
        return broker

    def start_outsider(
        self, name: str, *flags: str, env: Mapping[str, str] | None = None
    ) -> BrokerProcess:
        """A broker that is no member of the cluster, pointed at its nameservers with
        ``flags`` and none of the builder's (an impostor taking a member's name, one
        without the cluster secret: ``env={ENV_VAR: ""}``), its data under ``name``.
        Ready, not waited on to be master; stopped with the cluster."""
        nameservers = [part for a in self.nameserver_addresses for part in ("--nameserver", a)]
        broker = BrokerProcess.start(
            self.work_dir / name,
            *nameservers,
            *flags,
            small_store=self.builder.small_store,
            ready_timeout_s=self.builder.ready_timeout_s,
            wait_for_master=False,
            env=env,
            tls=self.tls,
        )
        self.outsiders.append(broker)
        return broker

    def master_id(
        self, group: str, timeout_s: float = 15.0, *, other_than: int | None = None
    ) -> int:
        """The id of the broker of ``group`` that takes writes (waiting for exactly one)."""
        found: list[int] = []

        def one_master() -> bool:
            found.clear()
            for broker_id, broker in self.brokers_of(group).items():
                if broker_id == other_than:
                    continue
                state = broker.health()
                if state is not None and state["role"] == "master":
                    found.append(broker_id)
            return len(found) == 1

        wait_until(one_master, timeout_s, f"one broker of {group} is master", poll_s=0.05)
        return found[0]

    def master(self, group: str, timeout_s: float = 15.0) -> BrokerProcess:
        return self.broker(group, self.master_id(group, timeout_s))

    def wait_in_sync(self, group: str, ids: Sequence[int], timeout_s: float = 20.0) -> None:
        """Until the master of ``group`` has exactly ``ids`` in sync."""

        def in_sync() -> bool:
            state = self.master(group).health()
            return state is not None and sorted(state["in_sync_ids"]) == sorted(ids)

        wait_until(in_sync, timeout_s, f"the master of {group} has {sorted(ids)} in sync",
                   poll_s=0.05)  # fmt: skip

    def controller(self, index: int = 0) -> pb.GetControllerStateResponse:
        """Nameserver ``index``'s controller state, asked as a cluster member (signed with
        the cluster secret, so a cluster with users answers too)."""
        return asyncio.run(controller_state(self.nameserver_addresses[index], self.tls))

    def wait_committed_in_sync(
        self, group: str, ids: Sequence[int], timeout_s: float = 20.0
    ) -> None:
        """Until the controller agrees that ``ids`` of ``group`` are in sync (so any may be
        elected)."""

        def committed() -> bool:
            return any(g.broker_name == group and sorted(g.in_sync_ids) == sorted(ids)
                       for g in self.controller().groups)  # fmt: skip

        wait_until(committed, timeout_s, f"the controller has {sorted(ids)} of {group} in sync",
                   poll_s=0.05)  # fmt: skip

    def wait_caught_up(self, group: str, broker_id: int, timeout_s: float = 20.0) -> None:
        """Until broker ``broker_id`` of ``group`` holds as much log as its master."""

        def caught_up() -> bool:
            master = self.master(group).health()
            slave = self.broker(group, broker_id).health()
            return (
                master is not None
                and slave is not None
                and slave["commitlog_write_offset"] == master["commitlog_write_offset"]
            )

        wait_until(caught_up, timeout_s, f"broker {broker_id} of {group} caught up", poll_s=0.05)

    async def create_topic(
        self,
        topic: str,
        *,
        queues: int = 4,
        groups: Sequence[str] | None = None,
        ordered: bool = False,
        timeout_s: float = 15.0,
    ) -> TopicRoute:
        """Create ``topic`` with ``queues`` queues on each group's master (every group by
        default) and return once every nameserver routes it there with that many."""
        names = list(groups or self.builder.groups)
        settings = TopicSettings(read_queues=queues, write_queues=queues, ordered=ordered)
        async with Admin(credentials=self.admin, tls=self.tls) as admin:
            for name in names:
                master = await asyncio.to_thread(self.master, name)
                await admin.put_topic(master.http_url, topic, settings)
        route: TopicRoute | None = None
        for address in self.nameserver_addresses:
            async with Admin([address], credentials=self.admin, tls=self.tls) as admin:
                expected = dict.fromkeys(names, settings)
                route = await admin.wait_routed(topic, expected, deadline(timeout_s))
        assert route is not None
        return route

    async def pulled(self, topic: str) -> int:
        """Messages of ``topic`` the brokers have returned to pulls (their metrics)."""
        total = 0.0
        async with Admin(credentials=self.admin, tls=self.tls) as admin:
            for broker in self.brokers.values():
                for (name, labels), value in (await admin.metrics(broker.http_url)).items():
                    if name == "metaq_messages_out_total" and ("topic", topic) in labels:
                        total += value
        return int(total)

    def stop_group(self, group: str) -> None:
        """Kill the brokers of ``group`` and forget them (the rest of the cluster runs on)."""
        for broker_id, broker in self.brokers_of(group).items():
            broker.resume()
            broker.kill()
            del self.brokers[(group, broker_id)]

    def stop(self) -> None:
        """Kill every broker, then stop every nameserver; paused ones are resumed first."""
        for broker in [*self.brokers.values(), *self.outsiders]:
            broker.resume()
            broker.kill()
        for nameserver in self.nameservers:
            nameserver.stop()

    def exited(self) -> list[str]:
        """The nodes whose process has ended, nameservers first."""
        nameservers = [nameserver_node(index) for index, nameserver in enumerate(self.nameservers)
                       if nameserver.process.poll() is not None]  # fmt: skip
        brokers = [broker_node(group, broker_id)
                   for (group, broker_id), broker in self.brokers.items()
                   if broker.proc.poll() is not None]  # fmt: skip
        return [*nameservers, *brokers]

    def terminate(self, timeout_s: float = 30.0) -> dict[str, int]:
        """Stop every broker with SIGTERM, so each flushes and leaves the nameservers
        cleanly, then every nameserver; one still running ``timeout_s`` later is killed.
        The exit codes by node (a negative one: the signal that ended it)."""
        codes: dict[str, int] = {}
        for (group, broker_id), broker in self.brokers.items():
            broker.resume()
            try:
                code = broker.terminate(timeout_s)
            except subprocess.TimeoutExpired:
                code = broker.kill()
            codes[broker_node(group, broker_id)] = code
        for outsider in self.outsiders:
            outsider.resume()
            outsider.kill()
        for index, nameserver in enumerate(self.nameservers):
            codes[nameserver_node(index)] = nameserver.stop(timeout_s)
        return codes

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@dataclass(frozen=True)
class Group:
    """One broker group of a cluster, its brokers by id."""

    cluster: Cluster
    name: str

    @property
    def nameservers(self) -> list[NameServerProcess]:
        return self.cluster.nameservers

    @property
    def nameserver_addresses(self) -> list[str]:
        return self.cluster.nameserver_addresses

    @property
    def brokers(self) -> dict[int, BrokerProcess]:
        return self.cluster.brokers_of(self.name)

    def start_broker(self, broker_id: int, *extra: str) -> BrokerProcess:
        return self.cluster.start_broker(self.name, broker_id, *extra)

    def master(self, timeout_s: float = 15.0, *, other_than: int | None = None) -> int:
        """The id of the broker that takes writes (waiting for exactly one)."""
        return self.cluster.master_id(self.name, timeout_s, other_than=other_than)

    def wait_in_sync(self, ids: Sequence[int], timeout_s: float = 20.0) -> None:
        self.cluster.wait_in_sync(self.name, ids, timeout_s)

    def controller(self) -> pb.GetControllerStateResponse:
        return self.cluster.controller()

    def wait_committed_in_sync(self, ids: Sequence[int], timeout_s: float = 20.0) -> None:
        self.cluster.wait_committed_in_sync(self.name, ids, timeout_s)

    def wait_caught_up(self, broker_id: int, timeout_s: float = 20.0) -> None:
        self.cluster.wait_caught_up(self.name, broker_id, timeout_s)

    def stop(self) -> None:
        """Stop the whole cluster (the group's own nameservers too)."""
        self.cluster.stop()


async def controller_state(
    address: str, tls: TlsConfig | None = None
) -> pb.GetControllerStateResponse:
    """The controller state of the nameserver at ``address``, asked as a cluster member."""
    async with signed_channel(address, tls=tls) as channel:
        stub = control_pb2_grpc.NameServerStub(channel)
        response: pb.GetControllerStateResponse = await stub.GetControllerState(
            pb.GetControllerStateRequest(), timeout=5
        )
        return response
