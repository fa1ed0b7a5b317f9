"""The broker process: wires the store, the data plane, HTTP and the services, and starts
and stops them in order.

Start: topics and offsets from the data directory; bind the data port (so the real port
is known); open the store (recovery); HTTP; background services; nameserver
registration; only then accept data-plane connections and print the readiness line::

    metaq-broker ready data=HOST:PORT http=HOST:PORT

Stop (SIGTERM / SIGINT): leave the nameservers, stop accepting, refuse new sends, answer
parked long polls, wait (bounded by ``shutdown_grace_ms``) for sends still waiting on
their fsync, close connections after their answers are written, stop HTTP, write the
last offset snapshot, and close the store (flush, checkpoint, remove the abort marker).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import struct
import time
from collections.abc import Callable
from typing import Any, Protocol

from metaq.broker.config import BrokerConfig
from metaq.broker.connection import Handler
from metaq.broker.consumers import ConsumerExpiryService, ConsumerGroups
from metaq.broker.delay import DelayScheduler, DelayService
from metaq.broker.handlers import Handlers
from metaq.broker.http import HttpContext, HttpServer
from metaq.broker.idle_poll import IdlePoll
from metaq.broker.journal import Journal, JournalService
from metaq.broker.limits import DescriptorBudget, raise_nofile_limit
from metaq.broker.live_settings import LiveSettings, set_log_level
from metaq.broker.member_notices import MemberChangeNotices
from metaq.broker.metrics import BrokerMetrics, MetricSources
from metaq.broker.offset_forward import OffsetForwarder
from metaq.broker.offsets import ConsumerOffsets, OffsetSnapshotService
from metaq.broker.producers import ProducerConnections
from metaq.broker.pull import PullHandler
from metaq.broker.role import GroupRole, open_group_role
from metaq.broker.send import SendHandler
from metaq.broker.server import ConnectionLimits, DataServer
from metaq.broker.stats import StatsWindow
from metaq.broker.store import MessageStore
from metaq.broker.store.flush import AsyncDurability
from metaq.broker.topics import TopicTable
from metaq.broker.transactions import Transactions, TransactionService
from metaq.broker.user_auth import UserGate, denied_counter
from metaq.common.acl_source import AclReloader, AclSource, open_source
from metaq.common.auth import ClusterSecret, load_secret, require_secret
from metaq.common.framing import FrameType
from metaq.common.http_auth import HttpAuth, SignedRequests
from metaq.common.metrics import certificate_expiry
from metaq.common.scrape_auth import load_scrape_credentials
from metaq.common.server_names import ServerNames, is_loopback
from metaq.common.service import PeriodicService

log = logging.getLogger(__name__)

READY_PREFIX = "metaq-broker ready"


class Registrar(Protocol):
    """Keeps the broker registered with the nameservers (``metaq.broker.registration``)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


RegistrarFactory = Callable[["Broker"], Registrar]


def cluster_secret(config: BrokerConfig) -> ClusterSecret | None:
    """The cluster secret, refusing (SecretError) to listen beyond loopback without one."""
    reasons = []
    if not is_loopback(config.listen_host):
        reasons.append(f"listen_host {config.listen_host!r} is not a loopback address")
    return require_secret(load_secret(config.cluster_secret_file), "the broker", reasons)


