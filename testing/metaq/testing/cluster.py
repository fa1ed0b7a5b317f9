"""The one way tests and benchmarks start a real metaq cluster: nameservers × broker
groups × replicas, optionally with users (auth) and TLS on every listener, as processes
on free ports with their data in a temporary directory.

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
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Final

from metaq.client.admin import Admin, TopicSettings
from metaq.client.errors import UnknownTopic
from metaq.client.routes import RouteCache
from metaq.common import acl
from metaq.common.acl import Acl, Grant, User
from metaq.common.model import TopicRoute
from metaq.common.tls import TlsConfig
from metaq.common.users import Credentials, Verifier
from metaq.testing.broker_process import BrokerProcess
from metaq.testing.certs import Pki, make_pki
from metaq.testing.nameserver_process import (
    NameServerProcess,
    start_controller_group,
    start_nameserver,
)
from metaq.testing.waiting import deadline, wait_until

ADMIN: Final = Credentials("test-admin", "test-admin-secret-key-never-use-elsewhere")
"""The user a cluster with ``auth`` and no ACL of the test's own grants cluster admin."""


@dataclass(frozen=True)
class ClusterBuilder:
    """What to start; :meth:`start` starts it under a directory.

    ``replicas`` 1 starts each group's broker as its deployed master (no ``--broker-id``);
    more start ids 0..replicas-1 and let the controller pick the master.
    ``replication_mode`` and ``min_in_sync`` set the brokers' settings of those names.
    ``auth`` turns users on everywhere with ``acl_file`` (or one granting :data:`ADMIN`
    cluster admin); ``admin`` is who creates topics then. ``tls`` makes a throwaway CA
    and serves TLS on every listener (``verify_client``: servers ask for a certificate).
    ``nameserver_args``, ``broker_args`` and ``group_args[group]`` go to the processes
    last, so they win over what the builder sets.
    """

    nameservers: int = 1
    groups: Sequence[str] = ("broker-a",)
    replicas: int = 1
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

    def start(self, work_dir: Path) -> Cluster:
        work_dir.mkdir(parents=True, exist_ok=True)
        pki = make_pki(work_dir / "pki") if self.tls else None
        cluster = Cluster(self, work_dir, pki=pki)
        try:
            cluster.acl_file = self._acl(work_dir)
            cluster.admin = self.admin or (ADMIN if self.auth else None)
            cluster.nameservers = self._start_nameservers(work_dir, cluster)
            for group in self.groups:
                for broker_id in self.broker_ids:
                    cluster.start_broker(group, broker_id)
            if self.replicas > 1:
                for group in self.groups:
                    cluster.master_id(group, self.ready_timeout_s)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    @property
    def broker_ids(self) -> range:
        return range(self.replicas)

    def _acl(self, work_dir: Path) -> Path | None:
        if not self.auth:
            return None
        if self.acl_file is not None:
            return self.acl_file
        path = work_dir / "acl.json"
        user = User(ADMIN.access_key, Verifier.make(ADMIN.access_key, ADMIN.secret_key))
        acl.save(path, Acl().with_user(user).grant(user.access_key, Grant("admin", "cluster")))
        return path

    def _start_nameservers(self, work_dir: Path, cluster: Cluster) -> list[NameServerProcess]:
        args: list[str] = []
        if cluster.acl_file is not None:
            args += ["--auth-enabled", "true", "--auth-acl-file", str(cluster.acl_file)]
        if cluster.pki is not None:
            args += cluster.pki.server_flags(verify_client=self.verify_client)
        args += self.nameserver_args
        timeout_s = self.ready_timeout_s
        if self.nameservers == 1:
            return [start_nameserver(work_dir / "ns0", *args, timeout_s=timeout_s)]
        return start_controller_group(work_dir, self.nameservers, *args, timeout_s=timeout_s)

    def broker_flags(self, cluster: Cluster, group: str, broker_id: int) -> list[str]:
        """Every flag a broker of ``group`` starts with."""
        flags = ["--broker-name", group]
        if self.replicas > 1:
            flags += ["--broker-id", str(broker_id)]
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
        return [*flags, *self.broker_args, *self.group_args.get(group, ())]


