"""The broker's auth settings: where they are read from and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from metaq.broker.config import ConfigError, load_config


def test_an_auth_table_and_dotted_flags_set_the_auth_keys(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('[auth]\nenabled = true\nacl_file = "/etc/metaq/acl.json"\n')
    config = load_config(["--config", str(path)])
    assert (config.auth_enabled, config.auth_acl_file) == (True, "/etc/metaq/acl.json")
    config = load_config(["--set", "auth.enabled=true", "--set", "auth_acl_file=/x.json"])
    assert (config.auth_enabled, config.auth_acl_file) == (True, "/x.json")
    assert not load_config([]).auth_enabled


def test_auth_without_an_acl_file_is_refused_saying_how_to_make_one() -> None:
    with pytest.raises(ConfigError, match=r"auth_enabled needs auth_acl_file .*metaq acl init"):
        load_config(["--set", "auth_enabled=true"])
