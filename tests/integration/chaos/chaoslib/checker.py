"""The checker: plain Python over one scenario's history (JSON lines).

    python -m chaoslib.checker HISTORY.jsonl [...]   # a table each; exit 1 on a violation

What it counts (Jepsen's total-queue, per scenario):

- attempted (sends invoked), acknowledged (status OK), read (distinct ids handled);
- **lost**: acknowledged and never read. Each lost id is placed: *never stored* (no
  broker's commitlog held it), *stored on the old master only* (only commitlogs of
  brokers that were not the group's final master held it — a cut tail), or *stored but
  not delivered* (the final master holds it; the consumers never got it);
- **unexpected**: read, never attempted;
- **phantom**: read, but absent from its group's final log: a record a failover cut
  after a consumer had read it, whose queue offset then went to another message that the
  consumer, having moved past that offset, may never read;
- duplicated (ids read more than once), recovered (read, but the send was not
  acknowledged: it timed out or ended without the full guarantee);
- order inversions per sharding key: an acknowledged message read for the first time
  after a later acknowledged message of the same key;
- per fault, the unavailability window of its broker group: from the first send that
  failed after the fault began to the next acknowledged send (the group's ``main``
  producer; 0 when no send failed), and the longest wait between two acknowledged sends
  around it (retries can turn an outage into one slow send that never fails); the
  failover figures are the latter; and the time from the fault to the acknowledgement of
  the first send begun after it (``make bench-failover-compare``'s figure);
- the live checks the nemesis recorded (``check`` events: prefixes byte-identical after
  healing, nothing acknowledged while refused, ...), and the drain.

Violations: a lost id the scenario did not allow (``allow_loss``: async replication's
uncopied tail), any unexpected or phantom id, any inversion, a failed check, a drain that did not
finish, and the scenario's own bounds (``expect`` in its ``scenario`` event:
``failover_p50_s``, ``failover_max_s``, ``quiet_groups`` — groups that must see no failed
send at all).
"""

from __future__ import annotations

import bisect
import itertools
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoslib.history import read_history


@dataclass
class Window:
    fault: str
    node: str
    group: str
    start: float
    failover: bool
    window_s: float | None
    """First failed send after the fault to the next acknowledged one (the issue's
    definition; 0 when no send failed); None when the group never recovered."""
    stall_s: float | None
    """The longest time between two acknowledged sends of the group from the last one
    before the fault to the last one before the next fault: what a client waited, also
    when retries hid the failures. None when no send was acknowledged after the fault."""
    resumed_s: float | None = None
    """From the fault to the acknowledgement of the first send its group's main producer
    began after it (an answer already on its way when the fault came does not count);
    None when no such send was acknowledged before the next fault of the group."""


@dataclass
class Result:
    scenario: str
    seed: int | None
    attempted: int = 0
    acknowledged: int = 0
    read: int = 0
    lost: list[str] = field(default_factory=list)
    lost_allowed: list[str] = field(default_factory=list)
    lost_where: dict[str, str] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)
    phantom: list[str] = field(default_factory=list)
    duplicated: int = 0
    recovered: int = 0
    inversions: list[str] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    elections: list[float] = field(default_factory=list)
    """Seconds from each failover fault until the observer saw the new master."""
    skipped: str = ""
    """Why the scenario could not run here (say, partitions on loopback); empty if it ran."""

    @property
    def failover_resumes(self) -> list[float]:
        """Per failover fault, the time from the fault to the next acknowledged send."""
        return [w.resumed_s for w in self.windows if w.failover and w.resumed_s is not None]

    @property
    def failover_windows(self) -> list[float]:
        """Per failover fault, how long its group took no writes (the longest stall)."""
        return [w.stall_s for w in self.windows if w.failover and w.stall_s is not None]

    def table(self) -> str:
        if self.skipped:
            return f"scenario  {self.scenario} (seed {self.seed})\nSKIPPED   {self.skipped}"
        rows: list[tuple[str, str]] = [
            ("scenario", f"{self.scenario} (seed {self.seed})"),
            ("attempted", str(self.attempted)),
            ("acknowledged", str(self.acknowledged)),
            ("read", str(self.read)),
            ("lost", f"{len(self.lost)}"
             + (f" ({len(self.lost_allowed)} allowed: async tail)" if self.lost_allowed else "")),
            ("unexpected", str(len(self.unexpected))),
            ("phantom (read, then cut)", str(len(self.phantom))),
            ("duplicated", str(self.duplicated)),
            ("recovered", str(self.recovered)),
            ("order inversions", str(len(self.inversions))),
        ]  # fmt: skip
        for w in self.windows:
            window = "never recovered" if w.window_s is None else f"{w.window_s:.2f} s"
            stall = "-" if w.stall_s is None else f"{w.stall_s:.2f} s"
            rows.append(
                (
                    f"unavailable: {w.fault} {w.node}",
                    f"group {w.group}: {window} (longest wait for an ack {stall})",
                )
            )
        fw = self.failover_windows
        if fw:
            rows.append(("failover p50 / max", f"{percentile(fw, 50):.2f} s / {max(fw):.2f} s"))
        resumes = self.failover_resumes
        if resumes:
            rows.append(("kill to next ack p50 / max",
                         f"{percentile(resumes, 50):.2f} s / {max(resumes):.2f} s"))  # fmt: skip
        if self.elections:
            rows.append(("new master seen after", ", ".join(f"{s:.2f} s" for s in self.elections)))
        for check in self.checks:
            rows.append((f"check {check['name']}", ("ok" if check["ok"] else "FAILED")
                         + (f": {check['detail']}" if check.get("detail") else "")))  # fmt: skip
        for note in self.notes:
            rows.append(("note", note))
        for lost_id in self.lost[:10]:
            rows.append((f"lost {lost_id}", self.lost_where.get(lost_id, "?")))
        rows.append(("violations", "; ".join(self.violations) if self.violations else "none"))
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)

    def summary(self) -> dict[str, Any]:
        fw = self.failover_windows
        return {
            "scenario": self.scenario, "attempted": self.attempted,
            "acknowledged": self.acknowledged, "read": self.read, "lost": len(self.lost),
            "lost_allowed": len(self.lost_allowed), "unexpected": len(self.unexpected),
            "phantom": len(self.phantom), "duplicated": self.duplicated,
            "recovered": self.recovered,
            "inversions": len(self.inversions), "failover_windows_s": fw,
            "failover_resumes_s": self.failover_resumes,
            "violations": self.violations, "skipped": self.skipped,
        }  # fmt: skip


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (p50 of [1, 2, 3, 4] is 2)."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]


