"""Nameserver settings: a frozen dataclass loaded from a TOML file and command-line flags
by the shared loader (:mod:`metaq.common.config`).

Every field is a top-level key of the TOML file and a flag of the same name with dashes
(``broker_expiry_s`` / ``--broker-expiry-s``); flags win over the file, the file over the
defaults. With neither, the nameserver listens on 127.0.0.1:9876 and hosts a failover
controller of one (in-process Raft, no port). ``controller_peers`` is a TOML list of
strings, and a comma-separated flag.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from metaq.common.config import (
    ConfigError,
    Schema,
    add_config_file_options,
    config_file,
    flag_settings,
    read_settings,
)
from metaq.common.scrape_auth import MetricsAuth, config_problems
from metaq.common.server_names import name_problems
from metaq.common.tls import TlsConfig, TlsError, server_tls
from metaq.common.version import installed_version

DEFAULT_GRPC_PORT: Final = 9876
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True, slots=True)
class NameServerConfig:
    listen_host: str = "127.0.0.1"
    # 0 picks a free port; the readiness line says which.
    grpc_port: int = DEFAULT_GRPC_PORT
    # None: no HTTP endpoint; 0 picks a free port.
    http_port: int | None = None
    # A broker silent this long leaves the routes (RocketMQ waits 120 s; a broker whose
    # process dies leaves at once anyway, when its session stream breaks).
    broker_expiry_s: float = 10.0
    # How often silent brokers are swept from memory (queries skip them at once anyway).
    expiry_scan_interval_s: float = 1.0
    # How long in-flight calls get to finish on SIGTERM / SIGINT.
    shutdown_grace_s: float = 1.0
    log_level: str = "INFO"
    # The failover controller (docs/nameserver.md). This nameserver's Raft address
    # (host:port) and the other nameservers' Raft addresses. With no peers the controller
    # is a Raft group of one inside the process and opens no port.
    controller_address: str = ""
    controller_peers: tuple[str, ...] = ()
    # Where the Raft journal and dump live; empty keeps them in memory.
    controller_dir: str = ""
    # A master whose last heartbeat is older than this is replaced by an in-sync slave.
    master_detection_ms: int = 3000
    # How often brokers are asked to heartbeat this nameserver when their beat decides
    # nothing here: every broker at a follower, and every one at the leader but a
    # controlled group's master (docs/nameserver.md, "How often brokers beat"). Capped
    # at half of master_detection_ms, so a broker that missed a change of leader still
    # beats the new one well inside the detection time (and brokers beat three times per
    # broker_expiry_s whatever they are asked); 0 asks every broker for its own rate
    # everywhere.
    standby_heartbeat_interval_ms: int = 1500
    # How long a new group waits for its configured master before the controller picks
    # the most advanced broker; also how long a new leader waits for masters it never saw.
    bootstrap_grace_ms: int = 5000
    # A file holding the cluster secret that brokers, nameservers and admin tools prove
    # (metaq.common.auth); empty reads METAQ_CLUSTER_SECRET instead. Required with
    # controller_peers or a listen_host beyond loopback.
    cluster_secret_file: str = ""
    # An elected master still live but not reporting it took over this long after its
    # election (a promotion stuck on a dead disk, say) is replaced by another in-sync one.
    takeover_timeout_ms: int = 10000
    # The web console's bound on each call to a broker's HTTP API: a page shows what it
    # gathered within it and says which broker did not answer.
    console_broker_timeout_ms: int = 2000
    # How often the console samples every master's counts for the overview's 15-minute
    # sparklines (a ring of at most 240 samples per topic and group).
    console_sample_interval_ms: int = 30_000
    # A PEM certificate (chain) and its unencrypted key: gRPC and HTTP serve TLS with
    # them; empty serves both plain. Raft has no TLS (docs/operations.md, "TLS").
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # The CA (PEM) that signs client certificates under tls_verify_client.
    tls_ca_file: str = ""
    # Refuse gRPC and HTTP clients without a certificate signed by tls_ca_file (mTLS).
    tls_verify_client: bool = False
    # Serve only users who prove an access key (and cluster members proving the cluster
    # secret), within their grants (docs/operations.md, Security). Off by default, with a
    # warning at start-up. In TOML also [auth] enabled / acl_file.
    auth_enabled: bool = False
    # The users and grants file (`metaq acl init ADMIN --file FILE`); reread on change.
    auth_acl_file: str = ""
    # Other names (host or host:port) admin tools address the HTTP port by, beside
    # listen_host (and, on loopback, localhost) with http_port: a DNS name, a proxy, an SSH
    # tunnel's localhost:PORT; a name without a port stands for the gRPC port too. A
    # signed request or gRPC call is taken only when it names one of these
    # (metaq.common.server_names), so one signed for another server is refused.
    http_names: tuple[str, ...] = ()
    # What /metrics and the detail of /health need (metaq.common.scrape_auth): none (open,
    # the default), bearer (a token) or basic (a user and password), as Prometheus sends
    # them; the token or password in metrics_auth_file (the service user's only).
    metrics_auth: MetricsAuth = MetricsAuth.NONE
    metrics_auth_file: str = ""
    metrics_auth_user: str = "prometheus"

    def __post_init__(self) -> None:
        problems = []
        try:
            server_tls(
                self.tls_cert_file, self.tls_key_file, self.tls_ca_file, self.tls_verify_client
            )
        except TlsError as exc:
            problems.append(str(exc))
        for name in ("grpc_port", "http_port"):
            port = getattr(self, name)
            if port is not None and not 0 <= port <= 65535:
                problems.append(f"{name}={port} is not a TCP port (0-65535, 0 for any free one)")
        if self.broker_expiry_s <= 0:
            problems.append("broker_expiry_s must be positive")
        if not 0 < self.expiry_scan_interval_s <= self.broker_expiry_s:
            problems.append("expiry_scan_interval_s must be positive and at most broker_expiry_s")
        if self.shutdown_grace_s < 0:
            problems.append("shutdown_grace_s must not be negative")
        if self.log_level not in LOG_LEVELS:
            problems.append(f"log_level must be one of {', '.join(LOG_LEVELS)}")
        if not self.listen_host:
            problems.append("listen_host must not be empty")
        for address in (self.controller_address, *self.controller_peers):
            if address and not _is_host_port(address):
                problems.append(f"controller address {address!r} is not host:port")
        if self.controller_peers and not self.controller_address:
            problems.append("controller_peers needs controller_address (this nameserver's own)")
        if len(set(self.controller_peers)) != len(self.controller_peers):
            problems.append("controller_peers lists an address twice")
        if self.master_detection_ms <= 0:
            problems.append("master_detection_ms must be positive")
        if self.standby_heartbeat_interval_ms < 0:
            problems.append("standby_heartbeat_interval_ms must be 0 (off) or positive")
        if self.bootstrap_grace_ms < 0:
            problems.append("bootstrap_grace_ms must not be negative")
        if self.takeover_timeout_ms <= 0:
            problems.append("takeover_timeout_ms must be positive")
        if self.console_broker_timeout_ms <= 0:
            problems.append("console_broker_timeout_ms must be positive")
        if self.console_sample_interval_ms < 100:
            problems.append("console_sample_interval_ms must be at least 100")
        if self.auth_enabled and not self.auth_acl_file:
            problems.append(
                "auth_enabled needs auth_acl_file (create it with metaq acl init ADMIN --file FILE)"
            )
        problems += name_problems(self.http_names)
        problems += config_problems(
            self.metrics_auth, self.metrics_auth_file, self.metrics_auth_user
        )
        if problems:
            raise ConfigError("invalid nameserver config: " + "; ".join(problems))

    @property
    def tls(self) -> TlsConfig | None:
        """The TLS settings, None when gRPC and HTTP are served plain."""
        return server_tls(
            self.tls_cert_file, self.tls_key_file, self.tls_ca_file, self.tls_verify_client
        )


def _is_host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


_SCHEMA: Final = Schema.of(NameServerConfig)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="metaq-nameserver",
        description="Run a metaq nameserver: broker registry, routes and queue assignment.",
    )
    p.add_argument(
        "--version", action="version", version=f"%(prog)s {installed_version('metaq-nameserver')}"
    )
    add_config_file_options(p)
    for f in dataclasses.fields(NameServerConfig):
        # A switch alone means true; "--tls-verify-client false" also works.
        switch: dict[str, Any] = (
            {"nargs": "?", "const": True} if _SCHEMA.hints[f.name] is bool else {}
        )
        p.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            default=None,
            help=f"(default: {f.default})",
            **switch,
        )
    return p


def load_config(argv: Sequence[str] | None = None) -> NameServerConfig:
    """Defaults, then the ``--config`` file, then flags; validated."""
    return config_from(parser().parse_args(argv))


def config_from(args: argparse.Namespace) -> NameServerConfig:
    path = config_file(args)
    settings = read_settings(path)[""] if path is not None else {}
    settings.update(flag_settings(args, _SCHEMA.hints))
    return _SCHEMA.build(NameServerConfig, settings)
