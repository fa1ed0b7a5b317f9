"""Waiting on conditions with a deadline: what every test waits with, never a bare sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Final

POLL_S: Final = 0.002


def wait_until(predicate: Callable[[], bool], timeout_s: float, message: str) -> float:
    """Poll ``predicate`` until it holds and return the seconds it took.

    Raises AssertionError naming ``message`` at the deadline, so a test fails saying
    what it was waiting for.
    """
    start = time.monotonic()
    deadline = start + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting until {message}")
        time.sleep(POLL_S)
    return time.monotonic() - start


async def wait_until_async(
    predicate: Callable[[], Awaitable[bool]], timeout_s: float, message: str
) -> float:
    """Await ``predicate`` until it holds and return the seconds it took (see wait_until)."""
    start = time.monotonic()
    deadline = start + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting until {message}")
        await asyncio.sleep(POLL_S)
    return time.monotonic() - start
