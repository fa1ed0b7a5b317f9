from __future__ import annotations

import logging
from pathlib import Path

import pytest

from metaq.common import auth
from metaq.common.auth import (
    ENV_VAR,
    AuthFailed,
    ClusterSecret,
    SecretError,
    call_metadata,
    load_secret,
    require_secret,
    sign_call,
    sign_http,
    verify_call,
    verify_http,
)
from metaq.common.server_names import TARGET_METADATA_KEY, is_loopback

SECRET = ClusterSecret(b"0123456789abcdef0123", "test")
OTHER = ClusterSecret(b"fedcba9876543210fedc", "test")
NOW = 1_700_000_000.0


NS = "10.0.0.5:9876"


def test_a_call_signed_with_the_secret_verifies() -> None:
    proof = sign_call(SECRET, "Switchover", NS, b"request", NOW)

    verify_call(SECRET, "Switchover", NS, b"request", proof, NOW + 5)


@pytest.mark.parametrize(
    ("method", "target", "body", "secret", "now", "why"),
    [
        ("Switchover", NS, b"request", OTHER, NOW, "does not match"),
        ("RegisterBroker", NS, b"request", SECRET, NOW, "does not match"),
        ("Switchover", "10.0.0.6:9876", b"request", SECRET, NOW, "does not match"),
        ("Switchover", NS, b"another request", SECRET, NOW, "does not match"),
        ("Switchover", NS, b"request", SECRET, NOW + auth.MAX_CLOCK_SKEW_S + 1, "synchronise"),
        ("Switchover", NS, b"request", SECRET, NOW - auth.MAX_CLOCK_SKEW_S - 1, "synchronise"),
    ],
)
def test_a_proof_for_anything_else_is_refused(
    method: str, target: str, body: bytes, secret: ClusterSecret, now: float, why: str
) -> None:
    proof = sign_call(SECRET, "Switchover", NS, b"request", NOW)

    with pytest.raises(AuthFailed, match=why):
        verify_call(secret, method, target, body, proof, now)


@pytest.mark.parametrize("proof", [None, "", "v1", "v2:1:ab", "v1:x:ab", "v1:1700000000000:zz"])
def test_a_missing_or_malformed_proof_is_refused_saying_what_to_configure(
    proof: str | None,
) -> None:
    with pytest.raises(AuthFailed) as caught:
        verify_call(SECRET, "Switchover", NS, b"", proof, NOW)

    assert "Switchover" in str(caught.value)


def test_an_http_proof_covers_its_purpose_and_body_and_is_no_grpc_proof() -> None:
    purpose = "http PUT 10.0.0.5:10912 00ff00ff00ff00ff /topics/A?x=1"
    proof = sign_http(SECRET, purpose, b"{}", NOW)

    verify_http(SECRET, purpose, b"{}", proof, NOW + 5)
    for other, body in ((purpose.replace("PUT", "DELETE"), b"{}"),
                        (purpose.replace("10.0.0.5", "10.0.0.6"), b"{}"),
                        (purpose, b'{"perm": "read-only"}')):  # fmt: skip
        with pytest.raises(AuthFailed, match="does not match this server's cluster secret"):
            verify_http(SECRET, other, body, proof, NOW)
    grpc_purpose = purpose.removeprefix("http ")  # the same words, as a gRPC call's
    method, target = grpc_purpose.split(" ", 1)
    with pytest.raises(AuthFailed, match="does not match"):
        verify_call(SECRET, method, target, b"{}", proof, NOW)
    for grpc_proof in (
        sign_call(SECRET, method, target, b"{}", NOW),
        sign_call(SECRET, purpose, "", b"{}", NOW),
    ):
        with pytest.raises(AuthFailed, match="does not match"):
            verify_http(SECRET, purpose, b"{}", grpc_proof, NOW)


def test_no_secret_sends_no_metadata() -> None:
    assert call_metadata(None, "Session", NS, b"", NOW) == ()
    metadata = dict(call_metadata(SECRET, "Session", NS, b"", NOW))
    assert metadata.keys() == {auth.METADATA_KEY, TARGET_METADATA_KEY}
    assert metadata[TARGET_METADATA_KEY] == NS
    verify_call(SECRET, "Session", NS, b"", metadata[auth.METADATA_KEY], NOW)


