"""CPU seconds the benchmark's process tree spent, by role, read from /proc.

On a machine shared with other work the rows/s of a phase say little on their own;
how many CPU seconds the broker, Spark's JVM, its Python workers and the benchmark
itself spent on the phase's rows says what bounds it (docs/spark.md).
"""

from __future__ import annotations

import os
from pathlib import Path

_TICKS_S = os.sysconf("SC_CLK_TCK")


def _role(command: str) -> str:
    if "metaq-broker" in command or "metaq.broker" in command:
        return "broker"
    if "nameserver" in command:
        return "nameserver"
    if " kafka.Kafka " in command:  # a Kafka peer's broker (bench/peer_kafka.py)
        return "kafka_broker"
    if Path(command.split(" ", 1)[0]).name == "java":
        return "jvm"
    return "python_workers"  # everything else under the JVM: pyspark's daemon and workers


Reading = dict[int, tuple[str, float]]
"""Process id -> (role, CPU seconds so far)."""


def cpu_by_role() -> Reading:
    """CPU seconds (user + system) so far of this process ("bench") and its descendants."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        commands[pid] = command
        cpu[pid] = (int(fields[11]) + int(fields[12])) / _TICKS_S
    me = os.getpid()
    reading = {me: ("bench", cpu.get(me, 0.0))}
    for pid in cpu:
        ancestor = parents.get(pid, 0)
        while ancestor not in (0, 1, me):
            ancestor = parents.get(ancestor, 0)
        if ancestor == me:
            reading[pid] = (_role(commands[pid]), cpu[pid])
    return reading


def spent(before: Reading, after: Reading) -> dict[str, float]:
    """CPU seconds per role between two readings. A process that ended between them is
    not counted (Spark's Python workers live on between tasks)."""
    roles: dict[str, float] = {}
    for pid, (role, seconds) in after.items():
        earlier = before.get(pid)
        roles[role] = roles.get(role, 0.0) + seconds - (earlier[1] if earlier else 0.0)
    return {role: round(seconds, 2) for role, seconds in sorted(roles.items())}
