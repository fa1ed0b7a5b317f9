"""Nameserver settings: defaults, TOML file, flags over the file, refusals that say why."""

from __future__ import annotations

from pathlib import Path

import pytest

from metaq.nameserver.__main__ import main as nameserver_main
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

    with pytest.raises(ValueError, match=r"unknown key 'broker_timeout_s' \(known: .*grpc_port"):
        load_config(["--config", str(path)])


def test_a_setting_of_the_wrong_type_in_the_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nameserver.toml"
    path.write_text('grpc_port = "9876"\n')

    with pytest.raises(ValueError, match="grpc_port: expected an integer, got '9876'"):
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


def test_the_controller_is_of_one_by_default_and_takes_peers_from_file_or_flag(
    tmp_path: Path,
) -> None:
    path = tmp_path / "nameserver.toml"
    path.write_text(
        'controller_address = "10.0.0.1:9880"\n'
        'controller_peers = ["10.0.0.1:9880", "10.0.0.2:9880", "10.0.0.3:9880"]\n'
        'controller_dir = "/var/lib/metaq/controller"\n'
        "master_detection_ms = 1500\n"
    )

    default = load_config([])
    from_file = load_config(["--config", str(path)])
    from_flag = load_config(
        ["--config", str(path), "--controller-peers", "10.0.0.1:9880, 10.0.0.4:9880"]
    )

    assert (default.controller_address, default.controller_peers) == ("", ())
    assert (default.master_detection_ms, default.bootstrap_grace_ms) == (3000, 5000)
    assert from_file.controller_peers == ("10.0.0.1:9880", "10.0.0.2:9880", "10.0.0.3:9880")
    assert from_file.controller_dir == "/var/lib/metaq/controller"
    assert from_file.master_detection_ms == 1500
    assert from_flag.controller_peers == ("10.0.0.1:9880", "10.0.0.4:9880")


def test_controller_peers_in_the_file_must_be_a_list_of_strings(tmp_path: Path) -> None:
    path = tmp_path / "nameserver.toml"
    path.write_text('controller_peers = "10.0.0.2:9880"\n')

    with pytest.raises(
        ValueError, match=r"controller_peers: expected a list of strings, got '10\.0\.0\.2:9880'"
    ):
        load_config(["--config", str(path)])


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"controller_address": "nowhere"}, "controller address 'nowhere' is not host:port"),
        ({"controller_peers": ("h:1",)}, "controller_peers needs controller_address"),
        (
            {"controller_address": "h:1", "controller_peers": ("h:2", "h:2")},
            "lists an address twice",
        ),
        ({"master_detection_ms": 0}, "master_detection_ms must be positive"),
        ({"bootstrap_grace_ms": -1}, "bootstrap_grace_ms must not be negative"),
    ],
)
def test_invalid_controller_settings_are_refused(settings: dict[str, object], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        NameServerConfig(**settings)  # type: ignore[arg-type]


def test_check_config_judges_the_file_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "nameserver.toml"
    good.write_text("grpc_port = 7000\n")
    bad = tmp_path / "bad.toml"
    bad.write_text("grpc_port = 7000\ngrcp_port = 7001\n")

    # A nameserver that started would serve until a signal: these return at once.
    assert nameserver_main(["--check-config", str(good)]) == 0
    assert f"{good}: a valid nameserver config" in capsys.readouterr().out
    assert nameserver_main(["--check-config", str(bad)]) == 2
    assert f"{bad}: grcp_port: unknown key 'grcp_port'" in capsys.readouterr().err