def store_host(host: str, port: int) -> bytes:
    """The 8-byte store host stamped into records: IPv4 address, port (u16 LE), reserved."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    packed = address.packed if isinstance(address, ipaddress.IPv4Address) else bytes(4)
    return packed + struct.pack("<HH", port, 0)


class Broker:
    """One broker: everything a ``metaq-broker`` process runs, minus signals and logging."""

    def __init__(
        self, config: BrokerConfig, *, registrar_factory: RegistrarFactory | None = None
    ) -> None:
        self.settings = LiveSettings(config.data_dir)
        config = self.settings.laid_over(config)
        if "log_level" in self.settings.overrides:
            set_log_level(config.log_level)
        self.config = config
        self.started_monotonic = time.monotonic()
        self.data_address = ""
        self.http_address = ""
        self.metrics = BrokerMetrics()
        self.groups = ConsumerGroups(config.consumer_heartbeat_timeout_s)
        self.producers = ProducerConnections()
        self.topics: TopicTable | None = None
        self.offsets: ConsumerOffsets | None = None
        self.store: MessageStore | None = None
        self.group_role: GroupRole | None = None
        self.member_notices: MemberChangeNotices | None = None
        self.delays: DelayScheduler | None = None
        self.transactions: Transactions | None = None
        self.registrar: Registrar | None = None
        self.secret: ClusterSecret | None = None
        self.acl: AclSource | None = None
        self.user_gate: UserGate | None = None
        self._registrar_factory = registrar_factory
        self._handlers: dict[FrameType, Handler] = {}
        self._data: DataServer | None = None
        self._http: HttpServer | None = None
        self._durability: AsyncDurability | None = None
        self._send: SendHandler | None = None
        self._pull: PullHandler | None = None
        self._services: list[PeriodicService] = []
        self._stopping = False

    async def start(self) -> None:
        config = self.config
        self.secret = cluster_secret(config)  # before anything listens
        scrape = load_scrape_credentials(
            config.metrics_auth, config.metrics_auth_file, config.metrics_auth_user
        )
        self.acl = open_source(
            config.auth_enabled, config.auth_acl_file, "the broker", self.secret is not None
        )
        user_gate = self.user_gate = UserGate(
            self.acl,
            lambda c: self.group_role is not None and self.group_role.gate.proven(c),
            denied_counter(self.metrics.registry),
        )
        # Every TLS file is read now: a bad one stops the start with its reason.
        tls = config.tls
        serve_tls = tls.server_context() if tls is not None else None
        dial_tls = tls.client_context() if tls is not None else None
        certificate_expiry(self.metrics.registry, tls)
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.topics = TopicTable(
            config.data_dir,
            auto_create=config.auto_create_topics,
            default_queue_count=config.default_queue_count,
        )
        self.offsets = ConsumerOffsets(config.data_dir, max_groups=config.max_consumer_groups)
        self.offsets.on_acknowledged = self.metrics.acknowledged
        # The handler table is filled in once the store is open; nothing is served before.
        idle_poll = IdlePoll(config.idle_poll_us, self.metrics.idle_polled.inc)
        limits = ConnectionLimits(
            max_connections=config.max_connections,
            idle_timeout_s=config.idle_timeout_s,
            handshake_timeout_s=config.handshake_timeout_s,
            max_connections_per_address=config.max_connections_per_address,
            max_buffered_request_bytes=config.max_buffered_request_bytes,
            max_connection_write_bytes=config.max_connection_write_bytes,
            small_request_reserve_bytes=config.small_request_reserve_bytes,
            small_request_max_bytes=config.small_request_max_bytes,
            min_request_bytes_per_s=config.min_request_bytes_per_s,
            request_arrival_window_s=config.request_arrival_window_s,
            max_connection_inflight_requests=config.max_connection_inflight_requests,
        )
        descriptors = DescriptorBudget(
            nofile=raise_nofile_limit(),
            fd_reserve=config.fd_reserve,
        )
        self._data = DataServer(
            self._handlers,
            config.max_frame_bytes,
            self.metrics,
            self._connection_lost,
            idle_poll,
            limits,
            user_gate,
            descriptors,
        )
        host, port = await self._data.bind(config.listen_host, config.data_port, serve_tls)
        self.data_address = f"{host}:{port}"

        store_config = dataclasses.replace(
            config.store,
            store_host=store_host(host, port),
            keep_damaged_records=config.controlled,
        )
        self.store = MessageStore(store_config)
        self.store.flusher.observe_fsync = self.metrics.fsync_latency.latency.observe
        report = self.store.start()
        idle_poll.busy = self.store.background_busy
        log.info(
            "store open: crashed=%s end=%d redispatched=%d (%.1f ms, %s)",
            report.crashed,
            report.commitlog_end,
            report.redispatched_records,
            report.seconds * 1000,
            report.tail_reason,
        )
        loop = asyncio.get_running_loop()
        self._durability = AsyncDurability(loop, self.store.flusher)
        self.group_role = open_group_role(
            config,
            self.store,
            self._durability,
            self.secret,
            data_address=self.data_address,
            dial_tls=dial_tls,
        )
        role = self.group_role
        journal = Journal(self.store, self.topics, self.offsets, lambda: role.takes_writes)
        journal.apply()  # commits journaled after the last offsets snapshot
        offsets = self.offsets
        # Retention under disk pressure deletes only what every group, and the broker's
        # own journal readers, have consumed.
        self.store.consumed_floors = lambda: {
            **offsets.consumed_floors(),
            **journal.consumed_floors(),
        }
        role.journal = journal
        self.delays = DelayScheduler(self.store, lambda: role.takes_writes)
        self.transactions = Transactions(
            self.store,
            lambda: role.takes_writes,
            check_after_ms=config.txn_check_after_ms,
            check_interval_ms=config.txn_check_interval_ms,
            max_checks=config.txn_max_checks,
        )
        self.topics.listeners.append(journal.topic_changed)
        self._send = SendHandler(
            config, self.store, self.topics, self.metrics, self._durability, self.group_role,
            self.transactions,
        )  # fmt: skip
        self._pull = PullHandler(
            config, self.store, self.topics, self.offsets, self.metrics, self.group_role,
            self.groups,
        )  # fmt: skip
        self.store.dispatcher.listeners.append(self._pull.long_polls.on_dispatch)
        forwarder = OffsetForwarder(self.offsets, role, config.journal_interval_ms / 1e3)
        self.member_notices = MemberChangeNotices(self.groups)
        handlers = Handlers(
            self.store, self.topics, self.offsets, self.groups, self._send, self._pull,
            self.group_role, journal, self.transactions, forwarder, self.member_notices,
            self.producers,
        )  # fmt: skip
        self._handlers.update(handlers.table())
        self._handlers[FrameType.AUTH] = user_gate.handle
        pull = self._pull
        notices = self.member_notices
        data = self._data
        self.metrics.watch(
            MetricSources(
                self.store,
                self.offsets,
                self.groups,
                lambda: pull.long_polls.parked,
                lambda: pull.long_polls.woken,
                self.started_monotonic,
                self.group_role,
                self.delays,
                self.transactions,
                lambda: notices.sent,
                self._data.refusal,
                lambda: data.room,
            )
        )

        signed = SignedRequests(ServerNames(config.http_names), self.secret, self.acl)
        stats = StatsWindow(self.metrics.totals)
        self._http = HttpServer(
            HttpContext(
                config.broker_name,
                self.group_role,
                self.store,
                self.topics,
                self.offsets,
                self.groups,
                self.metrics,
                self.started_monotonic,
                lambda: self._stopping,
                signed,
                HttpAuth(signed, user_gate.count) if self.acl is not None else None,
                self._data.refusal,
                scrape=scrape,
                count=user_gate.count,
                producers=self.producers,
                settings=self.settings,
                config=lambda: self.config,
                reconfigure=self._reconfigure,
                stats=stats,
                scheduled=self._scheduled,
            )
        )
        http_host, http_port = await self._http.start(
            config.listen_host, config.http_port, serve_tls
        )
        self.http_address = f"{http_host}:{http_port}"

        self._services = [
            OffsetSnapshotService(self.offsets, config.offset_snapshot_interval_ms / 1e3),
            ConsumerExpiryService(self.groups),
            JournalService(journal, config.journal_interval_ms / 1e3),
            forwarder,
            DelayService(self.delays),
            TransactionService(self.transactions),
            stats,
        ]
        if self.acl is not None:
            self._services.append(AclReloader(self.acl))
        for service in self._services:
            service.start()

        await self.group_role.start()
        # Registered before accepting: the listening socket is bound, so a client routed
        # here early waits in the backlog rather than being refused.
        if self._registrar_factory is not None:
            self.registrar = self._registrar_factory(self)
            await self.registrar.start()

        await self._data.serve()
        log.info("%s data=%s http=%s", READY_PREFIX, self.data_address, self.http_address)

    @property
    def ready_line(self) -> str:
        return f"{READY_PREFIX} data={self.data_address} http={self.http_address}"

    def _reconfigure(self, config: BrokerConfig) -> None:
        """Put a live setting change into effect (see metaq.broker.live_settings)."""
        assert self.store is not None and self._pull is not None
        store = dataclasses.replace(
            config.store,
            store_host=self.store.config.store_host,
            keep_damaged_records=self.store.config.keep_damaged_records,
        )
        self.store.reconfigure(store)
        self._pull.cold_reads.set_budget(config.cold_read_bytes_per_s)
        set_log_level(config.log_level)
        self.config = dataclasses.replace(config, store=store)

    def _connection_lost(self, connection_id: int) -> None:
        self.groups.drop_connection(connection_id)
        self.producers.connection_lost(connection_id)
        if self.member_notices is not None:
            self.member_notices.connection_lost(connection_id)
        if self.user_gate is not None:
            self.user_gate.connection_lost(connection_id)
        if self.group_role is not None:
            self.group_role.gate.connection_lost(connection_id)
        if self.transactions is not None:
            self.transactions.connection_lost(connection_id)
        if self._pull is not None:
            self._pull.long_polls.drop_connection(connection_id)

    def _scheduled(self) -> dict[str, Any]:
        """What waits on this broker: delayed messages per tier of the timer wheel, and
        half messages waiting for their producer's verdict (none on a slave)."""
        delays, transactions = self.delays, self.transactions
        delayed = None
        if delays is not None:
            delayed = {
                "pending": delays.pending(),
                "next_due_ms": delays.next_due_ms(),
                "tiers": [dataclasses.asdict(t) for t in delays.tiers()],
            }
        return {
            "delayed": delayed,
            "transactions": transactions.summary() if transactions is not None else None,
        }

    async def stop(self) -> None:
        """Shut down cleanly; safe after a failed or partial start, and idempotent."""
        if self._stopping:
            return
        self._stopping = True
        grace_s = self.config.shutdown_grace_ms / 1e3
        if self.registrar is not None:
            try:
                await asyncio.wait_for(self.registrar.stop(), grace_s)
            except Exception:
                log.exception("leaving the nameservers failed; they will time this broker out")
        if self._data is not None:
            self._data.stop_accepting()
        if self._send is not None:
            self._send.draining = True
            if self._send.inflight:
                _, late = await asyncio.wait(list(self._send.inflight), timeout=grace_s)
                if late:
                    log.warning("%d sends still waiting for their fsync at shutdown", len(late))
                    for task in late:
                        task.cancel()
        if self.group_role is not None:
            await self.group_role.stop()
        if self._pull is not None:
            self._pull.draining = True
            released = self._pull.long_polls.release_all()
            if released:
                log.info("answered %d parked long polls", released)
            self._pull.cold_reads.close()
        if self._data is not None:
            await self._data.close_connections(grace_s)
        if self.member_notices is not None:
            self.member_notices.close()
        if self._http is not None:
            await self._http.stop()
        for service in reversed(self._services):
            await service.stop()
        if self.store is not None:
            if self._pull is not None:
                self.store.dispatcher.listeners.remove(self._pull.long_polls.on_dispatch)
            if self._durability is not None:
                self._durability.close()
            self.store.close()
        log.info("metaq-broker stopped")