def check(events: Iterable[dict[str, Any]]) -> Result:
    events = list(events)
    scenario = next((e for e in events if e["type"] == "scenario"), {})
    result = Result(scenario.get("name", "?"), scenario.get("seed"))
    expect: dict[str, Any] = scenario.get("expect", {})

    invoked: dict[str, dict[str, Any]] = {}
    acked: dict[str, dict[str, Any]] = {}
    unsure: dict[str, dict[str, Any]] = {}
    reads: Counter[str] = Counter()
    read_order: dict[str, list[str]] = defaultdict(list)
    allowed: set[str] = set()
    stored: list[dict[str, Any]] = []
    final_masters: dict[str, str] = {}
    drain: dict[str, Any] | None = None
    for event in events:
        kind = event["type"]
        if kind == "invoke":
            invoked[event["id"]] = event
        elif kind == "ok":
            acked[event["id"]] = event
        elif kind == "info":
            unsure[event["id"]] = event
        elif kind == "read":
            reads[event["id"]] += 1
            read_order[event["consumer"]].append(event["id"])
        elif kind == "allow_loss":
            allowed.update(event["ids"])
        elif kind == "stored":
            stored.append({**event, "ids": set(event["ids"])})
        elif kind == "final_master":
            final_masters[event["group"]] = event["node"]
        elif kind == "check":
            result.checks.append(event)
        elif kind == "drain":
            drain = event
        elif kind == "note":
            result.notes.append(event["text"])
        elif kind == "elected":
            result.elections.append(event["after_s"])

    result.attempted = len(invoked)
    result.acknowledged = len(acked)
    result.read = len(reads)
    result.duplicated = sum(1 for n in reads.values() if n > 1)
    result.recovered = sum(1 for i in reads if i in invoked and i not in acked)
    result.unexpected = sorted(i for i in reads if i not in invoked)
    lost = sorted(i for i in acked if i not in reads)
    result.lost = lost
    result.lost_allowed = [i for i in lost if i in allowed]
    for lost_id in lost:
        result.lost_where[lost_id] = _where(lost_id, acked[lost_id]["group"], stored,
                                            final_masters)  # fmt: skip
    result.phantom = _phantoms(reads, invoked, allowed, stored, final_masters)
    result.inversions = _inversions(invoked, acked, read_order)
    result.windows = _windows(events)

    v = result.violations
    unexplained = [i for i in lost if i not in allowed]
    if unexplained:
        v.append(f"{len(unexplained)} acknowledged messages lost (first: {unexplained[0]}, "
                 f"{result.lost_where[unexplained[0]]})")  # fmt: skip
    if result.unexpected:
        v.append(f"{len(result.unexpected)} unexpected messages (first: {result.unexpected[0]})")
    if result.phantom:
        v.append(f"{len(result.phantom)} messages read but absent from the final log "
                 f"(first: {result.phantom[0]})")  # fmt: skip
    if result.inversions:
        v.append(f"{len(result.inversions)} order inversions (first: {result.inversions[0]})")
    for c in result.checks:
        if not c["ok"]:
            v.append(f"check {c['name']} failed: {c.get('detail', '')}")
    if drain is None:
        v.append("the consumers never finished draining (no drain event)")
    elif not drain["ok"]:
        failed = f" ({drain['error']})" if drain.get("error") else ""
        v.append(f"the consumers did not catch up: {drain['behind']}{failed}")
    if result.acknowledged == 0:
        v.append("nothing was acknowledged: the workload did not run")
    fw = result.failover_windows
    if any(w.failover and (w.window_s is None or w.stall_s is None) for w in result.windows):
        v.append("a group never took writes again after a failover")
    if "failover_p50_s" in expect and fw and percentile(fw, 50) > expect["failover_p50_s"]:
        v.append(f"failover p50 {percentile(fw, 50):.2f} s > {expect['failover_p50_s']} s")
    if "failover_max_s" in expect and fw and max(fw) > expect["failover_max_s"]:
        v.append(f"failover max {max(fw):.2f} s > {expect['failover_max_s']} s")
    for group in expect.get("quiet_groups", []):
        bad = [e for e in unsure.values() if e["group"] == group]
        if bad:
            v.append(f"group {group} should be unaffected but {len(bad)} sends failed "
                     f"(first: {bad[0].get('error') or bad[0].get('status')})")  # fmt: skip
    return result


