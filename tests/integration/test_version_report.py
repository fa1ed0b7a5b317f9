"""/health says which version a process was installed as: upgrade.yml (docs/deploy.md)
checks from it that every process runs the new release."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

from metaq.testing import BrokerProcess
from metaq.testing.nameserver_process import start_nameserver


def test_broker_health_reports_its_installed_version(
    start_broker: Callable[..., BrokerProcess],
) -> None:
    broker = start_broker()
    health = broker.health()
    assert health is not None, broker.output()
    assert health["version"] == version("metaq-broker")


def test_nameserver_health_reports_its_installed_version(tmp_path: Path) -> None:
    nameserver = start_nameserver(tmp_path, "--http-port", "0")
    try:
        url = f"http://{nameserver.http_address}/health"
        with urllib.request.urlopen(url, timeout=10) as answer:
            health = json.load(answer)
        assert health["version"] == version("metaq-nameserver")
    finally:
        nameserver.stop()
