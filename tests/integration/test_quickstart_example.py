"""The README's Python example runs as printed against a real nameserver and broker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from metaq.client.admin import Admin, TopicSettings
from metaq.testing import BrokerProcess, run_async
from metaq.testing.nameserver_process import start_nameserver

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


def test_the_quickstart_example_sends_three_messages_and_consumes_them_back(
    tmp_path: Path,
) -> None:
    nameserver = start_nameserver(tmp_path / "ns")
    try:
        args = ("--nameserver", nameserver.grpc_address)
        with BrokerProcess.start(tmp_path / "broker", *args) as broker:
            run_async(
                Admin().put_topic(
                    broker.http_url, "demo", TopicSettings(read_queues=4, write_queues=4)
                )
            )
            env = {**os.environ, "METAQ_NAMESERVERS": nameserver.grpc_address}
            done = subprocess.run(
                [sys.executable, str(EXAMPLE)],
                env=env,
                capture_output=True,
                text=True,
                timeout=90,
                check=False,
            )
    finally:
        nameserver.stop()

    assert done.returncode == 0, done.stderr
    sent = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("sent ")]
    got = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("got ")]
    assert len(sent) == 3
    assert sorted(got) == sorted(sent)