def _where(lost_id: str, group: str, stored: list[dict[str, Any]],
           final_masters: dict[str, str]) -> str:  # fmt: skip
    holders = [s for s in stored if lost_id in s["ids"]]
    if not holders:
        return "never stored (no commitlog held it)"
    names = ", ".join(sorted({f"{s['node']} ({s['when']})" for s in holders}))
    master = final_masters.get(group)
    if any(s["node"] == master and s["when"] == "final" for s in holders):
        return f"stored but not delivered (held by {names})"
    return f"stored on the old master only (held by {names})"


def _phantoms(reads: Iterable[str], invoked: dict[str, dict[str, Any]], allowed: set[str],
              stored: list[dict[str, Any]],
              final_masters: dict[str, str]) -> list[str]:  # fmt: skip
    """Ids read that their group's final master does not hold after the run."""
    final = {s["group"]: s["ids"] for s in stored
             if s["when"] == "final" and final_masters.get(s["group"]) == s["node"]}  # fmt: skip
    return sorted(
        i for i in reads
        if i in invoked and i not in allowed and invoked[i]["group"] in final
        and i not in final[invoked[i]["group"]]
    )  # fmt: skip


def _inversions(invoked: dict[str, dict[str, Any]], acked: dict[str, dict[str, Any]],
                read_order: dict[str, list[str]]) -> list[str]:  # fmt: skip
    found = []
    for order in read_order.values():
        seen: set[str] = set()
        highest: dict[str, tuple[int, str]] = {}
        for message_id in order:
            if message_id in seen:
                continue
            seen.add(message_id)
            event = acked.get(message_id)
            if event is None or "key" not in event:
                continue
            key, seq = event["key"], event["seq"]
            top = highest.get(key)
            if top is not None and seq < top[0]:
                found.append(f"{message_id} (key {key} seq {seq}) read after {top[1]}")
            if top is None or seq > top[0]:
                highest[key] = (seq, message_id)
    return found


def _windows(events: list[dict[str, Any]]) -> list[Window]:
    """Per fault start: first failed send of its group's main producer, to the next ok."""
    faults = [e for e in events if e["type"] == "fault" and e["phase"] == "start"
              and e.get("group")]  # fmt: skip
    sends: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    acks: dict[str, list[float]] = defaultdict(list)
    invoked_at: dict[str, float] = {}
    for e in events:
        if e["type"] == "invoke":
            invoked_at[e["id"]] = e["t"]
        elif e["type"] in ("ok", "info") and e.get("producer") == f"main-{e['group']}":
            sends[e["group"]].append((invoked_at.get(e["id"], e["t"]), e["t"], e["type"]))
            if e["type"] == "ok":
                acks[e["group"]].append(e["t"])
    windows = []
    for index, fault in enumerate(faults):
        group, start = fault["group"], fault["t"]
        later = [f["t"] for f in faults[index + 1 :] if f["group"] == group]
        until = later[0] if later else float("inf")
        first_fail = None
        recovered_at = None
        for invoked, ended, kind in sends[group]:
            if first_fail is None:
                if kind == "info" and ended > start and invoked < until:
                    first_fail = (max(invoked, start), ended)
            elif kind == "ok" and ended > first_fail[1]:
                recovered_at = ended
                break
        if first_fail is None:
            window: float | None = 0.0
        elif recovered_at is None:
            window = None
        else:
            window = round(recovered_at - first_fail[0], 3)
        times = acks[group]
        first = bisect.bisect_left(times, start)
        span = times[max(0, first - 1) : bisect.bisect_left(times, until)]
        if first - 1 < 0:
            span = [start, *span]
        stall = (round(max(b - a for a, b in itertools.pairwise(span)), 3)
                 if len(span) > 1 and span[-1] > start else None)  # fmt: skip
        resumed = next((ended for invoked, ended, kind in sends[group]
                        if kind == "ok" and start < invoked < until), None)  # fmt: skip
        windows.append(Window(fault["fault"], fault.get("node", ""), group, start,
                              bool(fault.get("failover")), window, stall,
                              None if resumed is None else round(resumed - start, 3)))  # fmt: skip
    return windows


def main(argv: Sequence[str]) -> int:
    broken = 0
    for name in argv:
        result = check(read_history(Path(name)))
        print(result.table())
        print(json.dumps(result.summary()))
        broken += bool(result.violations)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
