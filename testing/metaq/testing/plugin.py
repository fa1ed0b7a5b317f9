"""The pytest plugin (the ``pytest11`` entry point of metaq-testing): fixtures that start
real processes and stop them when the test ends, whatever happened in it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from metaq.testing.cluster import Cluster, ClusterBuilder


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
