"""The ``metaq`` command run as a process against a real cluster: output and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from metaq.testing import Cluster, ClusterBuilder


def _metaq_command() -> list[str]:
    script = Path(sys.executable).with_name("metaq")
    return [str(script)] if script.exists() else [sys.executable, "-m", "metaq.client.cli"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = ClusterBuilder(groups=("broker-a", "broker-b")).start(
        tmp_path_factory.mktemp("cli-cluster")
    )
    try:
        yield started
    finally:
        started.stop()


def _env(cluster: Cluster) -> dict[str, str]:
    return {**os.environ, "METAQ_NAMESERVERS": ",".join(cluster.nameserver_addresses)}


def metaq(cluster: Cluster, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_metaq_command(), *args],
        capture_output=True,
        text=True,
        env=_env(cluster),
        input=stdin,
        timeout=30,
        check=False,
    )


def test_cluster_list_shows_both_brokers_with_their_addresses(cluster: Cluster) -> None:
    done = metaq(cluster, "cluster", "list")

    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    assert header.split()[:4] == ["CLUSTER", "GROUP", "ID", "ROLE"]
    assert [row.split()[1] for row in rows] == ["broker-a", "broker-b"]
    assert all(cluster.data_address(name) in done.stdout for name in cluster.builder.groups)


def test_create_send_and_find_a_message_by_id_and_key(cluster: Cluster) -> None:
    created = metaq(cluster, "topic", "create", "cli-orders", "--queues", "2")
    assert created.returncode == 0, created.stderr
    assert "created on 2 broker(s)" in created.stdout

    sent = metaq(
        cluster, "send", "cli-orders", "--tags", "new", "-k", "order-17", "hello from the cli"
    )
    assert sent.returncode == 0, sent.stderr
    header, row = sent.stdout.splitlines()
    status, msg_id, group, queue, offset = row.split()
    assert header.split()[0] == "STATUS" and status == "OK" and len(msg_id) == 32

    found = metaq(cluster, "query", "id", msg_id, "--json")
    assert found.returncode == 0, found.stderr
    message = json.loads(found.stdout)
    assert message["body"] == "hello from the cli" and message["tags"] == "new"
    assert (message["broker_name"], message["queue_id"], message["queue_offset"]) == (
        group,
        int(queue),
        int(offset),
    )

    by_key = metaq(cluster, "query", "key", "cli-orders", "order-17")
    assert by_key.returncode == 0, by_key.stderr
    assert msg_id in by_key.stdout and "hello from the cli" in by_key.stdout

    stats = metaq(cluster, "topic", "stats", "cli-orders", "--json")
    assert sum(q["messages"] for q in json.loads(stats.stdout)) == 1


def test_send_reads_the_body_from_stdin_and_sends_copies(cluster: Cluster) -> None:
    assert metaq(cluster, "topic", "create", "cli-copies", "-q", "1").returncode == 0

    done = metaq(cluster, "send", "cli-copies", "--count", "30", stdin="piped body")

    assert done.returncode == 0, done.stderr
    assert "statuses: OK 30" in done.stdout


def test_failures_exit_non_zero_with_one_line_on_stderr(cluster: Cluster) -> None:
    assert metaq(cluster, "topic", "create", "cli-twice", "-q", "1").returncode == 0

    cases = {
        ("send", "cli-no-such-topic", "x"): (1, "unknown topic 'cli-no-such-topic'"),
        ("topic", "create", "cli-twice"): (1, "already exists"),
        ("topic", "create", "bad topic name"): (2, "illegal topic name"),
        ("query", "id", "00" * 16): (1, "no broker holds message"),
        ("query", "id", "xyz"): (2, "32 hex digits"),
        ("topic", "route", "cli-no-such-topic"): (1, "unknown topic"),
        ("topic", "create", "x", "--brokers", "broker-z"): (1, "no live master"),
        ("cluster", "switchover", "--group", "broker-a", "--to", "7"): (
            1,
            "broker group 'broker-a' has no broker with id 7; its brokers: 0 (master)",
        ),
        ("progress", "-g", "nobody", "-t", "cli-twice"): (
            1,
            "consumer group 'nobody' has committed no offset on topic 'cli-twice'",
        ),
    }
    running = {
        args: subprocess.Popen(
            [*_metaq_command(), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(cluster),
        )
        for args in cases
    }
    for args, (code, text) in cases.items():
        stdout, stderr = running[args].communicate(timeout=180)
        assert running[args].returncode == code, (args, stdout, stderr)
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("metaq: error: "), (args, stderr)
        assert text in lines[0], (args, lines[0])


def test_an_unreachable_nameserver_is_a_clear_error() -> None:
    done = subprocess.run(
        [*_metaq_command(), "cluster", "list", "-n", "127.0.0.1:1", "--timeout", "2"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("metaq: error: no nameserver answered")
    assert "127.0.0.1:1" in done.stderr


def test_common_options_go_before_the_command_as_well_as_after(cluster: Cluster) -> None:
    env = {k: v for k, v in os.environ.items() if k != "METAQ_NAMESERVERS"}
    address = cluster.nameserver_addresses[0]
    for args in (
        ["-n", address, "--json", "cluster", "list"],
        ["cluster", "-n", address, "list", "--json"],
        ["cluster", "list", "--json", "-n", address],
    ):
        done = subprocess.run(
            [*_metaq_command(), *args], capture_output=True, text=True, env=env, timeout=30
        )
        assert done.returncode == 0, (args, done.stderr)
        listed = json.loads(done.stdout)
        assert {b["broker_name"] for b in listed["brokers"]} == {"broker-a", "broker-b"}, args


def test_output_into_a_pipe_nobody_reads_ends_quietly(cluster: Cluster) -> None:
    """``metaq ... | head``: once the reader is gone, the command stops without a
    traceback and exits as SIGPIPE would have it (141), whatever command it was."""
    assert metaq(cluster, "topic", "create", "cli-piped", "-q", "4").returncode == 0
    assert metaq(cluster, "send", "cli-piped", "--count", "8", "piped").returncode == 0
    for args in (
        ["cluster", "list", "--json"],
        ["topic", "list", "--json"],
        ["topic", "stats", "cli-piped"],
        ["read", "cli-piped"],
        ["consume", "cli-piped", "-g", "cli-pipe-readers", "--count", "8", "--timeout", "20"],
        ["--help"],
    ):
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader has gone before the first byte is written
        try:
            done = subprocess.run(
                [*_metaq_command(), *args],
                stdout=write_end,
                stderr=subprocess.PIPE,
                text=True,
                env=_env(cluster),
                timeout=30,
                check=False,
            )
        finally:
            os.close(write_end)
        assert done.stderr == "", (args, done.stderr)
        assert done.returncode in (0, 141), (args, done.returncode)
    # The consumer printed nothing: it committed nothing past where it started.
    progress = metaq(cluster, "progress", "-g", "cli-pipe-readers", "-t", "cli-piped", "--json")
    assert progress.returncode == 0, progress.stderr
    assert json.loads(progress.stdout)["total_lag"] == 8


def test_read_prints_stored_messages_and_leaves_no_group_behind(cluster: Cluster) -> None:
    assert (
        metaq(cluster, "topic", "create", "cli-read", "-q", "2", "--brokers", "broker-a").returncode
        == 0
    )
    sending = metaq(cluster, "send", "cli-read", "--count", "10", "--json", "r")
    sent = json.loads(sending.stdout)["results"]
    assert len(sent) == 10, sent

    done = metaq(cluster, "read", "cli-read", "--count", "7", "--json")
    assert done.returncode == 0, done.stderr
    read = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(read) == 7
    assert {m["msg_id"] for m in read} <= {m["msg_id"] for m in sent}
    # Queue by queue, each in offset order.
    assert read == sorted(read, key=lambda m: (m["queue_id"], m["queue_offset"]))

    one = metaq(
        cluster, "read", "cli-read", "--queue", "1", "--from", "2", "--count", "50", "--json"
    )
    assert one.returncode == 0, one.stderr
    rows = [json.loads(line) for line in one.stdout.splitlines()]
    in_queue_1 = sum(m["queue_id"] == 1 for m in sent)
    assert [m["queue_offset"] for m in rows] == list(range(2, in_queue_1))

    later = metaq(cluster, "read", "cli-read", "--since", str(2**42), "--json")
    assert later.returncode == 0 and later.stdout == "", later

    bad = metaq(cluster, "read", "cli-read", "--queue", "9")
    assert bad.returncode == 2 and "no readable queue 9" in bad.stderr, bad.stderr

    # Nothing was committed: no group has offsets on the topic.
    offsets = metaq(cluster, "progress", "-g", "anyone", "-t", "cli-read")
    assert offsets.returncode == 1 and "(groups with offsets on it: none)" in offsets.stderr


def test_consume_stops_at_its_count_cleanly_and_commits_what_it_printed(cluster: Cluster) -> None:
    assert metaq(cluster, "topic", "create", "cli-tail", "-q", "4").returncode == 0
    assert metaq(cluster, "send", "cli-tail", "--count", "40", "t").returncode == 0

    done = metaq(
        cluster, "consume", "cli-tail", "-g", "cli-tailers", "--count", "5", "--timeout", "30"
    )

    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 5
    assert done.stderr == "", done.stderr  # no "handler calls outlived the close timeout"
    progress = metaq(cluster, "progress", "-g", "cli-tailers", "-t", "cli-tail", "--json")
    assert json.loads(progress.stdout)["total_lag"] == 35


def test_every_program_says_its_version() -> None:
    for program, distribution in (
        ("metaq", "metaq-client"),
        ("metaq-broker", "metaq-broker"),
        ("metaq-nameserver", "metaq-nameserver"),
    ):
        done = subprocess.run(
            [str(Path(sys.executable).with_name(program)), "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"{program} {version(distribution)}"
