"""The history: every operation and every fault as one JSON object per line.

Writers (the workload process and the nemesis in the test process) append whole lines
with one ``write`` on a file opened with O_APPEND, so lines from both never interleave.
Times are ``time.monotonic()`` seconds: the same clock in every process of one machine.

Event types (field ``type``):

- ``scenario``: the scenario's name, seed and what it expects (the checker's bounds);
- ``invoke`` / ``ok`` / ``fail`` / ``info`` of a send (``id``, ``topic``, ``group``,
  ``producer``; ``key`` and ``seq`` on the ordered topic). ``ok`` is status OK; ``fail``
  means certainly not stored (refused before storing); ``info`` means unknown (a timeout,
  a lost connection, or stored without the guarantee: FLUSH_SLAVE_TIMEOUT, ...);
- ``read``: a consumer handled a message (``id``, ``topic``, ``queue``, ``offset``);
- ``fault``: ``phase`` start/end, ``fault`` (kill, pause, partition, ...), ``node``,
  ``group``, and ``failover`` when the fault takes a master away;
- ``stored``: the ids a broker's commitlog held (``node``, ``when``), for telling where a
  lost message went missing;
- ``check``: something the nemesis verified live (``name``, ``ok``, ``detail``);
- ``allow_loss``: ids whose loss the scenario expects and bounds (async replication);
- ``drain``: the workload's consumers caught up with every queue (or not, by a deadline).
"""

from __future__ import annotations

import bisect
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class HistoryWriter:
    """Appends events to a history file; safe to share between threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def write(self, event_type: str, **fields: Any) -> dict[str, Any]:
        event = {"t": round(time.monotonic(), 6), "type": event_type, **fields}
        line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)
        return event

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def read_history(path: Path) -> Iterator[dict[str, Any]]:
    """Every whole event of a history file, in file order (a torn last line is skipped)."""
    with path.open("rb") as file:
        for raw in file:
            if not raw.endswith(b"\n"):
                break
            yield json.loads(raw)


class HistoryTail:
    """Follows a history file as it grows and keeps the counts a nemesis waits on."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self.ack_times: dict[str, list[float]] = {}
        """When each acknowledged send of a broker group was answered, in file order."""
        self.fail_times: dict[str, list[float]] = {}
        """When each failed or unknown send of a broker group ended."""
        self.failures: list[dict[str, Any]] = []
        self.reads = 0
        self.workload_events: list[dict[str, Any]] = []
        self.drain: dict[str, Any] | None = None

    def poll(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as file:
            file.seek(self._offset)
            chunk = file.read()
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            if raw:
                self._take(json.loads(raw))

    def _take(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "ok":
            self.ack_times.setdefault(event["group"], []).append(event["t"])
        elif kind in ("fail", "info"):
            self.fail_times.setdefault(event["group"], []).append(event["t"])
            self.failures.append(event)
        elif kind == "read":
            self.reads += 1
        elif kind == "drain":
            self.drain = event
        elif kind == "workload":
            self.workload_events.append(event)

    def acked_in(self, group: str) -> int:
        self.poll()
        return len(self.ack_times.get(group, ()))

    def acked_since(self, group: str, since: float) -> int:
        """Acknowledged sends of ``group`` answered after ``since``."""
        self.poll()
        times = self.ack_times.get(group, [])
        return len(times) - bisect.bisect_right(times, since)

    def first_ack_since(self, group: str, since: float) -> float | None:
        """When the first send of ``group`` acknowledged after ``since`` was answered."""
        self.poll()
        times = self.ack_times.get(group, [])
        at = bisect.bisect_right(times, since)
        return times[at] if at < len(times) else None

    def failed_since(self, group: str, since: float) -> int:
        self.poll()
        times = self.fail_times.get(group, [])
        return len(times) - bisect.bisect_right(times, since)


def now() -> float:
    return time.monotonic()
