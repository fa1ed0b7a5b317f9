"""Self-protection and retention: refuse writes when the disk is full or failing, and
delete old segments (seed Q&A 18-19).

Writes stop, reads go on, when disk use passes ``disk_full_ratio``, when the free space
less the next commitlog segment (if it is not allocated yet) would go under
``disk_reserve_bytes`` (the hard guard: what the filesystem can still give, whatever the
ratio says), or after ``io_error_limit`` consecutive I/O errors. Use is counted as ``df``
counts it, used / (used + available): on thin-provisioned, overlay or quota-limited
volumes the size is not used + available, and 1 - available / size overstates it. The space
check is sampled at most ``disk_check_interval_ms`` apart on the write path, and again
before every segment is allocated, so the store stops before the filesystem runs out: a
full filesystem is an error for a write() but SIGBUS for a store into a mapped page. A
refusal for space lifts by itself once a sample shows room again.

Expired commitlog segments are deleted at the configured hour, or at any hour once disk
use passes ``disk_clean_ratio``. Past ``disk_force_clean_ratio`` segments whose every
message has been consumed by every consumer group known for its queue go even before
they expire; unconsumed, unexpired data goes only with ``force_clean_unconsumed``.
"""

from __future__ import annotations

import enum
import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, NamedTuple

from metaq.broker.store.config import StoreConfig
from metaq.broker.store.service import Service
from metaq.common.errors import StoreUnavailable
from metaq.common.log_limit import Repeated
from metaq.common.units import size_text

log = logging.getLogger(__name__)

SPACE_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT})
"""Errors that say the filesystem is full, not that the device fails."""
DESCRIPTOR_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE})
"""Errors that say the process (or the system) has no file descriptor left, not that
the device fails: the same call works again once one is closed or the limit raised."""


class DiskSpace(NamedTuple):
    """A filesystem's bytes in use and what this process may still allocate, as ``df``
    reports them (Used, Avail)."""

    used_bytes: int
    available_bytes: int

    @property
    def used_ratio(self) -> float:
        """df's Use%: used / (used + available). Blocks kept for root on ext4 are in
        neither, so they do not count as room: ENOSPC comes when Avail is gone."""
        room = self.used_bytes + self.available_bytes
        if room <= 0:
            return 1.0
        return self.used_bytes / room


DiskUsage = Callable[[Path], "DiskSpace | float"]
"""Samples the data directory's disk; a bare float is a used ratio with room unlimited
(for tests that only play with the ratio)."""


def disk_space(path: Path) -> DiskSpace:
    stats = os.statvfs(path)
    used = (stats.f_blocks - stats.f_bfree) * stats.f_frsize
    return DiskSpace(used, stats.f_bavail * stats.f_frsize)


