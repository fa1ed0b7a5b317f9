"""The servers' ACL source: the start-up warning, refusals, and reloading."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from metaq.common import acl
from metaq.common.acl import Acl, Grant, User
from metaq.common.acl_source import AclSource, AuthConfigError, open_source
from metaq.common.users import Verifier


def test_auth_off_warns_that_anyone_is_served(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert open_source(False, "", "the broker") is None
    assert "the broker runs with auth_enabled = false: it serves ANYONE" in caplog.text


def test_auth_on_needs_an_existing_acl_file(tmp_path: Path) -> None:
    with pytest.raises(AuthConfigError, match="needs auth_acl_file"):
        open_source(True, "", "the broker")
    with pytest.raises(AuthConfigError, match="does not exist: create it with"):
        open_source(True, str(tmp_path / "missing.json"), "the broker")
    with pytest.raises(AuthConfigError, match="needs the cluster secret as well"):
        open_source(True, str(tmp_path / "missing.json"), "the broker", False)


def test_a_change_is_taken_and_a_broken_file_keeps_the_last_good_acl(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "acl.json"
    user = User("app1", Verifier.make("app1", "app1-secret-key-0123456"))
    acl.save(path, Acl().with_user(user))
    source = AclSource(path)
    assert not source.refresh()
    acl.save(path, source.acl.grant("app1", Grant.parse("pub", "topic:A")))
    assert source.refresh()
    app1 = source.acl.user("app1")
    assert app1 is not None and app1.allows("pub", "topic", "A")
    path.write_text("{ not json")
    os.utime(path, ns=(1, 1))  # a new stamp even within the same clock tick
    with caplog.at_level(logging.ERROR):
        assert not source.refresh()
    assert "keeping ACL version 2 in force" in caplog.text
    assert source.acl.version == 2


def test_a_newer_acl_handed_over_is_enforced_and_kept_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "acl.json"
    user = User("app1", Verifier.make("app1", "app1-secret-key-0123456"))
    first = Acl().with_user(user)
    acl.save(path, first)
    source = AclSource(path)
    newer = first.grant("app1", Grant.parse("pub", "topic:A"))
    assert source.adopt(newer, "the nameservers")
    assert source.acl == newer and acl.load(path) == newer
    assert not source.refresh()  # its own write is no change to reload
    assert not source.adopt(first, "the nameservers")  # never back to an older one
    assert not source.adopt_text(b"not json", "the nameservers")
    assert source.acl == newer
    # Same version, other grants (a file edited apart): the cluster's wins when told so.
    apart = first.grant("app1", Grant.parse("sub", "group:g"))
    assert apart.version == newer.version
    assert not source.adopt(apart, "the nameservers")
    assert source.adopt(apart, "the nameservers", same_version=True)
    assert acl.load(path) == apart
