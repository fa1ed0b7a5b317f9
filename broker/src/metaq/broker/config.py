"""Broker settings: one frozen dataclass, loaded from a TOML file and command-line flags
by the shared loader (:mod:`metaq.common.config`).

Precedence is defaults < file < flags. The file's top-level keys are the fields of
:class:`BrokerConfig`; its ``[store]`` table holds :class:`StoreConfig` fields (all but
``data_dir``, ``flush_mode`` and ``store_host``, which follow from the broker's own
settings). Any key can also be set from the command line with ``--set KEY=VALUE``
(``--set store.commitlog_segment_bytes=1048576``). With no file and no flags the broker
runs as the master of a one-broker cluster under ``./run-data/broker``.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from metaq.broker.delay import DEFAULT_LEVELS, parse_levels
from metaq.broker.store.config import MIB, FlushMode, StoreConfig
from metaq.common.config import (
    ConfigError,
    Schema,
    Setting,
    add_config_file_options,
    config_file,
    flag_settings,
    read_settings,
)
from metaq.common.framing import MAX_FRAME_BYTES
from metaq.common.model import ReplicationMode
from metaq.common.record import HEADER_SIZE
from metaq.common.scrape_auth import MetricsAuth, config_problems
from metaq.common.server_names import name_problems
from metaq.common.tls import TlsConfig, TlsError, server_tls
from metaq.common.version import installed_version

_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_ADDRESS: Final = re.compile(r"(?P<host>[^\s:]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5})")
# Set from the broker's own settings, never from the [store] table.
_STORE_OWNED: Final = frozenset({"data_dir", "flush_mode", "store_host", "keep_damaged_records"})


def _default_store() -> StoreConfig:
    return StoreConfig(data_dir=Path("run-data/broker"))


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Everything one broker process needs; ``store`` always agrees with ``data_dir`` and
    ``flush_mode`` (they are copied into it)."""

    broker_name: str = "broker-a"
    cluster_name: str = "DefaultCluster"
    broker_id: int = 0
    """Unique within the group. 0 is deployed as the master, others as slaves; with
    failover on, the controller decides who is master after that."""
    computer_room: str = "default"
    """The IDC label consumers use to prefer queues in their own room."""
    data_dir: Path = Path("run-data/broker")
    listen_host: str = "127.0.0.1"
    data_port: int = 10911
    """The data plane (send, pull, offsets); 0 picks a free port."""
    http_port: int = 10912
    """/health and /metrics; 0 picks a free port."""
    nameservers: tuple[str, ...] = ("127.0.0.1:9876",)
    flush_mode: FlushMode = FlushMode.ASYNC
    auto_create_topics: bool = False
    default_queue_count: int = 8
    """Read and write queues of a topic created on first send."""
    max_frame_bytes: int = MAX_FRAME_BYTES
    max_connections: int = 10_000
    """Data-plane connections taken at once; one more is answered with a BUSY error and
    closed at once. The broker also keeps ``fd_reserve`` file descriptors free of
    connections, whatever this says."""
    idle_timeout_s: float = 120.0
    """A data-plane connection that sent nothing and awaits no answer (a parked long
    poll or replication fetch awaits one) for this long is closed, as is one whose
    frame has not arrived whole within it; clients reconnect on their next request.
    0 turns it off."""
    handshake_timeout_s: float = 10.0
    """A new data-plane connection must send a whole request (with auth: an authenticated
    one) within this long, or it is closed: sockets that connect and say nothing hold no
    slot for long. And while every slot is taken, a new connection takes the slot of the
    oldest one that has not done so yet, rather than being refused."""
    max_connections_per_address: int = 1000
    """Data-plane connections one client address may hold at once; one more is answered
    with a BUSY error saying so. 0 turns the cap off."""
    fd_reserve: int = 1024
    """File descriptors never given to connections, for the files the store opens as it
    goes (commitlog segments, a queue or index file while it is created or mapped again,
    the checkpoint). The soft RLIMIT_NOFILE is raised to the hard limit at start-up; what
    the broker holds open already is set aside besides. Queues hold none: a mapped file
    keeps no descriptor (:class:`metaq.broker.limits.DescriptorBudget`)."""
    max_buffered_request_bytes: int = 256 * MIB
    """Bytes of partly received request frames all connections may hold together; a
    connection whose next frame does not fit stops being read until others finish
    theirs. At least ``max_frame_bytes`` plus ``small_request_reserve_bytes``."""
    small_request_reserve_bytes: int = 16 * MIB
    """The part of ``max_buffered_request_bytes`` only frames of at most
    ``small_request_max_bytes`` may reserve: peers that announce large frames and stall
    cannot take the room every ordinary request needs. 0 gives large frames all of it."""
    small_request_max_bytes: int = MIB
    """Frames up to this size (prefix included) may use ``small_request_reserve_bytes``."""
    min_request_bytes_per_s: int = 64 * 1024
    """While other frames wait for room in ``max_buffered_request_bytes``, an incomplete
    frame must arrive at least this fast, judged over every ``request_arrival_window_s``;
    a slower one's connection is closed with an error saying so, which frees its
    reservation in seconds rather than ``idle_timeout_s``. While nobody waits, only a
    frame that got no byte for 4 windows is closed: a client descheduled for seconds on a
    loaded host, or sending slowly but steadily, holds memory nobody needs then.
    0 turns both checks off."""
    request_arrival_window_s: float = 5.0
    """How long an incomplete frame is given each time to show it arrives at
    ``min_request_bytes_per_s`` (while others wait), and a quarter of how long it may get
    nothing (while nobody does)."""
    max_connection_inflight_requests: int = 4096
    """Requests of one connection that may await an answer at once (parked long polls,
    sends waiting for fsync or slaves); past this the connection is not read until
    answers go out. Generous for pipelining clients; bounds what one peer parks."""
    max_parked_pulls: int = 100_000
    """Long polls parked broker-wide; past this a PULL that finds nothing is answered at
    once with its empty status (the consumer polls again) and counted in
    ``metaq_pulls_not_parked_total``."""
    max_connection_write_bytes: int = 16 * MIB
    """Answers queued for one connection whose peer does not read them; past this the
    broker stops reading that connection's requests until the peer catches up."""
    max_pull_messages: int = 1024
    max_pull_bytes: int = 16 * MIB
    cold_read_bytes_per_s: int = 0
    """The most a second that pulls for records behind the page-cache window may carry,
    broker-wide (:mod:`metaq.broker.cold_reads`): a group draining a backlog from disk
    then leaves the cores to the producers and the real-time groups on a small host.
    Pulls served from memory are never held. 0 (the default) sets no budget."""
    long_poll_max_ms: int = 60_000
    """Longest a PULL may be parked, whatever the consumer asks."""
    consumer_heartbeat_timeout_s: float = 30.0
    offset_snapshot_interval_ms: int = 5_000
    max_consumer_groups: int = 100_000
    """Consumer groups whose offsets this broker keeps; a commit of one more is refused,
    so that strangers cannot grow the offsets table (and its journal) without bound."""
    shutdown_grace_ms: int = 5_000
    """How long a stopping broker waits for requests in flight before closing anyway."""
    idle_poll_us: int = 200
    """After writing answers the event loop keeps polling its sockets this long before
    it sleeps, so a client's next request does not wait for a sleeping CPU to wake
    (:mod:`metaq.broker.idle_poll`). Costs up to a core while requests come less than
    this far apart; 0 turns it off (shared or overcommitted hosts)."""
    nice: int = -5
    """The CPU priority (Linux nice, -20 to 19) the broker process takes at start, so that
    clients and batch jobs sharing its cores wait for its loop rather than the loop for
    them (:func:`metaq.broker.limits.set_nice`). Below 0 it needs root, CAP_SYS_NICE or
    a RLIMIT_NICE that allows it (the deploy's units set one); without, the broker keeps
    the priority it was started with and says so."""
    log_level: str = "INFO"
    replication_mode: ReplicationMode = ReplicationMode.ASYNC
    min_in_sync_replicas: int = 2
    """Under sync replication: copies (the master's included) a send needs."""
    replication_timeout_ms: int = 3_000
    """Under sync replication: past this, a send is answered FLUSH_SLAVE_TIMEOUT."""
    replica_lag_max_ms: int = 5_000
    """A slave not caught up with the master for this long leaves the in-sync set; one
    that left for being slow comes back after keeping up this long."""
    replica_slow_ms: int = 1_000
    """Under sync replication: a slave that, over this long, held back sends which
    ``min_in_sync_replicas`` copies already held (each by more than a tenth of it) for
    half the time leaves the in-sync set, while another slave and enough copies stay in
    sync without it, so one slow slave does not set the group's pace."""
    failover: bool = True
    """Let the nameservers' controller pick the group's master (needs nameservers)."""
    delay_levels: str = DEFAULT_LEVELS
    """Delayed delivery's levels (property DELAY = 1 for the first), as in RocketMQ."""
    max_delay_ms: int = 7 * 86_400_000
    """The furthest ahead a DELIVER_AT time may be."""
    dedup_window_ms: int = 3_600_000
    """A retried send (SendRequest FLAG_RETRY) is not stored again if its message id was
    stored within this long."""
    txn_check_after_ms: int = 6_000
    """A half message not ended this long after it was stored is checked back."""
    txn_check_interval_ms: int = 6_000
    """Between two checks of one half message."""
    txn_max_checks: int = 15
    """Checks before an unended half message is discarded."""
    queue_lock_ttl_ms: int = 30_000
    """An ordered consumer's queue lock lapses this long after its last renewal."""
    journal_interval_ms: int = 100
    """How often a master journals the offsets consumers committed with their pulls."""
    master_lease_ms: int = 2_000
    """A controlled master that has not heard the controller confirm it for this long
    (counted from when the confirmed heartbeat was sent) stops taking writes, while
    another broker is in sync: the controller may have promoted it. Keep it below the
    nameservers' master_detection_ms."""
    heartbeat_interval_ms: int = 500
    """Heartbeats to each nameserver; the controller notices a silent master after
    its master_detection_ms (3 s by default)."""
    cluster_secret_file: str = ""
    """A file (readable by the service user only) holding the cluster secret this broker
    proves to the nameservers and to its master or slaves (``metaq.common.auth``); empty
    reads the ``METAQ_CLUSTER_SECRET`` environment variable instead. Required when
    ``listen_host`` is not a loopback address."""
    auth_enabled: bool = False
    """Serve only users who prove an access key on the data plane and HTTP, within their
    grants (docs/operations.md, Security). Off by default, with a warning at start-up."""
    auth_acl_file: str = ""
    """The users and grants file (``metaq acl init ADMIN --file FILE`` makes it); reread
    when it changes. Required with ``auth_enabled``. In TOML also ``[auth] acl_file``."""
    http_names: tuple[str, ...] = ()
    """Other names (``host`` or ``host:port``) that admin tools address this broker's
    HTTP port by, beside ``listen_host`` (and, on loopback, ``localhost``) with
    ``http_port``: a DNS name, a proxy, an SSH tunnel's ``localhost:PORT``. A signed admin
    request names the server it is for and is taken only when that is one of these
    (``metaq.common.server_names``), so one signed for another broker is refused."""
    metrics_auth: MetricsAuth = MetricsAuth.NONE
    """What ``/metrics`` and the detail of ``/health`` need (``metaq.common.scrape_auth``):
    ``none`` (open, the default), ``bearer`` (a token) or ``basic`` (a user and password),
    as Prometheus sends them."""
    metrics_auth_file: str = ""
    """The file (readable by the service user only) holding the bearer token or the basic
    password; required unless ``metrics_auth`` is ``none``."""
    metrics_auth_user: str = "prometheus"
    """The user name of ``basic`` credentials."""
    tls_cert_file: str = ""
    """A PEM certificate (chain) the data plane and HTTP serve TLS with; empty serves
    them plain. With it set the broker also dials its nameservers and its master over
    TLS, showing this certificate to those that verify clients."""
    tls_key_file: str = ""
    """The unencrypted PEM private key of ``tls_cert_file``."""
    tls_ca_file: str = ""
    """The CA (PEM) the nameservers' and master's certificates must chain to, and that
    signs client certificates under ``tls_verify_client``; empty trusts the system's."""
    tls_verify_client: bool = False
    """Refuse data-plane and HTTP clients without a certificate signed by
    ``tls_ca_file`` (mutual TLS)."""
    store: StoreConfig = field(default_factory=_default_store)

    def __post_init__(self) -> None:
        problems = self._problems()
        if problems:
            raise ConfigError("invalid broker config: " + "; ".join(problems))
        store = dataclasses.replace(self.store, data_dir=self.data_dir, flush_mode=self.flush_mode)
        object.__setattr__(self, "store", store)

    def _problems(self) -> list[str]:
        problems = []
        for key in ("broker_name", "cluster_name", "computer_room"):
            if not _NAME.fullmatch(getattr(self, key)):
                problems.append(f"{key} must be 1-64 characters from letters, digits, '_.-'")
        if self.broker_id < 0:
            problems.append("broker_id must be 0 (master) or a positive slave id")
        for key in ("data_port", "http_port"):
            if not 0 <= getattr(self, key) <= 65535:
                problems.append(f"{key} must be a TCP port, 0-65535 (0 picks a free one)")
        if self.data_port and self.data_port == self.http_port:
            problems.append("data_port and http_port must differ")
        for address in self.nameservers:
            if not _ADDRESS.fullmatch(address) or int(address.rsplit(":", 1)[1]) > 65535:
                problems.append(f"nameservers: {address!r} is not HOST:PORT")
        if not 1 <= self.default_queue_count <= 65536:
            problems.append("default_queue_count must be 1-65536")
        largest_send = HEADER_SIZE + 2048 + self.store.max_properties_bytes
        largest_send += self.store.max_message_bytes + 4096
        if self.max_frame_bytes < largest_send:
            problems.append(
                f"max_frame_bytes={self.max_frame_bytes} cannot carry one message of "
                f"store.max_message_bytes={self.store.max_message_bytes}; raise it to at "
                f"least {largest_send}"
            )
        for key in (
            "max_pull_messages",
            "max_pull_bytes",
            "long_poll_max_ms",
            "consumer_heartbeat_timeout_s",
            "offset_snapshot_interval_ms",
            "max_consumer_groups",
            "shutdown_grace_ms",
            "min_in_sync_replicas",
            "replication_timeout_ms",
            "replica_lag_max_ms",
            "replica_slow_ms",
            "heartbeat_interval_ms",
            "journal_interval_ms",
            "master_lease_ms",
            "max_delay_ms",
            "dedup_window_ms",
            "queue_lock_ttl_ms",
            "txn_check_after_ms",
            "txn_check_interval_ms",
            "txn_max_checks",
        ):
            if getattr(self, key) <= 0:
                problems.append(f"{key} must be positive")
        if self.max_connections <= 0:
            problems.append("max_connections must be positive")
        if self.idle_timeout_s < 0:
            problems.append("idle_timeout_s must be 0 (off) or positive")
        if self.handshake_timeout_s <= 0:
            problems.append("handshake_timeout_s must be positive")
        if self.max_connections_per_address < 0:
            problems.append("max_connections_per_address must be 0 (no cap) or positive")
        if self.fd_reserve < 64:
            problems.append("fd_reserve must be at least 64 (the store's own files need them)")
        if self.small_request_reserve_bytes < 0:
            problems.append("small_request_reserve_bytes must be 0 (off) or positive")
        if self.max_buffered_request_bytes < self.max_frame_bytes + max(
            self.small_request_reserve_bytes, 0
        ):
            problems.append(
                f"max_buffered_request_bytes={self.max_buffered_request_bytes} must be at "
                f"least max_frame_bytes={self.max_frame_bytes} plus "
                f"small_request_reserve_bytes={self.small_request_reserve_bytes}, or a whole "
                "large frame could never be received: raise it or lower the others"
            )
        if not 0 < self.small_request_max_bytes <= self.max_frame_bytes:
            problems.append(
                f"small_request_max_bytes={self.small_request_max_bytes} must be positive "
                f"and at most max_frame_bytes={self.max_frame_bytes}"
            )
        if self.cold_read_bytes_per_s and self.cold_read_bytes_per_s < MIB:
            problems.append(
                "cold_read_bytes_per_s must be 0 (no budget) or at least 1048576 (1 MiB/s): "
                "less would hold pulls past the time consumers wait for them"
            )
        if self.min_request_bytes_per_s < 0:
            problems.append("min_request_bytes_per_s must be 0 (off) or positive")
        if self.request_arrival_window_s <= 0:
            problems.append("request_arrival_window_s must be positive")
        if self.max_connection_inflight_requests <= 0:
            problems.append("max_connection_inflight_requests must be positive")
        if self.max_parked_pulls < 0:
            problems.append("max_parked_pulls must be 0 (never park) or positive")
        if self.max_connection_write_bytes < 64 * 1024:
            problems.append("max_connection_write_bytes must be at least 65536")
        if not -20 <= self.nice <= 19:
            problems.append("nice must be -20 (highest priority) to 19 (lowest)")
        if not 0 <= self.idle_poll_us <= 10_000:
            problems.append("idle_poll_us must be 0-10000 (0 turns idle polling off)")
        if self.max_pull_bytes > self.max_frame_bytes // 2:
            problems.append("max_pull_bytes must be at most half of max_frame_bytes")
        try:
            parse_levels(self.delay_levels)
        except ValueError as exc:
            problems.append(f"delay_levels: {exc}")
        if self.auth_enabled and not self.auth_acl_file:
            problems.append(
                "auth_enabled needs auth_acl_file (create it with metaq acl init ADMIN --file FILE)"
            )
        problems += name_problems(self.http_names)
        problems += config_problems(
            self.metrics_auth, self.metrics_auth_file, self.metrics_auth_user
        )
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            problems.append("log_level must be DEBUG, INFO, WARNING or ERROR")
        try:
            server_tls(
                self.tls_cert_file, self.tls_key_file, self.tls_ca_file, self.tls_verify_client
            )
        except TlsError as exc:
            problems.append(str(exc))
        return problems

    @property
    def tls(self) -> TlsConfig | None:
        """The TLS settings, None when the broker serves and dials plain."""
        return server_tls(
            self.tls_cert_file, self.tls_key_file, self.tls_ca_file, self.tls_verify_client
        )

    @property
    def is_master(self) -> bool:
        """Deployed as the master; with failover the controller has the last word."""
        return self.broker_id == 0

    @property
    def controlled(self) -> bool:
        return self.failover and bool(self.nameservers)


