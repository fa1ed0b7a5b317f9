"""Broker config: defaults, the TOML file, flags over the file, and errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from metaq.broker.__main__ import main as broker_main
from metaq.broker.config import BrokerConfig, ConfigError, load_config
from metaq.broker.store import FlushMode


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return path


def test_defaults_run_without_a_file() -> None:
    config = load_config([])

    assert config == BrokerConfig()
    assert (config.data_port, config.http_port) == (10911, 10912)
    assert config.is_master
    assert not config.auto_create_topics
    assert config.default_queue_count == 8
    assert config.store.data_dir == config.data_dir
    assert config.store.flush_mode is FlushMode.ASYNC


def test_file_sets_top_level_and_store_keys(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        broker_name = "broker-b"
        broker_id = 1
        computer_room = "hz-1"
        data_dir = "/var/lib/metaq"
        nameservers = ["10.0.0.1:9876", "10.0.0.2:9876"]
        flush_mode = "sync"
        auto_create_topics = true

        [store]
        commitlog_segment_bytes = 67_108_864
        flush_timeout_ms = 2000
        disk_full_ratio = 0.95
        """,
    )

    config = load_config(["--config", str(path)])

    assert config.broker_name == "broker-b"
    assert not config.is_master
    assert config.computer_room == "hz-1"
    assert config.nameservers == ("10.0.0.1:9876", "10.0.0.2:9876")
    assert config.auto_create_topics
    assert config.store.commitlog_segment_bytes == 64 * 1024 * 1024
    assert config.store.flush_timeout_ms == 2000
    assert config.store.disk_full_ratio == 0.95
    # The store follows the broker's own data_dir and flush mode.
    assert config.store.data_dir == Path("/var/lib/metaq")
    assert config.store.flush_mode is FlushMode.SYNC


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'data_port = 20911\nflush_mode = "sync"\nauto_create_topics = true\n'
        "[store]\nflush_timeout_ms = 2000\n",
    )

    config = load_config(
        [
            "--config", str(path),
            "--data-port", "0",
            "--flush-mode", "async",
            "--no-auto-create-topics",
            "--nameserver", "ns1:9876",
            "--nameserver", "ns2:9876",
            "--set", "store.flush_timeout_ms=300",
            "--set", "default_queue_count=16",
        ]
    )  # fmt: skip

    assert config.data_port == 0
    assert config.store.flush_mode is FlushMode.ASYNC
    assert not config.auto_create_topics
    assert config.nameservers == ("ns1:9876", "ns2:9876")
    assert config.store.flush_timeout_ms == 300
    assert config.default_queue_count == 16


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("data_port = 70000", "data_port must be a TCP port"),
        ('data_port = "ten"', "data_port: expected an integer, got 'ten'"),
        ('flush_mode = "sometimes"', "flush_mode: expected one of 'sync', 'async'"),
        ("auto_create_topics = 1", "auto_create_topics: expected true or false"),
        ("broker_id = -1", "broker_id must be 0"),
        ('nameservers = ["no-port"]', "'no-port' is not HOST:PORT"),
        ("default_queue_count = 0", "default_queue_count must be 1-65536"),
        ("idle_poll_us = 20000", "idle_poll_us must be 0-10000"),
        ("nice = -21", "nice must be -20 (highest priority) to 19 (lowest)"),
        ("max_connections = 0", "max_connections must be positive"),
        ("idle_timeout_s = -1", "idle_timeout_s must be 0 (off) or positive"),
        ("fd_reserve = 10", "fd_reserve must be at least 64"),
        ("max_buffered_request_bytes = 1048576", "must be at least max_frame_bytes="),
        ("max_connection_write_bytes = 1024", "max_connection_write_bytes must be at least"),
        (
            "max_buffered_request_bytes = 67108864",
            "plus small_request_reserve_bytes=16777216",
        ),
        ("small_request_max_bytes = 0", "small_request_max_bytes=0 must be positive"),
        ("min_request_bytes_per_s = -1", "min_request_bytes_per_s must be 0 (off)"),
        ("request_arrival_window_s = 0", "request_arrival_window_s must be positive"),
        ("max_connection_inflight_requests = 0", "max_connection_inflight_requests must be"),
        ("max_parked_pulls = -1", "max_parked_pulls must be 0 (never park) or positive"),
        ("cold_read_bytes_per_s = 4096", "cold_read_bytes_per_s must be 0 (no budget) or at"),
        ("max_consumer_groups = 0", "max_consumer_groups must be positive"),
        ("colour = 3", "unknown key 'colour'"),
        ("[store]\nsegment_size = 3", "unknown store key 'segment_size'"),
        ('[store]\ndata_dir = "/x"', "unknown store key 'data_dir'"),
        ("[store]\nflush_timeout_ms = 0", "flush_timeout_ms must be positive"),
        ("[store]\nretention_hours = -1", "retention_hours=-1.0 must be positive"),
        ("[store]\nretention_hours = 0", "retention_hours=0.0 must be positive"),
        ("[store]\nretention_hours = nan", "retention_hours=nan must be positive"),
        ("[store]\nclean_interval_s = -1", "clean_interval_s must be positive"),
        ("[store]\ndisk_reserve_bytes = -1", "disk_reserve_bytes must be 0 or more"),
        ("[store]\ndisk_check_interval_ms = 0", "disk_check_interval_ms must be positive"),
        ("[store]\nio_error_limit = 0", "io_error_limit must be positive"),
        ("[store]\nflush_dirty_bytes = -5", "flush_dirty_bytes must be positive"),
        ("[store]\nmax_message_bytes = 104857600", "max_frame_bytes="),
        ("store = 3", "'store' must be a table"),
        ("data_port = ", "not valid TOML"),
    ],
)
def test_bad_values_are_refused_naming_the_key(tmp_path: Path, text: str, words: str) -> None:
    path = write(tmp_path, text)

    with pytest.raises(ConfigError) as caught:
        load_config(["--config", str(path)])

    assert words in str(caught.value)


def test_errors_name_the_file_or_the_flag(tmp_path: Path) -> None:
    path = write(tmp_path, 'http_port = "x"')

    with pytest.raises(ConfigError, match=rf"{path}: http_port"):
        load_config(["--config", str(path)])
    with pytest.raises(ConfigError, match="flag --http-port: expected an integer"):
        load_config(["--http-port", "x"])
    with pytest.raises(ConfigError, match=r"flag --set store\.flush_timeout_ms"):
        load_config(["--set", "store.flush_timeout_ms=soon"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(["--set", "flush_timeout_ms"])


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(["--config", str(tmp_path / "absent.toml")])


def test_check_config_judges_the_file_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write(tmp_path, 'broker_name = "broker-b"\n[store]\nflush_timeout_ms = 2000\n')
    bad = tmp_path / "bad.toml"
    bad.write_text('broker_name = "broker-b"\nbogus_key = 1\n')

    # A broker that started would serve until a signal: these return at once.
    assert broker_main(["--check-config", str(good)]) == 0
    assert f"{good}: a valid broker config" in capsys.readouterr().out
    assert broker_main(["--check-config", str(bad)]) == 2
    assert f"{bad}: bogus_key: unknown key 'bogus_key'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        broker_main(["--config", str(good), "--check-config", str(good)])
    assert "not allowed with argument" in capsys.readouterr().err
