"""The nameserver's auth settings: TOML table, flags, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from metaq.nameserver.config import load_config


def test_an_auth_table_and_flags_set_the_auth_keys(tmp_path: Path) -> None:
    path = tmp_path / "nameserver.toml"
    path.write_text('[auth]\nenabled = true\nacl_file = "/etc/metaq/acl.json"\n')
    config = load_config(["--config", str(path)])
    assert (config.auth_enabled, config.auth_acl_file) == (True, "/etc/metaq/acl.json")
    config = load_config(["--auth-enabled", "true", "--auth-acl-file", "/x.json"])
    assert (config.auth_enabled, config.auth_acl_file) == (True, "/x.json")
    assert not load_config([]).auth_enabled


def test_auth_without_an_acl_file_is_refused() -> None:
    with pytest.raises(ValueError, match="auth_enabled needs auth_acl_file"):
        load_config(["--auth-enabled", "true"])


def test_a_non_boolean_auth_enabled_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nameserver.toml"
    path.write_text('auth_enabled = "yes"\n')
    with pytest.raises(ValueError, match="auth_enabled: expected true or false, got 'yes'"):
        load_config(["--config", str(path)])
