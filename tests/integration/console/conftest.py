"""A real cluster (one nameserver serving the console, two broker groups of a master and
a slave: ``metaq.testing.console.BUILDER``) and one headless Chromium per module, driven
by Playwright.

The browser is Debian's ``chromium`` (``.ci/system-packages.sh`` installs it); the tests
skip, saying so, on a machine without it. Screenshots go to ``tests/results/console/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metaq.testing.console import (
    BUILDER,
    CHROMIUM,
    GROUPS,
    QUEUES,
    TOPIC,
    Browser,
    ConsoleCluster,
    all_in_sync,
)
from metaq.testing.waiting import run_async, wait_until

RESULTS = Path(__file__).resolve().parents[2] / "results" / "console"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleCluster]:
    with BUILDER.start(tmp_path_factory.mktemp("console")) as started:
        console = ConsoleCluster(started)
        run_async(started.create_topic(TOPIC, queues=QUEUES, timeout_s=30))
        wait_until(lambda: all_in_sync(console), 30, "both groups have both brokers in sync",
                   poll_s=0.2)  # fmt: skip
        wait_until(lambda: all(console.route_master(g) == 0 for g in GROUPS), 30,
                   "the route of orders has both groups' masters", poll_s=0.2)  # fmt: skip
        yield console


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
