"""TLS for every listener and every client: one settings object, checked before use.

A server (broker data plane and HTTP, nameserver gRPC and HTTP) serves TLS when it is
given a certificate and key; with ``verify_client`` it also demands a client certificate
signed by ``ca_file`` (mutual TLS). A client (producer, consumer, CLI, Spark, and a broker
dialling its nameservers or its master) speaks TLS when it holds a :class:`TlsConfig` at
all: ``ca_file`` is the CA its servers' certificates must chain to (empty: the system's
trust store), and ``cert_file``/``key_file`` the certificate it shows a server that
verifies clients. Protocol versions below TLS 1.2 are refused both ways.

:meth:`TlsConfig.check` reads every file once and says what is wrong in words an
operator can act on (a file missing, a key that is not a key, a key of another
certificate); :meth:`server_context` and :meth:`client_context` call it, so a process
that builds its contexts at start-up fails there rather than at the first connection.

Raft between nameservers (pysyncobj) has no TLS: see docs/operations.md, "TLS".
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc
from cryptography import x509

MIN_VERSION: Final = ssl.TLSVersion.TLSv1_2

GRPC_MESSAGE_LIMIT: Final = 32 * 1024 * 1024
"""The largest gRPC message a nameserver takes or a client sends and takes, over gRPC's
4 MB default: a ``GetAssignment`` request carries the queues every member of the group
holds and its answer every queue of the topic (3.6 MB at 10,000 members over 100,000
queues; docs/benchmarks.md). The other calls stay far below it."""
GRPC_MESSAGE_OPTIONS: Final = (
    ("grpc.max_send_message_length", GRPC_MESSAGE_LIMIT),
    ("grpc.max_receive_message_length", GRPC_MESSAGE_LIMIT),
)


class TlsError(ValueError):
    """A TLS setting cannot be used; the message names the file and what to do."""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Certificate, key and CA paths (PEM), and whether a server verifies its clients.

    As a server's settings ``cert_file`` and ``key_file`` are required. As a client's,
    every field is optional: the object's presence is what turns TLS on.
    """

    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    verify_client: bool = False

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise TlsError("invalid TLS settings: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """What is inconsistent without reading any file."""
        problems = []
        if bool(self.cert_file) != bool(self.key_file):
            problems.append(
                "tls_cert_file and tls_key_file go together: set both (the certificate and "
                "its private key) or neither"
            )
        if self.verify_client and not self.ca_file:
            problems.append(
                "tls_verify_client needs tls_ca_file: the CA that signs the client certificates"
            )
        return problems

    @property
    def serves(self) -> bool:
        """Listeners with these settings speak TLS (a certificate to present is given)."""
        return bool(self.cert_file)

    def check(self) -> None:
        """Read the files and refuse (TlsError) what cannot work; server or client alike."""
        self._context(ssl.Purpose.CLIENT_AUTH)

    def server_context(self) -> ssl.SSLContext:
        """An SSLContext for a listening socket (data plane, HTTP)."""
        if not self.serves:
            raise TlsError("a TLS listener needs tls_cert_file and tls_key_file")
        context = self._context(ssl.Purpose.CLIENT_AUTH)
        if self.verify_client:
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self) -> ssl.SSLContext:
        """An SSLContext for dialling a server; it checks the server's name or address."""
        return self._context(ssl.Purpose.SERVER_AUTH)

    def _context(self, purpose: ssl.Purpose) -> ssl.SSLContext:
        context = ssl.create_default_context(purpose)
        context.minimum_version = MIN_VERSION
        if self.ca_file:
            _readable(self.ca_file, "tls_ca_file")
            try:
                context.load_verify_locations(cafile=self.ca_file)
            except ssl.SSLError as exc:
                raise TlsError(
                    f"tls_ca_file {self.ca_file}: no CA certificate in it could be read "
                    f"({exc.reason or exc}); give a PEM file with the CA's certificate"
                ) from None
        if self.cert_file:
            _readable(self.cert_file, "tls_cert_file")
            _readable(self.key_file, "tls_key_file")
            try:
                # An encrypted key would make OpenSSL prompt on the terminal; refuse it.
                context.load_cert_chain(self.cert_file, self.key_file, password=_no_password)
            except ssl.SSLError as exc:
                raise TlsError(_chain_problem(self, exc)) from None
        return context

    # --- gRPC: it takes PEM bytes rather than an SSLContext ----------------------------

    def certificate_expiry(self) -> float:
        """When ``cert_file``'s certificate (the first in the file: the server's own)
        stops being valid, in seconds since the epoch; call after :meth:`check`."""
        try:
            cert = x509.load_pem_x509_certificate(_read(self.cert_file))
        except ValueError as exc:
            raise TlsError(
                f"tls_cert_file {self.cert_file}: not a PEM certificate ({exc})"
            ) from None
        return cert.not_valid_after_utc.timestamp()

    def grpc_server_credentials(self) -> grpc.ServerCredentials:
        self.server_context()  # the same checks and messages as every other listener
        return grpc.ssl_server_credentials(
            [(_read(self.key_file), _read(self.cert_file))],
            root_certificates=_read(self.ca_file) if self.ca_file else None,
            require_client_auth=self.verify_client,
        )

    def grpc_channel_credentials(self) -> grpc.ChannelCredentials:
        self.client_context()
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file) if self.ca_file else None,
            private_key=_read(self.key_file) if self.key_file else None,
            certificate_chain=_read(self.cert_file) if self.cert_file else None,
        )


