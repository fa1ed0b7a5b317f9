"""Fixtures for the integration tests: real broker processes on ephemeral ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from metaq.testing import BrokerProcess

# Small enough frames that the too-large path is cheap to reach; pulls must fit in half.
SHARED_BROKER_ARGS = (
    "--set",
    "max_frame_bytes=1048576",
    "--set",
    "max_pull_bytes=524288",
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker shared by a module's tests (each test uses its own topics)."""
    data_dir = tmp_path_factory.mktemp("shared-broker") / "data"
    with BrokerProcess.start(data_dir, *SHARED_BROKER_ARGS) as started:
        yield started


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """``start_broker(*flags, data_dir=None)``: a broker of the test's own; killed at the
    end if the test left it running."""
    started: list[BrokerProcess] = []

    def start(*args: str, data_dir: Path | None = None) -> BrokerProcess:
        process = BrokerProcess.start(data_dir or tmp_path / "data", *args)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
