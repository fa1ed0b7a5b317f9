"""The nameserver as a service: gRPC server, failover controller, HTTP endpoint, sweeper."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import grpc
from aiohttp import web

from metaq.common.acl_source import open_source
from metaq.common.auth import ClusterSecret, load_secret, require_secret
from metaq.common.http_auth import SignedRequests
from metaq.common.metrics import certificate_expiry
from metaq.common.scrape_auth import load_scrape_credentials
from metaq.common.server_names import ServerNames, is_loopback
from metaq.common.tls import GRPC_MESSAGE_OPTIONS
from metaq.common.v1 import control_pb2_grpc
from metaq.nameserver.cluster_acl import ClusterAcl
from metaq.nameserver.config import NameServerConfig
from metaq.nameserver.console import ConsoleContext
from metaq.nameserver.controller import Controller, ControllerSettings
from metaq.nameserver.http import make_app
from metaq.nameserver.metrics import NameServerMetrics
from metaq.nameserver.registry import Clock, Registry
from metaq.nameserver.service import NameServerService
from metaq.nameserver.sweeper import ExpirySweeper
from metaq.nameserver.undecodable import RejectUndecodable
from metaq.nameserver.user_auth import UserCalls

log = logging.getLogger(__name__)


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def cluster_secret(
    config: NameServerConfig, env: Mapping[str, str] | None = None
) -> ClusterSecret | None:
    """The cluster secret, refusing (SecretError) to go without one beyond a single host."""
    reasons = []
    if config.controller_peers:
        reasons.append("controller_peers is set (the Raft port would run whatever it is sent)")
    if not is_loopback(config.listen_host):
        reasons.append(f"listen_host {config.listen_host!r} is not a loopback address")
    return require_secret(load_secret(config.cluster_secret_file, env), "the nameserver", reasons)


class NameServer:
    """One nameserver: :meth:`start` binds and serves, :meth:`stop` lets calls finish and ends.

    ``grpc_address`` / ``http_address`` carry the bound ports once started (port 0 in the
    config picks a free one); ``controller`` is this nameserver's part of the failover
    controller. Raises SecretError when the cluster secret is required but missing,
    unreadable or too short (see :func:`cluster_secret`), TlsError when a TLS file is
    missing, unreadable or does not match.
    """

    def __init__(
        self,
        config: NameServerConfig,
        clock: Clock = time.monotonic,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self.secret = cluster_secret(config, env)
        self._scrape = load_scrape_credentials(
            config.metrics_auth, config.metrics_auth_file, config.metrics_auth_user
        )
        self.acl = open_source(
            config.auth_enabled, config.auth_acl_file, "the nameserver", self.secret is not None
        )
        if config.tls is not None:
            config.tls.server_context()  # TlsError now, naming the file, not at start()
        self.registry = Registry(config.broker_expiry_s, clock)
        self._sweeper = ExpirySweeper(self.registry, config.expiry_scan_interval_s)
        password = self.secret.raft_password() if self.secret is not None else None
        self.controller = Controller(self.registry, ControllerSettings.of(config, password), clock)
        self.cluster_acl = ClusterAcl(self.acl, self.controller) if self.acl is not None else None
        self._server: grpc.aio.Server | None = None
        self._http: web.AppRunner | None = None
        self.grpc_address = ""
        self.http_address = ""

    async def start(self) -> None:
        config = self.config
        # No SO_REUSEPORT: a second nameserver on the same port must fail, not share it.
        server = grpc.aio.server(
            interceptors=[RejectUndecodable()],
            options=[("grpc.so_reuseport", 0), *GRPC_MESSAGE_OPTIONS],
        )
        # The names a call signed for this nameserver's gRPC listener may name: its own.
        names = ServerNames(config.http_names)
        users = UserCalls(self.acl, self.secret, names)
        service = NameServerService(self.registry, self.controller, self.secret, users)
        control_pb2_grpc.add_NameServerServicer_to_server(service, server)
        address = host_port(config.listen_host, config.grpc_port)
        tls = config.tls
        # Every TLS file is read now: a bad one stops the start with its reason.
        http_tls = tls.server_context() if tls is not None else None
        try:
            if tls is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, tls.grpc_server_credentials())
        except RuntimeError as exc:  # grpc says only "Failed to bind"
            raise OSError(f"cannot listen for gRPC on {address}: {exc}") from exc
        names.listening(port, config.listen_host)
        try:
            self.controller.start()  # OSError when its Raft address is taken
            await server.start()
        except BaseException:
            await server.stop(None)
            await self.controller.stop()
            raise
        self._server = server
        self.grpc_address = host_port(config.listen_host, port)
        try:
            if config.http_port is not None:
                metrics = NameServerMetrics(self.registry, self.controller)
                certificate_expiry(metrics.registry, tls)
                users.export_to(metrics.registry)
                console = ConsoleContext.of(
                    self.registry,
                    self.controller,
                    config.console_broker_timeout_ms,
                    tls,
                    self.secret,
                    config.console_sample_interval_ms,
                    self.cluster_acl,
                )
                signed = SignedRequests(ServerNames(config.http_names), self.secret, self.acl)
                app = make_app(
                    self.registry, metrics, signed, users.count, console, self._scrape,
                    self.cluster_acl,
                )  # fmt: skip
                runner = web.AppRunner(app)
                await runner.setup()
                self._http = runner
                site = web.TCPSite(
                    runner, config.listen_host, config.http_port, ssl_context=http_tls
                )
                await site.start()
                bound = runner.addresses[0]
                signed.names.listening(int(bound[1]), config.listen_host, str(bound[0]))
                self.http_address = host_port(config.listen_host, bound[1])
            self._sweeper.start()
            if self.cluster_acl is not None:
                self.cluster_acl.start()
        except BaseException:
            await self.stop()
            raise
        log.info(
            "nameserver serving grpc=%s http=%s controller=%s",
            self.grpc_address,
            self.http_address,
            self.controller.address,
        )

    async def stop(self) -> None:
        # The controller goes first: stopping the gRPC server ends every broker's session,
        # one by one, and a leader still deciding would take a master whose session
        # happened to end first for dead.
        if self.controller.running:
            await self.controller.stop()
        await self._sweeper.stop()
        if self.cluster_acl is not None:
            await self.cluster_acl.stop()
        if self._http is not None:
            await self._http.cleanup()
            self._http = None
        if self._server is not None:
            await self._server.stop(self.config.shutdown_grace_s)
            self._server = None
