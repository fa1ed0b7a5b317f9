"""Nameserver settings: defaults, TOML file, flags over the file, refusals that say why."""

from __future__ import annotations

from pathlib import Path

import pytest

from metaq.nameserver.config import NameServerConfig, load_config


def test_with_no_file_and_no_flags_it_listens_on_the_local_default_port() -> None:
    config = load_config([])

    assert config == NameServerConfig()
    assert (config.listen_host, config.grpc_port, config.http_port) == ("127.0.0.1", 9876, None)
    assert config.broker_expiry_s == 10.0


def test_flags_override_the_file_and_the_file_overrides_defaults(tmp_path: Path) -> None:
    path = tmp_path / "nameserver.toml"
    path.write_text(
        'grpc_port = 7000\nhttp_port = 7001\nbroker_expiry_s = 30\nlog_level = "DEBUG"\n'
    )

    config = load_config(["--config", str(path), "--grpc-port", "0", "--broker-expiry-s", "2.5"])

    assert (config.grpc_port, config.http_port) == (0, 7001)
    assert config.broker_expiry_s == 2.5
    assert config.log_level == "DEBUG"


def test_an_unknown_setting_in_the_file_is_named_with_the_known_ones(tmp_path: Path) -> None:
    path = tmp_path / "nameserver.toml"
    path.write_text("broker_timeout_s = 3\n")

    with pytest.raises(ValueError, match=r"unknown nameserver settings broker_timeout_s.*known:"):
        load_config(["--config", str(path)])


def test_a_setting_of_the_wrong_type_in_the_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nameserver.toml"
    path.write_text('grpc_port = "9876"\n')

    with pytest.raises(ValueError, match="grpc_port must be of type int, not '9876'"):
        load_config(["--config", str(path)])


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"grpc_port": 70000}, "grpc_port=70000 is not a TCP port"),
        ({"http_port": -1}, "http_port=-1 is not a TCP port"),
        ({"broker_expiry_s": 0}, "broker_expiry_s must be positive"),
        ({"expiry_scan_interval_s": 20.0}, "expiry_scan_interval_s must be positive"),
        ({"log_level": "LOUD"}, "log_level must be one of"),
    ],
)
def test_invalid_settings_are_refused_at_start_up(
    settings: dict[str, object], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        NameServerConfig(**settings)  # type: ignore[arg-type]
