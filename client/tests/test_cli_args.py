"""The ``metaq`` command line: argument parsing, defaults, usage errors, tables."""

from __future__ import annotations

import io

import pytest

from metaq.client.cli import build_parser, main
from metaq.client.cli.support import nameservers, split_names, table


def test_every_command_parses_its_options_after_the_command_name() -> None:
    parser = build_parser()

    args = parser.parse_args(
        ["topic", "create", "orders", "-q", "4", "--brokers", "a,b", "-b", "c", "-n", "h:1"]
    )
    assert (args.topic, args.queues, args.nameservers) == ("orders", 4, ["h:1"])
    assert split_names(args.brokers) == ["a", "b", "c"]

    args = parser.parse_args(["send", "orders", "hi", "--tags", "x", "-k", "a,b", "-c", "3"])
    assert (args.topic, args.body, args.tags, args.keys, args.count) == (
        "orders",
        "hi",
        "x",
        ["a,b"],
        3,
    )
    args = parser.parse_args(["query", "key", "orders", "k1", "--limit", "5", "--json"])
    assert (args.topic, args.key, args.limit, args.json) == ("orders", "k1", 5, True)


def test_nameservers_come_from_flags_then_the_environment_then_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parser = build_parser()
    monkeypatch.delenv("METAQ_NAMESERVERS", raising=False)
    assert nameservers(parser.parse_args(["cluster", "list"])) == ["127.0.0.1:9876"]

    monkeypatch.setenv("METAQ_NAMESERVERS", "a:1, b:2")
    assert nameservers(parser.parse_args(["cluster", "list"])) == ["a:1", "b:2"]

    args = parser.parse_args(["cluster", "list", "-n", "c:3", "--nameserver", "d:4"])
    assert nameservers(args) == ["c:3", "d:4"]


def test_bad_usage_exits_with_2_and_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["topic", "create"])
    assert caught.value.code == 2
    assert "required: topic" in capsys.readouterr().err

    assert main(["topic"]) == 2  # a group without a command prints its help

    assert main(["cluster", "list", "-n", "no-port"]) == 2
    assert "is not HOST:PORT" in capsys.readouterr().err


def test_a_body_may_follow_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["send", "t", "--count", "0", "body", "extra"])
    assert "unrecognized arguments" in capsys.readouterr().err
    # --count 0 is refused by the command itself, after the body was placed.
    assert main(["send", "t", "--count", "0", "body"]) == 2


def test_tables_align_text_left_and_numbers_right() -> None:
    out = io.StringIO()
    table(["name", "count"], [["a", 5], ["long-name", 12345], ["b", None]], out)

    assert out.getvalue().splitlines() == [
        "NAME       COUNT",
        "a              5",
        "long-name  12345",
        "b              -",
    ]


def test_illegal_topic_and_group_names_are_one_line_usage_errors_quoted_short(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # No nameserver listens on port 1: a name that got past the check would fail later
    # with exit 1 (unreachable), not 2.
    unreachable = ["-n", "127.0.0.1:1", "--timeout", "1"]

    assert main(["topic", "create", "t" * 3000, *unreachable]) == 2
    err = capsys.readouterr().err
    assert err.startswith("metaq: error: illegal topic name 't") and len(err) < 400, err
    assert "(3000 characters in all)" in err

    assert main(["progress", "-g", "bad group", "-t", "ok", *unreachable]) == 2
    err = capsys.readouterr().err
    assert "illegal consumer group 'bad group'" in err and len(err.splitlines()) == 1, err

    assert main(["send", "no spaces", "body", *unreachable]) == 2
    assert "illegal topic name 'no spaces'" in capsys.readouterr().err