# --- loading ----------------------------------------------------------------------------


def load_config(argv: Sequence[str] | None = None) -> BrokerConfig:
    """Parse ``argv`` (flags, ``--config FILE``) into a validated BrokerConfig."""
    args = build_parser().parse_args(argv)
    return config_from(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="metaq-broker",
        description="The metaq broker: store, data plane and HTTP health/metrics.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {installed_version('metaq-broker')}"
    )
    add_config_file_options(parser)
    add = parser.add_argument
    add("--broker-name")
    add("--cluster-name")
    add("--broker-id")
    add("--computer-room", help="IDC label")
    add("--data-dir")
    add("--listen-host")
    add("--data-port", help="data-plane port (0: any free port)")
    add("--http-port", help="health/metrics port (0: any free port)")
    add("--nameserver", action="append", dest="nameservers", help="HOST:PORT, repeatable")
    add("--flush-mode", choices=[m.value for m in FlushMode])
    add("--auto-create-topics", action=argparse.BooleanOptionalAction, default=None)
    add("--default-queue-count")
    add("--log-level")
    add("--cluster-secret-file", help="file holding the cluster secret")
    add("--tls-cert-file", help="PEM certificate: serve TLS on every listener")
    add("--tls-key-file", help="PEM private key of --tls-cert-file")
    add("--tls-ca-file", help="PEM CA: trusted for servers dialled and client certificates")
    add("--tls-verify-client", action=argparse.BooleanOptionalAction, default=None)
    add(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any key, e.g. store.flush_timeout_ms=2000; repeatable",
    )
    return parser


