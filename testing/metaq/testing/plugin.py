"""The pytest plugin (the ``pytest11`` entry point of metaq-testing): fixtures that start
real processes and stop them when the test ends, whatever happened in it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from metaq.testing.cluster import Cluster, ClusterBuilder


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile metaq's modules to bytecode once, before any test starts a process.

    The workspace's members are installed editable, so ``uv sync --compile-bytecode``
    leaves their sources alone, and where ``PYTHONDONTWRITEBYTECODE`` is set no process
    caches what it compiles: every broker, nameserver and CLI the tests start would
    compile every metaq module it imports again, a good part of its start-up's CPU.
    Up-to-date files are skipped, and a directory that cannot be written (an installed
    wheel) is left as it is."""
    import compileall

    import metaq

    for directory in metaq.__path__:
        with contextlib.suppress(OSError):
            compileall.compile_dir(directory, quiet=2)


def pytest_configure(config: pytest.Config) -> None:
    """Property tests check answers, not speed: Hypothesis's default 200 ms deadline per
    example fails them at random on a loaded two-core machine."""
    try:
        from hypothesis import settings
    except ImportError:  # the plugin also serves environments without Hypothesis
        return
    settings.register_profile("metaq", deadline=None)
    settings.load_profile("metaq")


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[[ClusterBuilder], Cluster]]:
    """``cluster_factory(ClusterBuilder(...))``: a started cluster under the test's
    temporary directory, stopped at the end of the test."""
    started: list[Cluster] = []

    def start(builder: ClusterBuilder) -> Cluster:
        cluster = builder.start(tmp_path / f"cluster-{len(started)}")
        started.append(cluster)
        return cluster

    yield start
    for cluster in started:
        cluster.stop()
