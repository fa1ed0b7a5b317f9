"""The shared config loader: typed values, text values, and refusals naming key, value and
what is allowed."""

from __future__ import annotations

import argparse
import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import msgspec
import pytest

from metaq.common.config import ConfigError, Schema, Setting, flag_settings, read_settings


class Mode(enum.Enum):
    SYNC = "sync"
    ASYNC = "async"


@dataclass(frozen=True)
class Example:
    port: int = 1
    ratio: float = 0.5
    on: bool = False
    name: str = "a"
    mode: Mode = Mode.ASYNC
    peers: tuple[str, ...] = ()
    home: Path = Path(".")
    http_port: int | None = None
    count: Annotated[int, msgspec.Meta(ge=1)] = 1

    def __post_init__(self) -> None:
        if self.port > 65535:
            raise ValueError(f"port={self.port} is not a TCP port")


class ExampleError(ConfigError):
    pass


SCHEMA = Schema.of(Example, also=["[extra]"])


def typed(value: object) -> Setting:
    return Setting(value, "example.toml: key")


def text(value: str) -> Setting:
    return Setting(value, "flag --key", text=True)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("port", 7, 7),
        ("ratio", 2, 2.0),
        ("on", True, True),
        ("mode", "sync", Mode.SYNC),
        ("peers", ["a:1", "b:2"], ("a:1", "b:2")),
        ("home", "/var/lib", Path("/var/lib")),
        ("http_port", 8080, 8080),
    ],
)
def test_typed_values_take_their_field_type(key: str, value: object, expected: object) -> None:
    assert SCHEMA.convert(key, typed(value)) == expected


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("port", "7", "example.toml: key: expected an integer, got '7'"),
        ("port", 7.0, "expected an integer, got 7.0"),
        ("port", True, "expected an integer, got True"),
        ("on", 1, "expected true or false, got 1"),
        ("on", "yes", "expected true or false, got 'yes'"),
        ("name", 5, "expected a string, got 5"),
        ("mode", "sometimes", "expected one of 'sync', 'async', got 'sometimes'"),
        ("peers", "a:1", "expected a list of strings, got 'a:1'"),
        ("peers", ["a:1", 2], "expected a list of strings, got ['a:1', 2]"),
        ("home", "", "expected a path, got ''"),
        ("count", 0, "expected an integer of at least 1, got 0"),
    ],
)
def test_a_typed_value_of_another_type_is_refused_naming_key_value_and_type(
    key: str, value: object, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        SCHEMA.convert(key, typed(value))

    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("port", "1_048_576", 1_048_576),
        ("port", " 42 ", 42),
        ("ratio", "2.5", 2.5),
        ("on", "yes", True),
        ("on", "FALSE", False),
        ("on", "1", True),
        ("mode", "sync", Mode.SYNC),
        ("peers", "a:1, b:2,", ("a:1", "b:2")),
        ("home", "/srv", Path("/srv")),
        ("http_port", "0", 0),
        ("name", " spaced ", " spaced "),
    ],
)
def test_text_is_parsed_for_the_field_type(key: str, value: str, expected: object) -> None:
    assert SCHEMA.convert(key, text(value)) == expected


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("port", "ten", "flag --key: expected an integer, got 'ten'"),
        ("ratio", "half", "expected a number, got 'half'"),
        ("on", "maybe", "expected true or false, got 'maybe'"),
        ("http_port", "none", "expected an integer, got 'none'"),
        ("count", "0", "expected an integer of at least 1, got '0'"),
    ],
)
def test_text_that_does_not_parse_is_refused_naming_key_value_and_type(
    key: str, value: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        SCHEMA.convert(key, text(value))

    assert words in str(caught.value)


def test_an_unknown_key_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        SCHEMA.values({"colour": typed(3)})

    message = str(caught.value)
    assert message.startswith("example.toml: key: unknown key 'colour' (known: count, home,")
    assert message.endswith("ratio, [extra])")


def test_keys_are_found_in_any_case_and_errors_are_the_schema_own_class() -> None:
    schema = Schema({"minPartitions": int}, noun="option", error=ExampleError)

    assert schema.canonical("MINPARTITIONS") == "minPartitions"
    assert schema.canonical("maxPartitions") is None
    with pytest.raises(ExampleError, match=r"^source: unknown option 'maxpartitions'"):
        raise schema.unknown("maxpartitions", "source")
    with pytest.raises(ExampleError, match="expected an integer, got 'x'"):
        schema.convert("minPartitions", text("x"))


def test_build_converts_and_reports_the_target_own_checks_as_config_errors() -> None:
    built = SCHEMA.build(Example, {"port": text("80"), "on": typed(True)}, name="fixed")
    assert built == Example(port=80, on=True, name="fixed")

    with pytest.raises(ConfigError, match="port=70000 is not a TCP port"):
        SCHEMA.build(Example, {"port": typed(70000)})


def test_a_file_gives_top_level_keys_sections_and_prefixed_tables(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text('port = 7\n[extra]\nsize = 3\n[auth]\nenabled = true\nacl_file = "a"\n')

    found = read_settings(path, sections=["extra"])

    assert found[""] == {
        "port": Setting(7, f"{path}: port"),
        "auth_enabled": Setting(True, f"{path}: auth.enabled"),
        "auth_acl_file": Setting("a", f"{path}: auth.acl_file"),
    }
    assert found["extra"] == {"size": Setting(3, f"{path}: extra.size")}
    assert read_settings(path, sections=["extra"], text=True)[""]["port"].text


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("extra = 3", "'extra' must be a table ([extra])"),
        ("auth = 3", "'auth' must be a table ([auth])"),
        ("port = ", "is not valid TOML"),
        (None, "cannot read config file"),
    ],
)
def test_a_file_that_cannot_be_read_as_settings_is_refused(
    tmp_path: Path, content: str | None, words: str
) -> None:
    path = tmp_path / "x.toml"
    if content is not None:
        path.write_text(content)

    with pytest.raises(ConfigError) as caught:
        read_settings(path, sections=["extra"])

    assert words in str(caught.value)
    assert str(path) in str(caught.value)


def test_flags_given_become_settings_named_by_their_flag() -> None:
    args = argparse.Namespace(port="7", on=True, name=None)

    found = flag_settings(args, ["port", "on", "name", "http_port"])

    assert found == {
        "port": Setting("7", "flag --port", text=True),
        "on": Setting(True, "flag --on"),
    }
