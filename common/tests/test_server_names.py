"""The names a server takes signed requests for, and the one spelling of host:port."""

from __future__ import annotations

import pytest

from metaq.common.server_names import ServerNames, http_target, name_problems, split_name


@pytest.mark.parametrize(
    ("host", "port", "expected"),
    [
        ("Broker-1.Example", 10912, "broker-1.example:10912"),
        ("::1", 9880, "[::1]:9880"),
        ("[0:0::1]", 9880, "[::1]:9880"),
        ("127.0.0.1", 1, "127.0.0.1:1"),
    ],
)
def test_a_target_is_spelt_one_way(host: str, port: int, expected: str) -> None:
    assert http_target(host, port) == expected


def test_a_server_on_loopback_answers_to_every_loopback_spelling_of_its_own_port() -> None:
    names = ServerNames()
    names.listening(10912, "localhost", "127.0.0.1")

    for name in ("localhost:10912", "127.0.0.1:10912", "[::1]:10912"):
        assert name in names
    assert "127.0.0.1:10913" not in names
    assert "10.0.0.5:10912" not in names


def test_a_server_answers_to_its_address_and_its_http_names_only() -> None:
    names = ServerNames(["broker-a-0.example", "localhost:19912", "[fe80::1]"])
    names.listening(10912, "broker-a-0.dc", "10.0.0.5")

    for name in ("broker-a-0.dc:10912", "10.0.0.5:10912", "broker-a-0.example:10912",
                 "localhost:19912", "[fe80::1]:10912"):  # fmt: skip
        assert name in names
    for name in ("10.0.0.6:10912", "localhost:10912", "broker-a-0.example:19912"):
        assert name not in names
    refusal = names.refusal("10.0.0.6:10912")
    assert "signed for server 10.0.0.6:10912" in refusal
    assert "10.0.0.5:10912" in refusal and "http_names" in refusal


def test_a_server_on_every_address_answers_only_to_its_http_names() -> None:
    names = ServerNames()
    names.listening(9880, "0.0.0.0")

    assert "127.0.0.1:9880" not in names and "0.0.0.0:9880" not in names
    assert "listens on every address" in names.refusal("10.0.0.5:9880")


def test_an_http_name_without_a_port_takes_the_servers_own() -> None:
    assert split_name("ns-1.example") == ("ns-1.example", None)
    assert split_name("[::1]:8080") == ("::1", 8080)
    assert split_name("ns-1.example:8080") == ("ns-1.example", 8080)


@pytest.mark.parametrize("entry", ["", "host:", "host:0", "host:99999", "a b", "[::1]x", "u@h"])
def test_a_malformed_http_name_is_refused_saying_which(entry: str) -> None:
    [problem] = name_problems([entry])
    assert problem.startswith("http_names: ") and repr(entry) in problem
