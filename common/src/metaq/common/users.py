"""User identities: access keys, secrets, and the verifiers servers keep instead.

A user holds an access key (its name) and a secret key. Servers store only a verifier
derived SCRAM-SHA-256 style (RFC 5802): ``SaltedPassword = PBKDF2(secret, salt,
iterations)``, ``ClientKey = HMAC(SaltedPassword, "Client Key")``, ``StoredKey =
H(ClientKey)``, ``ServerKey = HMAC(SaltedPassword, "Server Key")``. A proof over a message
is ``ClientKey XOR HMAC(StoredKey, message)``: the server recovers ClientKey with its
StoredKey and checks that it hashes back to it, so a leaked verifier does not let anyone
prove to be the user (it cannot produce ClientKey), and the secret never crosses the wire.

The salt is the access key itself, prefixed: a one-shot proof (a gRPC call, an HTTP
request) needs no round trip to learn it, and access keys are unique within a cluster.
Secrets made by ``metaq acl add-user`` are 32 random bytes, so the salt and iterations
guard only against people who choose weak secrets by hand.

Nothing here does I/O apart from :func:`load_credentials` reading one file.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ACCESS_KEY_ENV: Final = "METAQ_ACCESS_KEY"
SECRET_KEY_ENV: Final = "METAQ_SECRET_KEY"
CREDENTIALS_FILE_ENV: Final = "METAQ_CREDENTIALS_FILE"
ITERATIONS: Final = 4096
"""PBKDF2 rounds for new verifiers (SCRAM's minimum); a client derives its key once."""
MIN_SECRET_CHARS: Final = 16
ACCESS_KEY_PATTERN: Final = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
KEY_BYTES: Final = 32


class CredentialsError(ValueError):
    """Credentials are malformed, half given or unreadable; the message says which."""


def check_access_key(access_key: str) -> None:
    if not ACCESS_KEY_PATTERN.fullmatch(access_key):
        raise CredentialsError(
            f"access key {access_key[:64]!r} is not 1-64 characters from letters, digits and '_.@-'"
        )


def _salt(access_key: str) -> bytes:
    return b"metaq user " + access_key.encode()


def client_keys(
    access_key: str, secret_key: str, iterations: int = ITERATIONS
) -> tuple[bytes, bytes]:
    """ClientKey, which a client proves with, and ServerKey, with which it checks that
    the server holds its verifier (PBKDF2 is slow on purpose: derive them once)."""
    salted = hashlib.pbkdf2_hmac("sha256", secret_key.encode(), _salt(access_key), iterations)
    return (
        hmac.new(salted, b"Client Key", hashlib.sha256).digest(),
        hmac.new(salted, b"Server Key", hashlib.sha256).digest(),
    )


@dataclass(frozen=True, slots=True)
class Verifier:
    """What a server keeps of a user's secret: enough to check proofs, not to make them."""

    stored_key: bytes
    server_key: bytes
    iterations: int = ITERATIONS

    @classmethod
    def make(cls, access_key: str, secret_key: str, iterations: int = ITERATIONS) -> Verifier:
        check_access_key(access_key)
        if len(secret_key) < MIN_SECRET_CHARS:
            raise CredentialsError(
                f"the secret key of {access_key} is {len(secret_key)} characters; it needs "
                f"at least {MIN_SECRET_CHARS} (let `metaq acl add-user` generate one)"
            )
        ck, sk = client_keys(access_key, secret_key, iterations)
        return cls(hashlib.sha256(ck).digest(), sk, iterations)

    def to_json(self) -> dict[str, object]:
        return {
            "stored_key": base64.b64encode(self.stored_key).decode(),
            "server_key": base64.b64encode(self.server_key).decode(),
            "iterations": self.iterations,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Verifier:
        stored, server, iterations = data["stored_key"], data["server_key"], data["iterations"]
        if not (isinstance(stored, str) and isinstance(server, str)):
            raise ValueError("stored_key and server_key must be base64 strings")
        if not isinstance(iterations, int) or iterations < 1:
            raise ValueError("iterations must be a positive integer")
        return cls(base64.b64decode(stored), base64.b64decode(server), iterations)

    def recover(self, message: bytes, proof: bytes) -> bytes | None:
        """The ClientKey behind ``proof`` over ``message``, or None when it is no proof
        of this user's secret."""
        if len(proof) != KEY_BYTES:
            return None
        signature = hmac.new(self.stored_key, message, hashlib.sha256).digest()
        key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.sha256(key).digest(), self.stored_key):
            return None
        return key

    def server_signature(self, message: bytes) -> bytes:
        return hmac.new(self.server_key, message, hashlib.sha256).digest()


def prove(key: bytes, message: bytes) -> bytes:
    """``ClientKey XOR HMAC(H(ClientKey), message)``: the proof a client sends."""
    stored = hashlib.sha256(key).digest()
    signature = hmac.new(stored, message, hashlib.sha256).digest()
    return bytes(a ^ b for a, b in zip(key, signature, strict=True))


def message(purpose: str, *parts: bytes) -> bytes:
    """The bytes a proof covers: ``purpose`` and ``parts``, each length-prefixed so that
    no two lists of parts give the same message."""
    out = bytearray()
    for part in (purpose.encode(), *parts):
        out += len(part).to_bytes(4, "big")
        out += part
    return bytes(out)


def new_secret_key() -> str:
    return base64.urlsafe_b64encode(secrets.token_bytes(KEY_BYTES)).decode().rstrip("=")


@dataclass(frozen=True, slots=True)
class Credentials:
    """A user's access key and secret key, as a client holds them. Never printed."""

    access_key: str
    secret_key: str

    def __post_init__(self) -> None:
        check_access_key(self.access_key)
        if not self.secret_key:
            raise CredentialsError(f"access key {self.access_key} was given without a secret")

    def __repr__(self) -> str:
        return f"Credentials({self.access_key}, secret hidden)"

    def key(self) -> bytes:
        """ClientKey: what proofs are made with."""
        return _derived(self.access_key, self.secret_key)[0]

    def server_key(self) -> bytes:
        return _derived(self.access_key, self.secret_key)[1]


_KEYS: dict[tuple[str, str], tuple[bytes, bytes]] = {}


def _derived(access_key: str, secret_key: str) -> tuple[bytes, bytes]:
    # PBKDF2 takes milliseconds: once per process, not per connection or call.
    keys = _KEYS.get((access_key, secret_key))
    if keys is None:
        keys = _KEYS[(access_key, secret_key)] = client_keys(access_key, secret_key)
    return keys


def load_credentials(
    access_key: str = "",
    secret_key: str = "",
    file: str = "",
    env: Mapping[str, str] | None = None,
) -> Credentials | None:
    """The credentials given as arguments, else in ``file`` (or the file named by
    :data:`CREDENTIALS_FILE_ENV`), else in :data:`ACCESS_KEY_ENV`/:data:`SECRET_KEY_ENV`;
    None when none is given. A credentials file is TOML-like lines ``access_key = ...`` and
    ``secret_key = ...`` (what ``metaq acl add-user --out FILE`` writes)."""
    env = os.environ if env is None else env
    if access_key or secret_key:
        if not (access_key and secret_key):
            raise CredentialsError("give both access_key and secret_key, or neither")
        return Credentials(access_key, secret_key)
    file = file or env.get(CREDENTIALS_FILE_ENV, "")
    if file:
        return _read_file(file)
    access, secret = env.get(ACCESS_KEY_ENV, ""), env.get(SECRET_KEY_ENV, "")
    if access or secret:
        if not (access and secret):
            raise CredentialsError(f"set both {ACCESS_KEY_ENV} and {SECRET_KEY_ENV}, or neither")
        return Credentials(access, secret)
    return None


def _read_file(file: str) -> Credentials:
    try:
        text = Path(file).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CredentialsError(f"credentials file {file}: cannot read it ({exc})") from None
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"')
    access, secret = values.get("access_key", ""), values.get("secret_key", "")
    if not (access and secret):
        raise CredentialsError(
            f"credentials file {file} needs lines 'access_key = ...' and 'secret_key = ...'"
        )
    return Credentials(access, secret)


def credentials_text(credentials: Credentials) -> str:
    """A credentials file's content for ``credentials``."""
    return f'access_key = "{credentials.access_key}"\nsecret_key = "{credentials.secret_key}"\n'


# --- one-shot proofs: gRPC calls and HTTP requests ---------------------------------------

USER_METADATA_KEY: Final = "x-metaq-user"
"""gRPC metadata (and, as ``X-Metaq-User``, an HTTP header) of a user's proof:
``v1:ACCESS_KEY:STAMP_MS:PROOF_HEX``."""
MAX_CLOCK_SKEW_S: Final = 120.0


class ProofError(ValueError):
    """A one-shot proof is missing, malformed, stale or wrong; the message says which
    (never anything secret). ``reason`` is the metric label."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def sign_request(credentials: Credentials, purpose: str, body: bytes, now_s: float) -> str:
    """A proof that ``credentials``' user made this one request: ``purpose`` names it
    (``"grpc /metaq.v1.NameServer/GetRoute"``, ``"http GET /topics"``), ``body`` is its
    bytes (the serialized request, the HTTP body)."""
    stamp = str(int(now_s * 1000))
    msg = message(purpose, credentials.access_key.encode(), stamp.encode(), body)
    return f"v1:{credentials.access_key}:{stamp}:{prove(credentials.key(), msg).hex()}"


def parse_proof(value: str | None) -> tuple[str, str, bytes]:
    """(access key, stamp, proof) of a :func:`sign_request` value; ProofError if malformed."""
    if not value:
        raise ProofError(
            "this server requires a user's proof and the request carried none; give the "
            "client an access_key and secret_key (or METAQ_ACCESS_KEY / METAQ_SECRET_KEY)",
            "unauthenticated",
        )
    parts = value.split(":")
    if len(parts) != 4 or parts[0] != "v1" or not parts[2].isdigit():
        raise ProofError("the user proof is malformed (expected v1:USER:MS:HEX)", "bad_proof")
    try:
        proof = bytes.fromhex(parts[3])
    except ValueError:
        raise ProofError("the user proof is malformed (not hex)", "bad_proof") from None
    return parts[1], parts[2], proof


def verify_request(
    verifier: Verifier | None,
    access_key: str,
    stamp: str,
    proof: bytes,
    purpose: str,
    body: bytes,
    now_s: float,
) -> None:
    """Raise ProofError unless ``proof`` is the user's for this request, in the window."""
    skew = abs(int(stamp) / 1000 - now_s)
    if skew > MAX_CLOCK_SKEW_S:
        raise ProofError(
            f"the proof of {access_key} is dated {skew:.0f} s from this server's clock (at "
            f"most {MAX_CLOCK_SKEW_S:.0f} s); synchronise the clocks (NTP)",
            "clock",
        )
    msg = message(purpose, access_key.encode(), stamp.encode(), body)
    if verifier is None or verifier.recover(msg, proof) is None:
        raise ProofError(
            f"access key {access_key}: unknown user or wrong secret key (or the request "
            "was altered); check the client's access_key/secret_key",
            "unauthenticated",
        )
