"""A real cluster (one nameserver serving the console, two broker groups of a master and
a slave) and one headless Chromium per module, driven by Playwright.

The browser is Debian's ``chromium`` (``.ci/system-packages.sh`` installs it); the tests
skip, saying so, on a machine without it. Screenshots go to ``tests/results/console/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metaq.testing import BrokerProcess
from metaq.testing.console import (
    BROKER_TIMEOUT_MS,
    CHROMIUM,
    GROUPS,
    QUEUES,
    TOPIC,
    Browser,
    ConsoleCluster,
    all_in_sync,
    call,
)
from metaq.testing.nameserver_process import start_nameserver
from metaq.testing.waiting import wait_until

RESULTS = Path(__file__).resolve().parents[2] / "results" / "console"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleCluster]:
    work = tmp_path_factory.mktemp("console")
    nameserver = start_nameserver(
        work / "ns", "--http-port", "0",
        "--console-broker-timeout-ms", str(BROKER_TIMEOUT_MS),
    )  # fmt: skip
    started = ConsoleCluster(nameserver)
    try:
        common = ["--nameserver", nameserver.grpc_address,
                  "--set", "replication_mode=sync", "--set", "min_in_sync_replicas=2"]  # fmt: skip
        for group in GROUPS:
            for broker_id in (0, 1):
                started.brokers[(group, broker_id)] = BrokerProcess.start(
                    work / f"{group}-{broker_id}",
                    "--broker-name", group, "--broker-id", str(broker_id), *common,
                )  # fmt: skip
        for group in GROUPS:
            broker = started.brokers[(group, 0)]
            broker.wait_master(30)
            status, answer = call(
                "PUT", f"{broker.http_url}/topics/{TOPIC}",
                {"read_queues": QUEUES, "write_queues": QUEUES},
            )  # fmt: skip
            assert status == 200, answer
        wait_until(lambda: all_in_sync(started), 30, "both groups have both brokers in sync",
                   poll_s=0.2)  # fmt: skip
        wait_until(lambda: all(started.route_master(g) == 0 for g in GROUPS), 30,
                   "the route of orders has both groups' masters", poll_s=0.2)  # fmt: skip
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"no {CHROMIUM}: install Debian's chromium (make ci-deps)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser(chromium: Any) -> Iterator[Browser]:
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(15_000)
    seen = Browser(page, RESULTS)
    page.on(
        "console",
        lambda m: (
            m.type == "error"
            and seen.problems.append(f"console: {m.text} ({m.location.get('url')})")
        ),
    )
    page.on("pageerror", lambda e: seen.problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: seen.problems.append(f"failed: {r.url} {r.failure}"))
    page.on(
        "response",
        lambda r: r.status >= 400 and seen.problems.append(f"HTTP {r.status}: {r.url}"),
    )
    try:
        yield seen
    finally:
        context.close()
