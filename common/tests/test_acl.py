"""Users' verifiers, grants and the per-frame signatures, without sockets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from metaq.common import acl, frame_auth
from metaq.common.acl import Acl, AclError, Grant, PermissionDenied, User
from metaq.common.framing import FLAG_SIGNED, FrameDecoder, FrameType, encode_frame
from metaq.common.users import (
    Credentials,
    CredentialsError,
    Verifier,
    load_credentials,
    message,
    prove,
)

SECRET = "s3cret-key-of-app1-xxxxxxxx"


def test_verifier_accepts_the_users_proof_and_nothing_made_from_the_verifier() -> None:
    verifier = Verifier.make("app1", SECRET)
    key = Credentials("app1", SECRET).key()
    msg = message("test", b"nonce")
    assert verifier.recover(msg, prove(key, msg)) == key
    assert verifier.recover(message("test", b"other"), prove(key, msg)) is None
    # Whoever holds only the verifier can compute HMAC(StoredKey, msg) but not ClientKey.
    forged = prove(verifier.stored_key, msg)
    assert verifier.recover(msg, forged) is None
    wrong = Credentials("app1", SECRET + "x").key()
    assert verifier.recover(msg, prove(wrong, msg)) is None


def test_acl_file_holds_no_secret_and_round_trips(tmp_path: Path) -> None:
    user = User("app1", Verifier.make("app1", SECRET))
    table = Acl().with_user(user).grant("app1", Grant.parse("pub", "topic:orders*"))
    path = tmp_path / "acl.json"
    acl.save(path, table)
    assert SECRET not in path.read_text()
    assert path.stat().st_mode & 0o077 == 0
    loaded = acl.load(path)
    assert loaded.version == 2
    assert loaded.user("app1") == table.user("app1")


def test_grants_match_exact_names_prefixes_and_group_topics() -> None:
    table = Acl().with_user(User("app1", Verifier.make("app1", SECRET)))
    for perm, resource in (("pub", "topic:orders*"), ("sub", "group:billing")):
        table = table.grant("app1", Grant.parse(perm, resource))
    user = table.user("app1")
    assert user is not None
    acl.check(user, "pub", "topic", "orders-eu")
    acl.check(user, "sub", "group", "billing")
    acl.check(user, "pub", "topic", "%RETRY%billing")  # follows the group's sub
    acl.check(user, "sub", "topic", "%DLQ%billing")
    with pytest.raises(PermissionDenied) as denied:
        acl.check(user, "pub", "topic", "B")
    assert str(denied.value) == (
        "user app1 lacks pub on topic B; grant it with metaq acl grant app1 pub topic:B"
    )
    with pytest.raises(PermissionDenied, match="lacks sub on group other"):
        acl.check(user, "sub", "topic", "%RETRY%other")
    with pytest.raises(PermissionDenied, match="lacks sub on topic orders"):
        acl.check(user, "sub", "topic", "orders")


def test_admin_on_cluster_may_do_anything_and_cidrs_restrict_sources() -> None:
    table = Acl().with_user(User("root", Verifier.make("root", SECRET)))
    table = table.grant("root", Grant.parse("admin", "cluster"))
    table = table.set_cidrs("root", acl.parse_cidrs(["10.0.0.0/8"]))
    root = table.user("root")
    assert root is not None
    acl.check(root, "pub", "topic", "anything")
    acl.check_address(root, "10.1.2.3")
    with pytest.raises(PermissionDenied, match=r"may not connect from 127\.0\.0\.1"):
        acl.check_address(root, "127.0.0.1")


@pytest.mark.parametrize(
    ("perm", "resource", "why"),
    [
        ("write", "topic:a", "not one of"),
        ("pub", "queue:a", "is not topic:NAME"),
        ("pub", "topic:", "is not topic:NAME"),
        ("pub", "topic:a*b", "may only end"),
    ],
)
def test_bad_grants_say_what_is_wrong(perm: str, resource: str, why: str) -> None:
    with pytest.raises(AclError, match=why):
        Grant.parse(perm, resource)


def test_a_damaged_acl_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "acl.json"
    path.write_text(json.dumps({"version": 1, "users": {"a": {"grants": []}}}))
    with pytest.raises(AclError, match=str(path)):
        acl.load(path)


def test_credentials_come_from_arguments_file_or_environment(tmp_path: Path) -> None:
    assert load_credentials(env={}) is None
    file = tmp_path / "creds"
    file.write_text(f'access_key = "app1"\nsecret_key = "{SECRET}"\n')
    assert load_credentials(file=str(file), env={}) == Credentials("app1", SECRET)
    env = {"METAQ_ACCESS_KEY": "app2", "METAQ_SECRET_KEY": SECRET}
    assert load_credentials(env=env) == Credentials("app2", SECRET)
    with pytest.raises(CredentialsError, match="both"):
        load_credentials(env={"METAQ_ACCESS_KEY": "app2"})
    assert SECRET not in repr(Credentials("app1", SECRET))


def _signed(key: bytes, request_id: int, payload: bytes, now_ms: int) -> bytes:
    header = b"\x0a\x01A"
    trailer = frame_auth.sign(
        key, FrameType.SEND, request_id, FLAG_SIGNED, header, [payload], now_ms
    )
    parts = encode_frame(FrameType.SEND, request_id, header, [payload, trailer], FLAG_SIGNED)
    return b"".join(bytes(p) for p in parts)


def test_signed_frames_are_checked_for_mac_time_and_rising_ids() -> None:
    key = b"k" * 32
    now = 1_700_000_000_000
    verifier = frame_auth.FrameVerifier(key, "app1")
    (frame,) = FrameDecoder().feed(_signed(key, 5, b"records", now))
    assert bytes(verifier.verify(frame, now).payload) == b"records"
    with pytest.raises(PermissionDenied, match="replayed") as replay:
        verifier.verify(frame, now)
    assert replay.value.reason == "replay"
    other = frame_auth.FrameVerifier(b"x" * 32, "app1")
    with pytest.raises(PermissionDenied, match="does not match"):
        other.verify(frame, now)
    (late,) = FrameDecoder().feed(_signed(key, 6, b"records", now - 600_000))
    with pytest.raises(PermissionDenied, match="clock"):
        verifier.verify(late, now)
    tampered = bytearray(_signed(key, 7, b"records", now))
    tampered[-frame_auth.TRAILER - 1] ^= 1  # the last payload byte
    (bad,) = FrameDecoder().feed(bytes(tampered))
    with pytest.raises(PermissionDenied, match="altered"):
        verifier.verify(bad, now)


def test_view_is_the_consoles_read_only_role_on_the_cluster_only() -> None:
    viewer = User(
        "v",
        Verifier.make("v", "viewer-secret-key-0123"),
        frozenset({Grant.parse("view", "cluster")}),
    )
    assert viewer.is_viewer and not viewer.is_admin
    with pytest.raises(AclError, match="view is granted on cluster only"):
        Grant.parse("view", "topic:orders")
    with pytest.raises(PermissionDenied):
        acl.check(viewer, "admin", "cluster", "")
