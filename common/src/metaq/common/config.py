"""The one config loader: settings from TOML files, flags and option maps, typed and checked.

Every component keeps its settings in a frozen dataclass (or, for the Spark source, a map
of option names to types); a :class:`Schema` holds the keys it takes and the type of each.
A value reaches the schema as a :class:`Setting`: the raw value, where it came from, and
whether it is text to parse (a flag, a Spark option) or a typed TOML value. msgspec checks
the type and any ``msgspec.Meta`` bounds. A refusal is a :class:`ConfigError` naming the
key and where it was given, the value, and what is allowed:

    broker.toml: data_port: expected an integer, got 'ten'
    flag --flush-mode: expected one of 'sync', 'async', got 'sometimes'
    option 'minPartitions': expected an integer of at least 1, got '0'

Checks between settings (a port range, one value bounding another) stay in the
dataclass's ``__post_init__``; :meth:`Schema.build` reports their ``ValueError`` as a
ConfigError too.
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
import typing
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, TypeVar

import msgspec
import msgspec.inspect as mi

T = TypeVar("T")

_BOOLEANS: Final = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


class ConfigError(ValueError):
    """A setting is unknown or malformed, or settings disagree; the message names the key,
    where it was given and what is allowed."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One raw value on its way to a typed field."""

    value: object
    origin: str
    """Names the key and where it was given: ``broker.toml: data_port``, ``flag --data-port``."""
    text: bool = False
    """A string here is text to parse for the key's type (``true``, ``1_048_576``, ``a, b``),
    as flags and Spark options are, rather than a typed TOML value."""


class Schema:
    """The keys one component takes and the type of each."""

    def __init__(
        self,
        hints: Mapping[str, Any],
        *,
        noun: str = "key",
        also: Iterable[str] = (),
        error: type[ConfigError] = ConfigError,
    ) -> None:
        """``noun`` names a key in errors (``store key``, ``option``); ``also`` adds to the
        list of known keys an unknown one is answered with (``[store]``); ``error`` is the
        ConfigError subclass raised."""
        self.hints: Mapping[str, Any] = MappingProxyType(dict(hints))
        self._folded = {name.lower(): name for name in hints}
        self._noun = noun
        self._known = ", ".join([*sorted(hints), *also])
        self._error = error

    @classmethod
    def of(cls, target: type, *, exclude: Collection[str] = (), **kwargs: Any) -> Schema:
        """The schema of a dataclass's fields, less ``exclude``."""
        hints = typing.get_type_hints(target, include_extras=True)
        names = [f.name for f in dataclasses.fields(target) if f.name not in exclude]
        return cls({name: hints[name] for name in names}, **kwargs)

    def canonical(self, name: str) -> str | None:
        """The key ``name`` spells in any case, None when there is none."""
        return self._folded.get(name.lower())

    def unknown(self, key: str, where: str) -> ConfigError:
        return self._error(f"{where}: unknown {self._noun} {key!r} (known: {self._known})")

    def convert(self, key: str, setting: Setting) -> Any:
        """The setting's value as its key's type."""
        hint = self.hints.get(key)
        if hint is None:
            raise self.unknown(key, setting.origin)
        value = setting.value
        try:
            if setting.text and isinstance(value, str):
                value = _parse(value, mi.type_info(hint))
            return msgspec.convert(value, hint, strict=True, dec_hook=_decode)
        except (ValueError, KeyError):  # msgspec.ValidationError is a ValueError
            pass
        raise self._error(f"{setting.origin}: expected {allowed(hint)}, got {setting.value!r}")

    def values(self, settings: Mapping[str, Setting]) -> dict[str, Any]:
        """Each setting converted; an unknown key or a malformed value raises."""
        return {key: self.convert(key, setting) for key, setting in settings.items()}

    def build(self, target: Callable[..., T], settings: Mapping[str, Setting], **fixed: Any) -> T:
        """``target(**fixed, **converted settings)``; its own checks' ValueError is raised
        as this schema's ConfigError."""
        values = self.values(settings)
        try:
            return target(**fixed, **values)
        except ConfigError:
            raise
        except ValueError as exc:
            raise self._error(str(exc)) from None


def allowed(hint: Any) -> str:
    """What a value of type ``hint`` may be, as an error message says it."""
    return _describe(mi.type_info(hint))


