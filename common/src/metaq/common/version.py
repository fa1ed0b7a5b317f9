"""The version a running process was installed as, for /health and the start-up log: an
operator (and the deploy playbooks) tell from it which wheel set a process runs."""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version


@cache
def installed_version(distribution: str) -> str:
    """``distribution``'s version (``metaq-broker``), read once: an upgrade installs side
    by side, and a process keeps reporting what it started from until it restarts."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"