def test_replica_proofs_depend_on_role_identity_both_nonces_and_the_provers_address() -> None:
    a, b = b"a" * 16, b"b" * 16
    here = "10.0.0.1:9000"
    base = auth.replica_proof(SECRET, auth.MASTER, "g", 1, a, b, here)

    assert auth.check_proof(base, auth.replica_proof(SECRET, auth.MASTER, "g", 1, a, b, here))
    for other in (
        auth.replica_proof(SECRET, auth.SLAVE, "g", 1, a, b, here),
        auth.replica_proof(SECRET, auth.MASTER, "h", 1, a, b, here),
        auth.replica_proof(SECRET, auth.MASTER, "g", 2, a, b, here),
        auth.replica_proof(SECRET, auth.MASTER, "g", 1, b, a, here),
        auth.replica_proof(OTHER, auth.MASTER, "g", 1, a, b, here),
        # The same master's answer, checked by a slave that dialled a relay elsewhere.
        auth.replica_proof(SECRET, auth.MASTER, "g", 1, a, b, "10.0.0.2:9000"),
    ):
        assert not auth.check_proof(base, other)


def test_a_session_proof_is_over_the_broker_it_names() -> None:
    x = auth.session_identity("c1", "broker-x", 0, "10.0.0.1:9000")
    y = auth.session_identity("c1", "broker-y", 0, "10.0.0.1:9000")
    metadata = dict(auth.session_metadata(SECRET, NS, x, NOW))

    assert metadata[auth.SESSION_IDENTITY_KEY] == x
    proof = metadata[auth.METADATA_KEY]
    assert isinstance(proof, str)
    assert verify_call(SECRET, "Session", NS, x, proof, NOW) == NOW
    for target, body in ((NS, y), (NS, b""), ("10.0.0.6:9876", x)):
        with pytest.raises(AuthFailed, match="does not match"):
            verify_call(SECRET, "Session", target, body, proof, NOW)
    # Without a secret the identity still goes, binding the stream, with no proof.
    assert auth.session_metadata(None, NS, x, NOW) == ((auth.SESSION_IDENTITY_KEY, x),)


def test_the_raft_password_is_derived_and_not_the_secret() -> None:
    password = SECRET.raft_password()

    assert password == ClusterSecret(b"0123456789abcdef0123", "elsewhere").raft_password()
    assert "0123456789abcdef" not in password
    assert password != OTHER.raft_password()
    assert "0123" not in repr(SECRET)


def test_the_secret_comes_from_the_file_before_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"0123456789abcdef0123\n")
    path.chmod(0o600)

    from_file = load_secret(str(path), {ENV_VAR: "fedcba9876543210fedc"})
    from_env = load_secret("", {ENV_VAR: "0123456789abcdef0123"})

    assert from_file is not None and from_env is not None
    assert from_file.raft_password() == from_env.raft_password() == SECRET.raft_password()
    assert load_secret("", {}) is None


def test_a_short_or_unreadable_secret_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SecretError, match="at least 16"):
        load_secret("", {ENV_VAR: "short"})
    with pytest.raises(SecretError, match=r"cannot read it .*chmod 600"):
        load_secret(str(tmp_path / "missing"), {})


def test_a_secret_file_others_may_read_is_used_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"0123456789abcdef0123")
    path.chmod(0o644)

    with caplog.at_level(logging.WARNING):
        assert load_secret(str(path), {}) is not None

    assert "chmod 600" in caplog.text


def test_a_secret_is_required_beyond_loopback_and_optional_on_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(SecretError, match=r"because listen_host '0\.0\.0\.0' is not loopback"):
        require_secret(None, "the broker", ["listen_host '0.0.0.0' is not loopback"])
    with caplog.at_level(logging.WARNING):
        assert require_secret(None, "the broker", []) is None
    assert "unauthenticated" in caplog.text
    assert require_secret(SECRET, "the broker", ["whatever"]) is SECRET


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True),
     ("localhost", True), ("0.0.0.0", False), ("10.0.0.1", False), ("example.com", False)],
)  # fmt: skip
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
