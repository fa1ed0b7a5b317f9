"""Settings changed on a running broker: which are taken, how values are read, what is
refused, and that they are kept for the next start."""

from __future__ import annotations

from pathlib import Path

import pytest

from metaq.broker.config import BrokerConfig
from metaq.broker.live_settings import LiveSettings, SettingRefused, current


def _config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(data_dir=tmp_path)


def test_a_live_setting_is_applied_and_laid_over_the_config_at_the_next_start(
    tmp_path: Path,
) -> None:
    applied: list[BrokerConfig] = []
    settings = LiveSettings(tmp_path)
    config = settings.set(_config(tmp_path), "store.retention_hours", "12", applied.append)
    config = settings.set(config, "log_level", "debug", applied.append)
    assert current(config, "store.retention_hours") == 12.0
    assert [current(c, "log_level") for c in applied] == ["INFO", "DEBUG"]

    again = LiveSettings(tmp_path).laid_over(_config(tmp_path))
    assert (again.store.retention_hours, again.log_level) == (12.0, "DEBUG")


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("data_port", 1, "data_port cannot be changed on a running broker"),
        ("store.commitlog_segment_bytes", 1, "cannot be changed on a running broker"),
        ("nonsense", 1, "the broker has no setting 'nonsense'"),
        ("store.disk_reserve_bytes", 1.5, "takes int values, not 1.5"),
        ("store.disk_reserve_bytes", True, "takes int values, not True"),
        ("store.retention_hours", 0, "retention_hours=0.0 must be positive"),
        ("store.disk_clean_ratio", 0.95, "need 0 < disk_clean_ratio <= disk_force_clean_ratio"),
        ("log_level", "LOUD", "log_level must be DEBUG, INFO, WARNING or ERROR"),
    ],
)
def test_a_fixed_or_unknown_setting_or_a_wrong_value_is_refused_and_nothing_kept(
    tmp_path: Path, name: str, value: object, error: str
) -> None:
    applied: list[BrokerConfig] = []
    settings = LiveSettings(tmp_path)
    with pytest.raises(SettingRefused, match=error):
        settings.set(_config(tmp_path), name, value, applied.append)
    assert applied == []
    assert settings.overrides == {}
    assert not settings.path.exists()