def grpc_channel(address: str, tls: TlsConfig | None, **kwargs: Any) -> grpc.aio.Channel:
    """A ``grpc.aio`` channel to ``address``: plain without ``tls``, else verified TLS;
    messages up to :data:`GRPC_MESSAGE_LIMIT` unless ``options`` say otherwise."""
    kwargs.setdefault("options", GRPC_MESSAGE_OPTIONS)
    if tls is None:
        return grpc.aio.insecure_channel(address, **kwargs)
    return grpc.aio.secure_channel(address, tls.grpc_channel_credentials(), **kwargs)


async def grpc_hint(address: str, tls: TlsConfig | None, details: str) -> str:
    """A failed gRPC call's details, with what to do when TLS is the likely cause."""
    closed = "Socket closed" in details or "handshake" in details.lower() or "SSL" in details
    if not closed:
        return details
    if tls is None:
        host, _, port = address.rpartition(":")
        if port.isdigit() and await speaks_tls(host.strip("[]"), int(port)):
            return f"{details} ({plain_peer_hint(address, 'nameserver')})"
        return details
    hint = f"TLS with the nameserver at {address} failed: is TLS on there, and its "
    hint += "certificate signed by the CA given?"
    if not tls.cert_file:
        hint += " If it verifies clients, pass --tls-cert and --tls-key too"
    return f"{details} ({hint})"


def server_tls(
    cert_file: str, key_file: str, ca_file: str, verify_client: bool
) -> TlsConfig | None:
    """A server's settings from its ``tls_*`` keys; None (plain listeners) without a
    certificate. Raises TlsError for a half-given pair or a CA-less ``verify_client``."""
    tls = TlsConfig(cert_file, key_file, ca_file, verify_client)
    if not tls.serves:
        if ca_file or verify_client:
            raise TlsError(
                "tls_ca_file and tls_verify_client apply to TLS listeners: set "
                "tls_cert_file and tls_key_file too, or drop them"
            )
        return None
    return tls


async def speaks_tls(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether a TLS handshake with ``host:port`` completes (trusting anything): how a
    plain client whose connection was closed unanswered learns why."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port, ssl=context)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(timeout_s):
            await writer.wait_closed()
    return True


def plain_peer_hint(address: str, what: str = "broker") -> str:
    """What to tell a user whose plain connection met a TLS listener."""
    return (
        f"the {what} at {address} speaks TLS; pass --tls-ca FILE, the CA that signed its "
        "certificate (in Python tls=TlsConfig(ca_file=...), in Spark the option tlsCaFile)"
    )


def tls_peer_hint(address: str, exc: BaseException, what: str = "broker") -> str:
    """What to tell a user whose TLS connection failed, by the reason OpenSSL gave."""
    reason = getattr(exc, "reason", None) or str(exc)
    if reason == "WRONG_VERSION_NUMBER" or "wrong version number" in str(exc):
        return (
            f"the {what} at {address} does not speak TLS (its port is plain); "
            "drop the TLS options or turn TLS on at the server"
        )
    if reason == "CERTIFICATE_VERIFY_FAILED" or isinstance(exc, ssl.SSLCertVerificationError):
        detail = getattr(exc, "verify_message", "") or reason
        return (
            f"the certificate of the {what} at {address} is not trusted ({detail}); "
            "pass the CA that signed it (--tls-ca FILE / tls_ca_file)"
        )
    return f"TLS with the {what} at {address} failed: {reason}"


def _readable(path: str, key: str) -> None:
    file = Path(path)
    if not file.is_file():
        raise TlsError(f"{key} {path}: no such file")
    try:
        with file.open("rb"):
            pass
    except OSError as exc:
        raise TlsError(
            f"{key} {path}: cannot read it ({exc.strerror}); let the service user read it"
        ) from None


def _no_password() -> bytes:
    return b""


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TlsError(f"{path}: cannot read it ({exc.strerror})") from None


def _chain_problem(tls: TlsConfig, exc: ssl.SSLError) -> str:
    reason = exc.reason or str(exc)
    if "KEY_VALUES_MISMATCH" in reason or "key values mismatch" in reason:
        return (
            f"tls_key_file {tls.key_file} is not the private key of the certificate in "
            f"tls_cert_file {tls.cert_file}: give the key the certificate was issued for"
        )
    if b"ENCRYPTED" in _read(tls.key_file)[:4096]:
        return (
            f"tls_key_file {tls.key_file} is encrypted: give it unencrypted (readable by "
            "the service user only); metaq takes no key passphrase"
        )
    if "PEM" in reason.upper() or "NO_START_LINE" in reason:
        return (
            f"tls_cert_file {tls.cert_file} / tls_key_file {tls.key_file}: not a PEM "
            f"certificate and an unencrypted PEM private key ({reason}); check "
            "that each file holds what its key names"
        )
    return f"tls_cert_file {tls.cert_file} / tls_key_file {tls.key_file}: {reason}"
