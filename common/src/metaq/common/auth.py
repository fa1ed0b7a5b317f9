"""The cluster secret: how nameservers, brokers and admin tools prove they belong.

Every member of a cluster holds the same secret (``cluster_secret_file``, else the
``METAQ_CLUSTER_SECRET`` environment variable). It never crosses the wire: each side
proves it with an HMAC-SHA256 keyed by a key derived from it, over what the proof is
for, so a proof taken from one place is worthless in another.

- Control plane (gRPC): a mutating call carries ``x-metaq-auth`` metadata, an HMAC over
  the method, the nameserver it is for (``x-metaq-target``, ``host:port`` as dialled:
  :func:`metaq.common.server_names.signed_purpose`, as HTTP proofs), a wall-clock
  timestamp and the request's serialized bytes; the nameserver accepts it within
  :data:`MAX_CLOCK_SKEW_S` of its own clock when it names that nameserver
  (:func:`call_metadata`, :func:`verify_call`), so a call captured on its way to one
  nameserver is refused by the others. A ``Session`` stream has no request of its own to
  sign, so it opens with the broker's identity in :data:`SESSION_IDENTITY_KEY` metadata
  and the proof covers that: the stream can only ever speak for that one broker.
- Data plane (replication): a nonce from each side, then each side answers with an HMAC
  over both nonces, its role, the slave's identity and its own advertised data address
  (:func:`replica_proof`), once per connection, so neither can replay an old
  conversation, and a proof passed on by a relay names an address the slave did not dial.
- Raft (pysyncobj): its own password, derived here (:meth:`ClusterSecret.raft_password`).

What this is not: encryption. Without TLS (:mod:`metaq.common.tls`) anyone who can read
the traffic reads the messages, and an attacker on the path can replay a control call
within the skew window (a Session only for the broker it was captured from) or tamper with
data-plane frames after the handshake. The secret keeps strangers who can merely reach a
port from joining, taking over or wiping a group.

Apart from :func:`load_secret` reading one file, nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

from metaq.common.server_names import TARGET_METADATA_KEY, signed_purpose
from metaq.common.v1 import control_pb2

log = logging.getLogger(__name__)

ENV_VAR: Final = "METAQ_CLUSTER_SECRET"
MIN_SECRET_BYTES: Final = 16
"""Shorter secrets are refused: an HMAC is only as strong as the guessing of its key."""
MAX_SECRET_BYTES: Final = 4096
METADATA_KEY: Final = "x-metaq-auth"
"""The gRPC metadata key of a call's proof (lowercase, as gRPC requires)."""
HTTP_HEADER: Final = "X-Metaq-Cluster"
"""The HTTP header of :func:`sign_http` proofs."""
SESSION_IDENTITY_KEY: Final = "x-metaq-broker-bin"
"""Binary gRPC metadata a Session opens with: the broker it speaks for, a serialized
``BrokerState`` with only cluster, broker_name, broker_id and data_address set; the
Session's proof is over these bytes."""
MAX_CLOCK_SKEW_S: Final = 120.0
"""A control-plane proof is accepted this far either side of the receiver's clock."""
NONCE_BYTES: Final = 16
_VERSION: Final = "v1"
HOW_TO: Final = (
    "give every nameserver, broker and admin tool of the cluster the same secret: "
    "cluster_secret_file (a file only the service user can read, e.g. made with "
    "`head -c 32 /dev/urandom | base64 > FILE && chmod 600 FILE`) or the "
    f"{ENV_VAR} environment variable"
)


class SecretError(ValueError):
    """The cluster secret is missing where it is required, unreadable or too weak."""


class AuthFailed(Exception):
    """A peer did not prove the cluster secret; the message says what to configure."""


