"""Pauses of the machine's CPUs, seen by processes that do nothing but sleep.

A virtual machine's host can stop a vCPU for milliseconds at a time; on the machine the
benchmarks were tuned on that happens every few seconds, idle or not, for 5-20 ms. Such
a pause lands on whichever system's cell is running and shows up in its latency tail.
Each end-to-end cell reports the pauses that fell in it, so the reader can tell the
system's latency from the machine's.

Run as a script, this is a watcher pinned to one CPU: at real-time priority (when
allowed) it wakes every :data:`PERIOD_S`, and a wake-up later than :data:`LATE_S` past
its time can only be that CPU not running at all, since a real-time task preempts
everything else there. Each such gap is written to a file as ``<monotonic before>
<monotonic after>``. :class:`StallWatch` starts a watcher per CPU and counts the gaps
that overlap a window of ``time.monotonic()``, the same clock in every process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

PERIOD_S: Final = 0.002
"""How often the watcher wakes: 500 wake-ups a second of a few µs each."""
LATE_S: Final = 0.004
"""Lateness that counts as a stall; a real-time task's wake-ups are late by well under
0.2 ms otherwise."""


@dataclass(frozen=True)
class Stalls:
    """The machine's pauses within a window."""

    count: int
    lost_ms: float
    """How long some CPU was stopped, in all."""
    longest_ms: float
    realtime: bool
    """False if the watcher ran at normal priority, where CPU contention looks alike."""

    def text(self) -> str:
        if not self.count:
            return "none"
        return f"{self.count} · {self.lost_ms:.0f} ms (longest {self.longest_ms:.0f})"


class StallWatch:
    """A watcher process per CPU, from ``with`` to its end."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="metaq-stalls-")
        self._cpus = sorted(os.sched_getaffinity(0))
        self._paths = [Path(self._dir.name) / f"cpu{cpu}" for cpu in self._cpus]
        self._processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> StallWatch:
        for path, cpu in zip(self._paths, self._cpus, strict=True):
            path.touch()
            self._processes.append(
                subprocess.Popen([sys.executable, __file__, str(path), str(os.getpid()), str(cpu)])
            )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for process in self._processes:
            process.terminate()
        for process in self._processes:
            process.wait(timeout=5)
        self._dir.cleanup()

    def between(self, start: float, end: float) -> Stalls:
        """The pauses overlapping ``[start, end)`` of ``time.monotonic()``; pauses of
        several CPUs at once count once, for as long as any CPU was stopped."""
        late: list[tuple[float, float]] = []
        realtime = True
        for path in self._paths:
            lines = path.read_text().splitlines()
            realtime = realtime and bool(lines) and lines[0] == "realtime"
            for line in lines[1:]:
                before, after = (float(x) for x in line.split())
                if after > start and before < end:
                    late.append((before + PERIOD_S, after))  # from the missed wake-up on
        merged: list[list[float]] = []
        for begin, finish in sorted(late):
            if merged and begin <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], finish)
            else:
                merged.append([begin, finish])
        lengths = [(finish - begin) * 1e3 for begin, finish in merged]
        return Stalls(
            len(lengths), round(sum(lengths), 1), round(max(lengths, default=0.0), 1), realtime
        )


def watch(path: Path, parent: int, cpu: int) -> None:
    """Record the pauses of ``cpu`` in ``path`` until ``parent`` is gone."""
    os.sched_setaffinity(0, {cpu})
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        realtime = True
    except (PermissionError, AttributeError):
        realtime = False
    with path.open("a") as out:
        print("realtime" if realtime else "normal", file=out, flush=True)
        last = time.monotonic()
        while os.getppid() == parent:  # a killed benchmark must not leave it behind
            time.sleep(PERIOD_S)
            now = time.monotonic()
            if now - last > PERIOD_S + LATE_S:
                print(f"{last:.6f} {now:.6f}", file=out, flush=True)
            last = now


if __name__ == "__main__":
    watch(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
