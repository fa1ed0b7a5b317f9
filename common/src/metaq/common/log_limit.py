"""Logging a condition that recurs many times a second without flooding the log."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

REPORT_INTERVAL_S: Final = 60.0


class Repeated:
    """A condition that recurs (a write failing every tick, strangers dropped): logged as a
    warning the first time, then at most once per ``interval_s`` with how many times it
    recurred meanwhile, and once more, at info level, when :meth:`ended` says it stopped.

    Used from one thread (the event loop, or pysyncobj's thread) per instance.
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        interval_s: float = REPORT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._what = what
        self._interval_s = interval_s
        self._clock = clock
        self._since: float | None = None
        self._reported_at = 0.0
        self._unreported = 0
        self.total = 0

    @property
    def active(self) -> bool:
        return self._since is not None

    def happened(self, detail: str) -> None:
        """Another occurrence; ``detail`` says what this one was."""
        now = self._clock()
        self.total += 1
        if self._since is None:
            self._since = self._reported_at = now
            self._unreported = 0
            self._log.warning("%s: %s", self._what, detail)
            return
        self._unreported += 1
        if now - self._reported_at >= self._interval_s:
            self._log.warning(
                "%s, %d more times in the last %.0f s; the last: %s",
                self._what,
                self._unreported,
                now - self._reported_at,
                detail,
            )
            self._reported_at, self._unreported = now, 0

    def ended(self) -> None:
        """The condition is over (a write worked again); says so once."""
        if self._since is None:
            return
        self._log.info("%s no longer: it lasted %.1f s", self._what, self._clock() - self._since)
        self._since = None