class ClusterSecret:
    """The secret's derived keys; the secret itself is not kept, nor ever printed."""

    __slots__ = ("_key", "source")

    def __init__(self, secret: bytes, source: str) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise SecretError(
                f"the cluster secret from {source} is {len(secret)} bytes; it needs at least "
                f"{MIN_SECRET_BYTES} (use e.g. 32 random bytes in base64)"
            )
        if len(secret) > MAX_SECRET_BYTES:
            raise SecretError(
                f"the cluster secret from {source} is {len(secret)} bytes; at most "
                f"{MAX_SECRET_BYTES} (did cluster_secret_file name the wrong file?)"
            )
        self._key = hmac.new(secret, b"metaq cluster key", hashlib.sha256).digest()
        self.source = source

    def __repr__(self) -> str:
        return f"ClusterSecret(from {self.source})"

    def mac(self, purpose: str, *parts: bytes) -> bytes:
        """HMAC-SHA256 over ``purpose`` and ``parts``, each length-prefixed so that no
        two different lists of parts give the same message."""
        h = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in (purpose.encode(), *parts):
            h.update(len(part).to_bytes(4, "big"))
            h.update(part)
        return h.digest()

    def raft_password(self) -> str:
        """pysyncobj's ``password``: a key of its own, so Raft never holds the secret."""
        return self.mac("raft").hex()


def load_secret(file: str, env: Mapping[str, str] | None = None) -> ClusterSecret | None:
    """The secret from ``file`` when set, else from :data:`ENV_VAR`; None when neither is.

    Surrounding whitespace (a trailing newline) is not part of the secret. A file that
    others than its owner may read is used, with a warning.
    """
    env = os.environ if env is None else env
    if file:
        path = Path(file)
        try:
            mode = path.stat().st_mode
            raw = path.read_bytes()
        except OSError as exc:
            raise SecretError(
                f"cluster_secret_file {file}: cannot read it ({exc.strerror}); {HOW_TO}"
            ) from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning(
                "cluster_secret_file %s can be read by other users (mode %o): "
                "anyone who reads it can join the cluster; chmod 600 it",
                file,
                stat.S_IMODE(mode),
            )
        return ClusterSecret(raw.strip(), f"cluster_secret_file {file}")
    value = env.get(ENV_VAR, "")
    if value:
        return ClusterSecret(value.strip().encode(), f"environment variable {ENV_VAR}")
    return None


def require_secret(
    secret: ClusterSecret | None, component: str, reasons: Iterable[str]
) -> ClusterSecret | None:
    """Refuse to run without a secret where one is needed; say loudly when running open.

    ``reasons`` are why this process needs one (``"controller_peers is set"``, a
    listen address that is not loopback); none means a single-host, loopback-only set-up,
    which may run unauthenticated.
    """
    needed = list(reasons)
    if secret is not None:
        log.info("%s: cluster members prove the secret from %s", component, secret.source)
        return secret
    if needed:
        raise SecretError(
            f"{component} needs a cluster secret because {' and '.join(needed)}: "
            f"without one anybody who reaches its ports can join or take over the cluster; "
            f"{HOW_TO}"
        )
    log.warning(
        "%s runs WITHOUT a cluster secret: the cluster is unauthenticated, and anything "
        "on this host can register brokers, fetch the log or move masters. Fine for a "
        "single-host test; set cluster_secret_file before listening beyond loopback.",
        component,
    )
    return None


# --- control plane ----------------------------------------------------------------------


def sign_call(secret: ClusterSecret, method: str, target: str, request: bytes, now_s: float) -> str:
    """The ``x-metaq-auth`` value proving the secret for one call of ``method``
    (e.g. ``"Switchover"``) to the nameserver ``target``
    (:func:`~metaq.common.server_names.target_of` the address dialled) with ``request``
    (``SerializeToString(deterministic=True)``)."""
    return _sign(secret, "grpc", signed_purpose("grpc", method, target), request, now_s)


def sign_http(secret: ClusterSecret, purpose: str, body: bytes, now_s: float) -> str:
    """The :data:`HTTP_HEADER` value proving the secret for one HTTP request (the
    nameservers' console calling a broker's admin API): over ``purpose``
    (:func:`metaq.common.server_names.signed_purpose` of the method, the server it is
    for, its request id, the path with its query as sent) and the body. Worthless as a gRPC proof
    and back."""
    return _sign(secret, "http", purpose, body, now_s)


def _sign(secret: ClusterSecret, domain: str, what: str, request: bytes, now_s: float) -> str:
    stamp = str(int(now_s * 1000))
    digest = secret.mac(domain, what.encode(), stamp.encode(), request)
    return f"{_VERSION}:{stamp}:{digest.hex()}"


