"""The ``metaq`` CLI against a cluster whose every listener speaks TLS and verifies clients."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from metaq.testing.cluster import Cluster, ClusterBuilder


def metaq(nameserver: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("metaq")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "metaq.client.cli"]
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "METAQ_NAMESERVERS": nameserver},
        timeout=60,
        check=False,
    )


def test_the_cli_creates_sends_and_reads_over_tls_and_tells_a_plain_user_what_to_pass(
    tmp_path: Path, cluster_factory: Callable[[ClusterBuilder], Cluster]
) -> None:
    cluster = cluster_factory(ClusterBuilder(tls=True, verify_client=True))
    pki = cluster.pki
    assert pki is not None
    name = cluster.nameserver_addresses[0]
    tls = [
        "--tls-ca", pki.ca_file,
        "--tls-cert", pki.client.cert_file, "--tls-key", pki.client.key_file,
    ]  # fmt: skip
    created = metaq(name, "topic", "create", "cli-tls", "--queues", "2", *tls)
    assert created.returncode == 0, created.stderr
    sent = metaq(name, "send", "cli-tls", "over tls", *tls)
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.splitlines()[1].split()[0] == "OK"
    read = metaq(name, "consume", "cli-tls", "-g", "cli", "--count", "1", *tls)
    assert read.returncode == 0, read.stderr
    assert "over tls" in read.stdout

    plain = metaq(name, "send", "cli-tls", "in the clear")
    assert plain.returncode != 0
    assert f"the nameserver at {name} speaks TLS; pass --tls-ca FILE" in plain.stderr
    missing = metaq(name, "send", "cli-tls", "x", "--tls-ca", str(tmp_path / "no.pem"))
    assert missing.returncode == 2
    assert "--tls-ca" in missing.stderr and "no.pem: no such file" in missing.stderr
