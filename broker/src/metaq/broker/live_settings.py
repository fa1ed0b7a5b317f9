"""The settings an operator may change on a running broker (``metaq broker config set``),
and the file that keeps them across restarts.

Only these are safe to change live: retention and the disk thresholds are read at each
check, the flush interval at the flusher's next wait, the cold-read budget at the next
cold pull, the log level at once. Every other setting is fixed for the life of the
process (ports, the data directory, segment sizes, replication...), and a change is
refused saying so.

A change is validated as a start-up setting is (the whole config is rebuilt), applied,
then kept in ``live_settings.json`` in the data directory; at start those values are laid
over the config file and flags (and logged), so a live change survives a restart until
it is set again or the file is removed.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from metaq.broker.config import BrokerConfig
from metaq.broker.files import load_json_state, write_json_atomically

log = logging.getLogger(__name__)

FILE_NAME: Final = "live_settings.json"
_FORMAT: Final = 1
LIVE: Final = (
    "store.retention_hours",
    "store.disk_clean_ratio",
    "store.disk_force_clean_ratio",
    "store.disk_full_ratio",
    "store.disk_reserve_bytes",
    "store.flush_interval_ms",
    "cold_read_bytes_per_s",
    "log_level",
)
"""The settings a running broker takes, named as in the config file (``[store]`` keys
with their table) and as ``--set`` takes them."""


class SettingRefused(ValueError):
    """A live change was refused: the setting is unknown or fixed, or the value is wrong."""


def current(config: BrokerConfig, name: str) -> Any:
    """The value of one live setting in ``config``."""
    table, _, key = name.rpartition(".")
    return getattr(config.store if table else config, key)


def _with(config: BrokerConfig, changes: Mapping[str, Any]) -> BrokerConfig:
    """``config`` with ``changes`` (live setting names), validated as at start-up."""
    store = {k.partition(".")[2]: v for k, v in changes.items() if k.startswith("store.")}
    top = {k: v for k, v in changes.items() if not k.startswith("store.")}
    try:
        return dataclasses.replace(config, store=dataclasses.replace(config.store, **store), **top)
    except ValueError as exc:  # ConfigError too
        raise SettingRefused(str(exc)) from None


def _typed(name: str, value: object, like: object) -> object:
    """``value`` (JSON or text) as the setting's type (that of its current value)."""
    try:
        if isinstance(like, bool) or isinstance(value, bool):
            raise TypeError
        if isinstance(like, int):
            if isinstance(value, float) and not value.is_integer():
                raise TypeError
            return int(value)  # type: ignore[call-overload]
        if isinstance(like, float):
            return float(value)  # type: ignore[arg-type]
        if isinstance(value, str):
            return value.upper() if name == "log_level" else value
    except (TypeError, ValueError):
        pass
    raise SettingRefused(f"{name} takes {type(like).__name__} values, not {value!r}")


class LiveSettings:
    """The live settings of one broker: ``apply`` puts a validated config into effect."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE_NAME
        self.overrides: dict[str, Any] = {}
        """What was set live and is kept across restarts, by setting name."""
        load_json_state(
            self.path, _FORMAT, self._load,
            "fix or remove it (the broker then starts with its config file's settings)",
        )  # fmt: skip

    def _load(self, data: Any) -> None:
        unknown = set(data["settings"]) - set(LIVE)
        if unknown:
            raise ValueError(f"settings {sorted(unknown)} cannot be set live")
        self.overrides = dict(data["settings"])

    def laid_over(self, config: BrokerConfig) -> BrokerConfig:
        """``config`` with the kept live settings over it (at start)."""
        if not self.overrides:
            return config
        log.info("settings changed live earlier, kept in %s: %s", self.path, self.overrides)
        return _with(config, self.overrides)

    def set(
        self,
        config: BrokerConfig,
        name: str,
        value: object,
        apply: Callable[[BrokerConfig], None],
    ) -> BrokerConfig:
        """Change one setting: validate, ``apply``, persist; the new config.
        SettingRefused when the setting is not live or the value is wrong."""
        if name not in LIVE:
            if _is_setting(config, name):
                why = (
                    f"{name} cannot be changed on a running broker: set it in the broker's "
                    "config file and restart it"
                )
            else:
                why = f"the broker has no setting {name!r}"
            raise SettingRefused(f"{why}; settings a running broker takes: {', '.join(LIVE)}")
        typed = _typed(name, value, current(config, name))
        new = _with(config, {name: typed})
        apply(new)
        self.overrides[name] = typed
        write_json_atomically(self.path, {"format": _FORMAT, "settings": self.overrides})
        log.warning("setting %s changed live to %r (kept in %s)", name, typed, self.path)
        return new


def _is_setting(config: BrokerConfig, name: str) -> bool:
    table, _, key = name.rpartition(".")
    fields = config.store if table == "store" else config if not table else None
    return fields is not None and key in {f.name for f in dataclasses.fields(fields)}


def set_log_level(level: str) -> None:
    """The broker's log level, for every logger that does not set its own."""
    logging.getLogger().setLevel(level.upper())