def config_from(args: argparse.Namespace) -> BrokerConfig:
    top: dict[str, Setting] = {}
    store: dict[str, Setting] = {}
    path = config_file(args)
    if path is not None:
        # Quoted values have always been read as flags are (data_port = "10911").
        found = read_settings(path, sections=("store",), text=True)
        top, store = found[""], found["store"]
    top.update(flag_settings(args, _TOP.hints))
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        section, dot, name = key.strip().rpartition(".")
        if dot and section not in ("store", "auth"):
            raise ConfigError(f"--set {item!r}: only the 'store.' and 'auth.' prefixes are known")
        if section == "auth":
            section, name = "", f"auth_{name}"
        setting = Setting(value.strip(), f"flag --set {key.strip()}", text=True)
        (store if section else top)[name] = setting
    return build_config(top, store)


_TOP: Final = Schema.of(BrokerConfig, exclude={"store"}, also=["[store]"])
_STORE: Final = Schema.of(StoreConfig, exclude=_STORE_OWNED, noun="store key")


def build_config(top: Mapping[str, Setting], store: Mapping[str, Setting]) -> BrokerConfig:
    """Make a BrokerConfig from its top-level settings and its ``[store]`` settings."""
    return _TOP.build(BrokerConfig, top, store=_STORE.build(StoreConfig, store, data_dir=Path(".")))
