"""Self-protection and retention: refuse writes when the disk is full or failing, and
delete old segments (seed Q&A 18-19).

Writes stop, reads go on, when disk use passes ``disk_full_ratio`` or after
``io_error_limit`` consecutive I/O errors. Expired commitlog segments are deleted at the
configured hour, or at any hour once disk use passes ``disk_clean_ratio``; past
``disk_force_clean_ratio`` the oldest segments go even before they expire.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from metaq.broker.store.config import StoreConfig
from metaq.broker.store.service import Service
from metaq.common.errors import StoreUnavailable

log = logging.getLogger(__name__)

DiskUsage = Callable[[Path], float]


def disk_used_ratio(path: Path) -> float:
    usage = shutil.disk_usage(path)
    return usage.used / usage.total if usage.total else 1.0


class WriteGuard:
    """Whether the store accepts writes now, and if not, why and what to do."""

    def __init__(self, config: StoreConfig, usage: DiskUsage = disk_used_ratio) -> None:
        self.config = config
        self.usage = usage
        self.disk_ratio = 0.0
        self.io_errors = 0
        self._io_reason: str | None = None

    def refresh_disk(self) -> float:
        self.disk_ratio = self.usage(self.config.data_dir)
        return self.disk_ratio

    def record_io_error(self, exc: OSError) -> None:
        self.io_errors += 1
        log.error("I/O error %d of %d allowed: %s", self.io_errors, self.config.io_error_limit, exc)
        if self.io_errors >= self.config.io_error_limit:
            self._io_reason = (
                f"{self.io_errors} consecutive I/O errors, the last: {exc}. The device may be "
                "failing: check it, then restart the broker"
            )

    def record_io_success(self) -> None:
        if self._io_reason is None:
            self.io_errors = 0

    @property
    def reason(self) -> str | None:
        if self._io_reason is not None:
            return self._io_reason
        if self.disk_ratio >= self.config.disk_full_ratio:
            return (
                f"disk {self.disk_ratio:.0%} full, over the {self.config.disk_full_ratio:.0%} "
                "limit (store.disk_full_ratio): free space or add disk; reads continue"
            )
        return None

    def ensure_writable(self) -> None:
        if self._io_reason is None and self.disk_ratio < self.config.disk_full_ratio:
            return
        raise StoreUnavailable(f"store refuses writes: {self.reason}")


class Retention:
    """Which commitlog segments to delete, decided from the clock and disk use."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config

    def doomed(
        self, segments: list[tuple[Path, int]], safe_end: int, disk_ratio: float, now_s: float
    ) -> int:
        """How many of the oldest ``(path, end offset)`` segments to delete now.

        Only segments that end at or before ``safe_end`` (flushed and dispatched) and
        are not the last one qualify.
        """
        config = self.config
        hour = time.localtime(now_s).tm_hour
        may_delete_expired = hour == config.delete_hour or disk_ratio >= config.disk_clean_ratio
        force = disk_ratio >= config.disk_force_clean_ratio
        deadline = now_s - config.retention_hours * 3600
        count = 0
        for path, end in segments[:-1]:
            if end > safe_end:
                break
            expired = os.stat(path).st_mtime < deadline
            if expired and may_delete_expired:
                count += 1
            elif force and count == 0:
                log.warning(
                    "disk %.0f%% full (force-clean at %.0f%%): deleting unexpired %s",
                    disk_ratio * 100,
                    config.disk_force_clean_ratio * 100,
                    path.name,
                )
                count += 1
                break
            else:
                break
        return count


class CleanService(Service):
    """Runs the guard's disk check and retention on an interval."""

    name = "clean"

    def __init__(self, clean: Callable[[], object], interval_s: float) -> None:
        super().__init__(interval_s=interval_s)
        self._clean = clean

    def run_once(self) -> None:
        self._clean()