@dataclass
class Cluster:
    """A started cluster; brokers by (group, broker id)."""

    builder: ClusterBuilder
    work_dir: Path
    nameservers: list[NameServerProcess] = field(default_factory=list)
    brokers: dict[tuple[str, int], BrokerProcess] = field(default_factory=dict)
    pki: Pki | None = None
    acl_file: Path | None = None
    admin: Credentials | None = None
    """Who creates topics (None: the cluster has no users)."""

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

    def broker(self, group: str, broker_id: int = 0) -> BrokerProcess:
        return self.brokers[(group, broker_id)]

    def data_address(self, group: str, broker_id: int = 0) -> str:
        broker = self.broker(group, broker_id)
        return f"{broker.data_host}:{broker.data_port}"

    def data_dir(self, group: str, broker_id: int = 0) -> Path:
        """Where the broker keeps its data: the same across restarts, as on a machine."""
        return self.work_dir / f"{group}-{broker_id}"

    def start_broker(self, group: str, broker_id: int = 0, *extra: str) -> BrokerProcess:
        """Start (or restart, on its data) a broker of ``group`` with the builder's flags
        and ``extra`` after them."""
        broker = BrokerProcess.start(
            self.data_dir(group, broker_id),
            *self.builder.broker_flags(self, group, broker_id),
            *extra,
            small_store=self.builder.small_store,
            ready_timeout_s=self.builder.ready_timeout_s,
            tls=self.tls,
        )
        self.brokers[(group, broker_id)] = broker
        return broker

    def master_id(
        self, group: str, timeout_s: float = 15.0, *, other_than: int | None = None
    ) -> int:
        """The id of the broker of ``group`` that takes writes (waiting for exactly one)."""
        found: list[int] = []

        def one_master() -> bool:
            found.clear()
            for (name, broker_id), broker in self.brokers.items():
                if name != group or broker_id == other_than:
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

        wait_until(in_sync, timeout_s, f"the master of {group} has {sorted(ids)} in sync")

    async def create_topic(
        self,
        topic: str,
        *,
        queues: int = 4,
        groups: Sequence[str] | None = None,
        timeout_s: float = 15.0,
    ) -> TopicRoute:
        """Create ``topic`` with ``queues`` queues on each group's master (every group by
        default) and return once every nameserver routes it there with that many."""
        names = list(groups or self.builder.groups)
        settings = TopicSettings(read_queues=queues, write_queues=queues)
        async with Admin(credentials=self.admin, tls=self.tls) as admin:
            for name in names:
                await admin.put_topic(self.master(name).http_url, topic, settings)
        route: TopicRoute | None = None
        for address in self.nameserver_addresses:
            route = await self._wait_routed(address, topic, names, queues, timeout_s)
        assert route is not None
        return route

    async def _wait_routed(
        self, address: str, topic: str, names: Sequence[str], queues: int, timeout_s: float
    ) -> TopicRoute:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + deadline(timeout_s)
        async with RouteCache([address], credentials=self.admin, tls=self.tls) as routes:
            while True:
                with contextlib.suppress(UnknownTopic):
                    route = await routes.route(topic, refresh=True)
                    counts = {g.broker_name: g.read_queues for g in route.groups}
                    if all(counts.get(n) == queues for n in names):
                        return route
                if loop.time() > give_up:
                    raise AssertionError(f"nameserver {address} did not route {topic} to {names}")
                await asyncio.sleep(0.02)  # poll interval of a deadline-bound wait

    async def pulled(self, topic: str) -> int:
        """Messages of ``topic`` the brokers have returned to pulls (their metrics)."""
        total = 0.0
        async with Admin(credentials=self.admin, tls=self.tls) as admin:
            for broker in self.brokers.values():
                for (name, labels), value in (await admin.metrics(broker.http_url)).items():
                    if name == "metaq_messages_out_total" and ("topic", topic) in labels:
                        total += value
        return int(total)

    def stop(self) -> None:
        """Kill every broker, then stop every nameserver; paused ones are resumed first."""
        for broker in self.brokers.values():
            broker.resume()
            broker.kill()
        for nameserver in self.nameservers:
            nameserver.stop()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
