"""The background-service base: one named thread with start, stop and wakeup."""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod

log = logging.getLogger(__name__)


class Service(ABC):
    """Runs :meth:`run_once` until stopped, waking on :meth:`wakeup` or its interval.

    If ``run_once`` raises, the service records the error, calls :meth:`on_failure` so
    anyone waiting on it is released with the error, and ends: nothing hangs forever on
    a dead thread.
    """

    name = "service"

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.error: BaseException | None = None
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def wakeup(self) -> None:
        # Setting an Event takes its lock; checking first keeps hot callers cheap.
        if not self._wake.is_set():
            self._wake.set()

    def stop(self) -> None:
        """Stop after the current round; the owner does any final work itself."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def pause(self, seconds: float) -> None:
        """Wait ``seconds`` inside :meth:`run_once`, or less if the service is stopped."""
        self._stopping.wait(seconds)

    def _loop(self) -> None:
        try:
            while not self._stopping.is_set():
                self._wake.wait(self.interval_s)
                self._wake.clear()
                if not self._stopping.is_set():
                    self.run_once()
        except BaseException as exc:
            log.exception("%s died", self.name)
            self.error = exc
            self.on_failure(exc)

    @abstractmethod
    def run_once(self) -> None: ...

    def on_failure(self, exc: BaseException) -> None:  # noqa: B027 - optional hook
        """Release whoever waits on this service; the default has no waiters."""