class WriteGuard:
    """Whether the store accepts writes now, and if not, why and what to do.

    ``pending_bytes`` says how much the store is about to allocate that the sample does
    not show yet (the next commitlog segment, before it is made).
    """

    def __init__(self, config: StoreConfig, usage: DiskUsage = disk_space) -> None:
        self.config = config
        self.usage = usage
        self.pending_bytes: Callable[[], int] = lambda: 0
        self.disk_ratio = 0.0
        """Used fraction of the disk, as df's Use% (as of the last sample)."""
        self.used_bytes: int | None = None
        self.available_bytes: int | None = None
        self.io_errors = 0
        self._io_reason: str | None = None
        self._no_descriptor = Repeated(log, "a store file could not be opened: no descriptor")
        self._no_descriptor_lock = threading.Lock()  # the loop's and the store threads' errors
        self._sampled_s = float("-inf")
        self._interval_s = config.disk_check_interval_ms / 1e3
        # Judged once a sample: every append asks, and must not pay for it.
        self._space_refusal: str | None = None

    def refresh_disk(self) -> float:
        sample = self.usage(self.config.data_dir)
        if isinstance(sample, DiskSpace):
            self.disk_ratio = sample.used_ratio
            self.used_bytes, self.available_bytes = sample.used_bytes, sample.available_bytes
        else:
            self.disk_ratio, self.used_bytes, self.available_bytes = sample, None, None
        self._sampled_s = time.monotonic()
        self._space_refusal = self._space_reason()
        return self.disk_ratio

    def may_allocate(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more may be allocated now, judged by a fresh sample."""
        self.refresh_disk()
        if self.available_bytes is None:
            return True
        if self.available_bytes - nbytes < self.config.disk_reserve_bytes:
            return False
        # The sample predates the allocation: take the next one right after it.
        self._sampled_s = float("-inf")
        return True

    def record_io_error(self, exc: OSError) -> None:
        if exc.errno in SPACE_ERRNOS:
            # Not a failing device: the space check refuses writes until room returns.
            log.error("the data directory's filesystem is full: %s", exc)
            self.refresh_disk()
            return
        if exc.errno in DESCRIPTOR_ERRNOS:
            # Not a failing device either: the write is refused (retriable) and works
            # again once a descriptor is free; the open-file limit is what to raise.
            with self._no_descriptor_lock:
                self._no_descriptor.happened(str(exc))
            return
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

    def space_figures(self) -> str:
        """Both figures the space check judges, as the refusals say them: use as df
        counts it beside store.disk_full_ratio, and the free bytes beside the absolute
        store.disk_reserve_bytes."""
        config = self.config
        ratio = (
            f"{self.disk_ratio:.0%} used as df counts it (limit {config.disk_full_ratio:.0%}, "
            "store.disk_full_ratio)"
        )
        if self.available_bytes is None or self.used_bytes is None:
            return ratio
        return (
            f"{ratio}; {size_text(self.used_bytes)} used, {size_text(self.available_bytes)} "
            f"available (reserve {size_text(config.disk_reserve_bytes)}, "
            "store.disk_reserve_bytes)"
        )

    def _space_reason(self) -> str | None:
        config = self.config
        if self.disk_ratio >= config.disk_full_ratio:
            return (
                f"disk {self.disk_ratio:.0%} full: {self.space_figures()}: free space or add "
                "disk; reads continue"
            )
        if self.available_bytes is None:
            return None
        pending = self.pending_bytes()
        if self.available_bytes - pending < config.disk_reserve_bytes:
            upcoming = f" less {size_text(pending)} for the next segment" if pending else ""
            return (
                f"disk nearly full: the free space{upcoming} is under the reserve: "
                f"{self.space_figures()}: free space or add disk; reads continue"
            )
        return None

    @property
    def io_refused(self) -> bool:
        """Writes are refused for repeated I/O errors (not for space)."""
        return self._io_reason is not None

    @property
    def reason(self) -> str | None:
        if self._io_reason is not None:
            return self._io_reason
        return self._space_refusal

    def ensure_writable(self) -> None:
        if time.monotonic() - self._sampled_s >= self._interval_s:
            self.refresh_disk()
        if self._io_reason is None and self._space_refusal is None:
            return
        raise StoreUnavailable(f"store refuses writes: {self.reason}")


class Deletion(enum.Enum):
    """Why retention deletes a segment: the label of its deletion counter."""

    EXPIRED = "expired"
    CONSUMED = "consumed"
    """Unexpired, but every group known for its queues consumed it (disk pressure)."""
    UNCONSUMED = "unconsumed"
    """Unexpired and not consumed: only with force_clean_unconsumed (disk pressure)."""


class Retention:
    """Which commitlog segments to delete, decided from the clock, disk use and what
    consumers have consumed."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config

    def doomed(
        self,
        segments: list[tuple[Path, int]],
        safe_end: int,
        disk_ratio: float,
        now_s: float,
        consumed: Callable[[int], bool] = lambda _end: False,
    ) -> list[Deletion]:
        """Why each of the oldest ``(path, end offset)`` segments goes now, oldest first.

        Only segments that end at or before ``safe_end`` (flushed and dispatched) and
        are not the last one qualify. ``consumed(end)`` says whether every message below
        commitlog offset ``end`` has been consumed.
        """
        config = self.config
        hour = time.localtime(now_s).tm_hour
        may_delete_expired = hour == config.delete_hour or disk_ratio >= config.disk_clean_ratio
        force = disk_ratio >= config.disk_force_clean_ratio
        deadline = now_s - config.retention_hours * 3600
        doomed: list[Deletion] = []
        for path, end in segments[:-1]:
            if end > safe_end:
                break
            if may_delete_expired and os.stat(path).st_mtime < deadline:
                doomed.append(Deletion.EXPIRED)
            elif force and consumed(end):
                doomed.append(Deletion.CONSUMED)
            elif force and config.force_clean_unconsumed and not doomed:
                # One a round: the next round sees whether that was enough.
                log.warning(
                    "disk %.0f%% full (force-clean at %.0f%%, store.force_clean_unconsumed "
                    "on): deleting %s, which holds unexpired messages not every consumer "
                    "group has consumed",
                    disk_ratio * 100,
                    config.disk_force_clean_ratio * 100,
                    path.name,
                )
                doomed.append(Deletion.UNCONSUMED)
                break
            else:
                break
        return doomed


class CleanService(Service):
    """Runs the guard's disk check and retention on an interval."""

    name = "clean"

    def __init__(self, clean: Callable[[], object], interval_s: float) -> None:
        super().__init__(interval_s=interval_s)
        self._clean = clean

    def run_once(self) -> None:
        self._clean()
