"""The README's Python example runs as printed against a real nameserver and broker."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from metaq.testing import run_async
from metaq.testing.cluster import Cluster, ClusterBuilder

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


def test_the_quickstart_example_sends_three_messages_and_consumes_them_back(
    cluster_factory: Callable[[ClusterBuilder], Cluster],
) -> None:
    cluster = cluster_factory(ClusterBuilder())
    run_async(cluster.create_topic("demo", queues=4))
    env = {**os.environ, "METAQ_NAMESERVERS": cluster.nameserver_list}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    sent = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("sent ")]
    got = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("got ")]
    assert len(sent) == 3
    assert sorted(got) == sorted(sent)