def call_metadata(
    secret: ClusterSecret | None, method: str, target: str, request: bytes, now_s: float
) -> tuple[tuple[str, str], ...]:
    """gRPC metadata for a call to the nameserver ``target``: the server it is for and
    the proof, or nothing when there is no secret."""
    if secret is None:
        return ()
    return (
        (TARGET_METADATA_KEY, target),
        (METADATA_KEY, sign_call(secret, method, target, request, now_s)),
    )


def session_identity(cluster: str, broker_name: str, broker_id: int, data_address: str) -> bytes:
    """The :data:`SESSION_IDENTITY_KEY` value for a broker: what its Session is bound to."""
    state = control_pb2.BrokerState(
        cluster=cluster, broker_name=broker_name, broker_id=broker_id, data_address=data_address
    )
    return state.SerializeToString(deterministic=True)


def session_metadata(
    secret: ClusterSecret | None, target: str, identity: bytes, now_s: float
) -> tuple[tuple[str, str | bytes], ...]:
    """gRPC metadata a Session stream to the nameserver ``target`` opens with: the
    broker's :func:`session_identity`, and with a secret the proof over it."""
    return (
        (SESSION_IDENTITY_KEY, identity),
        *call_metadata(secret, "Session", target, identity, now_s),
    )


def verify_call(
    secret: ClusterSecret,
    method: str,
    target: str,
    request: bytes,
    proof: str | None,
    now_s: float,
) -> float:
    """Raise :class:`AuthFailed`, saying what to configure, unless ``proof`` is
    :func:`sign_call`'s for this method, nameserver (``target``, which the caller checked
    is this one: :meth:`~metaq.common.server_names.ServerNames.check`) and request within
    the skew window.

    Returns when the caller signed it (seconds, the caller's clock), so that a receiver
    can order two proofs of one caller without comparing clocks."""
    if not proof:
        raise AuthFailed(
            f"{method} needs proof of the cluster secret ({METADATA_KEY} metadata) and the "
            f"call carried none; {HOW_TO}"
        )
    purpose = signed_purpose("grpc", method, target)
    return _verify(secret, "grpc", purpose, request, proof, now_s, "this nameserver", method)


def verify_http(
    secret: ClusterSecret, purpose: str, body: bytes, proof: str, now_s: float
) -> float:
    """:func:`verify_call` for a :func:`sign_http` proof (a server's HTTP admin API)."""
    return _verify(secret, "http", purpose, body, proof, now_s, "this server", purpose)


def _verify(
    secret: ClusterSecret,
    domain: str,
    what: str,
    request: bytes,
    proof: str,
    now_s: float,
    where: str,
    shown_as: str,
) -> float:
    version, _, rest = proof.partition(":")
    stamp, _, digest = rest.partition(":")
    if version != _VERSION or not stamp.isdigit():
        raise AuthFailed(f"{shown_as}: the cluster-secret proof is malformed")
    skew_s = abs(int(stamp) / 1000 - now_s)
    if skew_s > MAX_CLOCK_SKEW_S:
        raise AuthFailed(
            f"{shown_as}: the proof is dated {skew_s:.0f} s away from {where}'s clock "
            f"(at most {MAX_CLOCK_SKEW_S:.0f} s); synchronise the clocks (NTP)"
        )
    expected = secret.mac(domain, what.encode(), stamp.encode(), request).hex()
    if not hmac.compare_digest(expected, digest):
        raise AuthFailed(
            f"{shown_as}: the proof does not match {where}'s cluster secret; "
            "the caller holds a different secret"
        )
    return int(stamp) / 1000


# --- data plane: replication's mutual handshake -------------------------------------------

MASTER: Final = "master"
SLAVE: Final = "slave"


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def replica_proof(
    secret: ClusterSecret,
    role: str,
    broker_name: str,
    slave_id: int,
    slave_nonce: bytes,
    master_nonce: bytes,
    data_address: str,
) -> bytes:
    """What ``role`` (:data:`MASTER` or :data:`SLAVE`) sends to prove the secret when
    slave ``slave_id`` of group ``broker_name`` connects to its master. The role is in the
    message, so neither side can reflect the other's proof back.

    ``data_address`` is the prover's own advertised data address (host:port): the
    master's lets the slave check that the broker proving is the one it dialled, not one
    behind a relay at another address; the slave's says which slave proved."""
    return secret.mac(
        "replica " + role,
        broker_name.encode(),
        str(slave_id).encode(),
        slave_nonce,
        master_nonce,
        data_address.encode(),
    )


def check_proof(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)
