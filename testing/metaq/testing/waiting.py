"""Test helpers for every component: waiting on conditions with a deadline (never a bare
sleep), deadlines that stretch on a loaded machine, the durations a test keeps on purpose
(a fault held, a sender paced), running a coroutine on a loop that fails on unhandled
exceptions, and the cluster secret test clusters run with."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final, TypeVar

from metaq.common.auth import ENV_VAR, ClusterSecret

POLL_S: Final = 0.002
DEADLINE_SCALE_ENV: Final = "METAQ_TEST_DEADLINE_SCALE"
TEST_CLUSTER_SECRET: Final = "metaq-tests-cluster-secret-never-use-elsewhere"
"""What processes started by the test fixtures prove, so tests run the authenticated path."""


def cluster_secret_for_tests() -> ClusterSecret:
    return ClusterSecret(TEST_CLUSTER_SECRET.encode(), "the test fixtures")


def secret_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A child's environment: ours, the tests' cluster secret, then ``env`` on top
    (``{ENV_VAR: ""}`` starts a process with no secret)."""
    return {**os.environ, ENV_VAR: TEST_CLUSTER_SECRET, **(env or {})}


T = TypeVar("T")


def deadline(seconds: float) -> float:
    """``seconds`` times ``METAQ_TEST_DEADLINE_SCALE`` (a float, 1 when unset).

    Every bound a test puts on wall-clock time goes through this, so one setting gives
    all of them room on a loaded or slow machine (``METAQ_TEST_DEADLINE_SCALE=3``)
    without touching what they claim. The waits below apply it to their own timeouts.
    """
    raw = os.environ.get(DEADLINE_SCALE_ENV, "").strip()
    if not raw:
        return seconds
    try:
        scale = float(raw)
    except ValueError:
        raise ValueError(f"{DEADLINE_SCALE_ENV}={raw!r} is not a number") from None
    if not scale > 0:
        raise ValueError(f"{DEADLINE_SCALE_ENV}={raw!r} must be above 0")
    return seconds * scale


def wait_until(
    predicate: Callable[[], bool],
    timeout_s: float,
    message: str,
    *,
    poll_s: float = POLL_S,
    failed: Callable[[], object] | None = None,
) -> float:
    """Poll ``predicate`` every ``poll_s`` until it holds and return the seconds it took.

    Raises AssertionError naming ``message`` at the deadline (``timeout_s`` through
    :func:`deadline`), so a test fails saying what it was waiting for; at once, with
    what it returned, when ``failed`` returns something (a streaming query's
    ``exception``: a dead query never makes the condition hold). Predicates that ask a
    server (HTTP, gRPC) should poll less often than the default, so the waiting does not
    load what it waits for.
    """
    timeout_s = deadline(timeout_s)
    start = time.monotonic()
    give_up = start + timeout_s
    while not predicate():
        if failed is not None and (why := failed()):
            raise AssertionError(f"gave up waiting until {message}: {why}")
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out after {timeout_s} s waiting until {message}")
        time.sleep(poll_s)
    return time.monotonic() - start


def holds_for(
    predicate: Callable[[], bool], seconds: float, message: str, *, poll_s: float = 0.05
) -> None:
    """Assert ``predicate`` at every poll for ``seconds``: how a test shows that something
    does not happen, over a span in which it would have happened many times over."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if not predicate():
            raise AssertionError(f"{message} no longer held")
        time.sleep(poll_s)


def hold(seconds: float) -> None:
    """Let ``seconds`` of wall time pass on purpose: a fault kept in place that long, or
    traffic let run that long before the next fault.

    A duration, not a wait: it stands for no event (for one, use :func:`wait_until`), so
    nothing could end it sooner, and :func:`deadline`'s scale does not stretch it; it is
    part of what the test does, not a bound on how long something may take.
    """
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(left)


class Pace:
    """Slots ``rate_hz`` apart from a monotonic start, for a loop that sends at a rate:
    :meth:`wait` returns at the next slot, at once when the loop is behind it, so a slow
    step does not shift the slots after it.

    A rate the test keeps (a sender below a limit, a steady load), not a wait for the
    other side: whatever the sender waits for, it waits for with :func:`wait_until`.
    """

    def __init__(self, rate_hz: float) -> None:
        if not rate_hz > 0:
            raise ValueError(f"a rate of {rate_hz} Hz paces nothing: give one above 0")
        self._start = time.monotonic()
        self._period_s = 1.0 / rate_hz
        self._slots = 0

    def wait(self) -> None:
        self._slots += 1
        hold(self._start + self._slots * self._period_s - time.monotonic())


async def wait_until_async(
    predicate: Callable[[], Awaitable[bool]], timeout_s: float, message: str
) -> float:
    """Await ``predicate`` until it holds and return the seconds it took (see wait_until)."""
    timeout_s = deadline(timeout_s)
    start = time.monotonic()
    give_up = start + timeout_s
    while not await predicate():
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out after {timeout_s} s waiting until {message}")
        await asyncio.sleep(POLL_S)
    return time.monotonic() - start


def _late_grpc_completion(context: dict[str, Any]) -> bool:
    """gRPC's process-wide poller handing this loop the completion of an operation that an
    earlier run's loop started (a cancelled stream's last read): that loop is closed, so
    there is nothing left to deliver it to, and nothing of this run's went wrong."""
    exc = context.get("exception")
    return (
        isinstance(exc, RuntimeError)
        and str(exc) == "Event loop is closed"
        and "PollerCompletionQueue._handle_events" in repr(context.get("handle"))
    )


def run_async(coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
    """Run ``coro`` on a fresh loop, for at most ``timeout_s`` through :func:`deadline`;
    fail if the loop saw an unhandled exception."""
    timeout_s = deadline(timeout_s)
    problems: list[dict[str, Any]] = []

    def handle(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not _late_grpc_completion(context):
            problems.append(context)

    async def guarded() -> T:
        asyncio.get_running_loop().set_exception_handler(handle)
        async with asyncio.timeout(timeout_s):
            return await coro

    result = asyncio.run(guarded())
    if problems:
        raise AssertionError(f"unhandled exceptions in the event loop: {problems}")
    return result