def _describe(info: mi.Type) -> str:
    if isinstance(info, mi.IntType):
        return "an integer" + _bounds(info)
    if isinstance(info, mi.FloatType):
        return "a number" + _bounds(info)
    if isinstance(info, mi.BoolType):
        return "true or false"
    if isinstance(info, mi.StrType):
        return "a string"
    if isinstance(info, mi.EnumType):
        return "one of " + ", ".join(repr(member.value) for member in info.cls)
    if isinstance(info, mi.ListType | mi.VarTupleType):
        return "a list of strings" if isinstance(info.item_type, mi.StrType) else "a list"
    if isinstance(info, mi.UnionType):
        return " or ".join(_describe(t) for t in info.types if not isinstance(t, mi.NoneType))
    if isinstance(info, mi.CustomType) and info.cls is Path:
        return "a path"
    return str(info)


def _bounds(info: mi.IntType | mi.FloatType) -> str:
    parts = [
        f"{words} {bound}"
        for words, bound in (
            ("at least", info.ge),
            ("above", info.gt),
            ("at most", info.le),
            ("below", info.lt),
        )
        if bound is not None
    ]
    return " of " + " and ".join(parts) if parts else ""


def _parse(text: str, info: mi.Type) -> Any:
    """Text as the Python value msgspec then checks against ``info``'s type."""
    if isinstance(info, mi.UnionType):
        inner = [t for t in info.types if not isinstance(t, mi.NoneType)]
        return _parse(text, inner[0]) if len(inner) == 1 else text
    if isinstance(info, mi.IntType):
        return int(text.replace("_", ""))
    if isinstance(info, mi.FloatType):
        return float(text)
    if isinstance(info, mi.BoolType):
        return _BOOLEANS[text.strip().lower()]
    if isinstance(info, mi.ListType | mi.VarTupleType):
        return [part.strip() for part in text.split(",") if part.strip()]
    return text


def _decode(kind: type, value: Any) -> Any:
    """The types msgspec leaves to us: a path is a non-empty string."""
    if kind is Path and isinstance(value, str) and value:
        return Path(value)
    raise ValueError(f"not a {kind.__name__}")


# --- sources ----------------------------------------------------------------------------


def read_settings(
    path: Path,
    *,
    sections: Collection[str] = (),
    prefixed: Collection[str] = ("auth",),
    text: bool = False,
) -> dict[str, dict[str, Setting]]:
    """The settings of a TOML file by section: ``""`` holds the top-level keys, each name in
    ``sections`` its table's. A table named in ``prefixed`` is shorthand for top-level keys
    (``[auth] enabled = true`` is ``auth_enabled = true``). ``text``: string values may
    spell other types, as flags do."""
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    found: dict[str, dict[str, Setting]] = {"": {}, **{section: {} for section in sections}}
    for key, value in data.items():
        if key in sections or key in prefixed:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: {key!r} must be a table ([{key}])")
            for name, inner in value.items():
                setting = Setting(inner, f"{path}: {key}.{name}", text)
                if key in sections:
                    found[key][name] = setting
                else:
                    found[""][f"{key}_{name}"] = setting
        else:
            found[""][key] = Setting(value, f"{path}: {key}", text)
    return found


def add_config_file_options(parser: argparse.ArgumentParser) -> None:
    """``--config FILE``, or instead ``--check-config FILE``: the program loads the file (and
    any flags) as it would to start, says whether it is valid and exits without starting
    (0 valid, 2 not). Deploy tools run it on a new file before it replaces the one a
    running process was started from (docs/deploy.md)."""
    files = parser.add_mutually_exclusive_group()
    files.add_argument("--config", type=Path, help="TOML file; flags override its keys")
    files.add_argument(
        "--check-config",
        type=Path,
        metavar="FILE",
        help="load FILE as --config would, say whether it is valid and exit (0 valid, 2 not)",
    )


def config_file(args: argparse.Namespace) -> Path | None:
    """The file of ``--config`` or ``--check-config``, None when neither was given."""
    path: Path | None = args.config if args.config is not None else args.check_config
    return path


def flag_settings(args: argparse.Namespace, keys: Iterable[str]) -> dict[str, Setting]:
    """The flags given among ``keys`` (each flag's dest is its key; unset flags are None)."""
    found = {}
    for key in keys:
        value = getattr(args, key, None)
        if value is not None:
            origin = f"flag --{key.replace('_', '-')}"
            found[key] = Setting(value, origin, text=isinstance(value, str))
    return found
