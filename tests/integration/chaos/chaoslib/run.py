"""``make chaos``: run every scenario (or ``--only 1,3``) with a seed, print each checker
table, a summary table, and as the last line one JSON object::

    {"scenarios": 8, "violations": 0, "lost": 0, "unexpected": 0,
     "failover_p50_s": 3.1, "failover_max_s": 4.2, ...}

Exit status 1 when any scenario broke an invariant. Histories stay under ``--work-dir``
(one folder per scenario) for the checker to be run again by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from chaoslib.checker import Result, percentile
from chaoslib.scenarios import SCENARIOS, run_scenario


def summary_table(results: list[Result]) -> str:
    header = ("scenario", "attempted", "acked", "read", "lost", "unexp", "dup", "recov", "inv",
              "failover p50/max s", "violations")  # fmt: skip
    rows = [header]
    for r in results:
        fw = r.failover_windows
        rows.append((
            r.scenario, str(r.attempted), str(r.acknowledged), str(r.read),
            f"{len(r.lost)}" + (f" ({len(r.lost_allowed)} allowed)" if r.lost_allowed else ""),
            str(len(r.unexpected)), str(r.duplicated), str(r.recovered), str(len(r.inversions)),
            f"{percentile(fw, 50):.2f}/{max(fw):.2f}" if fw else "-",
            "SKIPPED: " + r.skipped if r.skipped else str(len(r.violations)),
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     for row in rows)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=120.0,
                        help="seconds of mixed chaos (scenario 10)")  # fmt: skip
    parser.add_argument("--only", default="", help="comma-separated scenario numbers")
    parser.add_argument("--work-dir", type=Path, default=Path("run-data/chaos"))
    parser.add_argument("--loopback", action="store_true", help="no namespaces")
    parser.add_argument("--short", action="store_true", help="the CI selection's lengths")
    parser.add_argument(
        "--system",
        choices=("metaq", "kafka", "rocketmq"),
        default="metaq",
        help="the system under test (kafka: bench/peer_kafka.py's cluster; rocketmq: "
        "bench/peer_rocketmq.py's controller-mode group)",
    )
    args = parser.parse_args(argv)
    if args.system == "kafka":
        # Only here: it needs bench/ on the path and Kafka's jars (make chaos SYSTEM=kafka).
        from chaoslib import kafka

        available = sorted(kafka.SCENARIOS)
    elif args.system == "rocketmq":
        # The same: bench/ on the path and RocketMQ's jars (make chaos SYSTEM=rocketmq).
        from chaoslib import rocketmq

        available = sorted(rocketmq.SCENARIOS)
    else:
        available = sorted(SCENARIOS)
    numbers = [int(n) for n in args.only.split(",") if n] or available
    missing = [n for n in numbers if n not in available]
    if missing:
        parser.error(f"--only: no scenario {missing} for {args.system}; it has {available}")
    run_dir = args.work_dir / time.strftime("%Y%m%d-%H%M%S")
    results = []
    for number in numbers:
        started = time.monotonic()
        if args.system == "kafka":
            name = kafka.SCENARIOS[number]
            print(f"== scenario {number}: {name}, Kafka (seed {args.seed})", flush=True)
            result = kafka.run_kafka_scenario(
                number, run_dir / f"{number}-kafka-{name}", seed=args.seed + number
            )
        elif args.system == "rocketmq":
            name = rocketmq.SCENARIOS[number]
            print(f"== scenario {number}: {name}, RocketMQ (seed {args.seed})", flush=True)
            result = rocketmq.run_rocketmq_scenario(
                number, run_dir / f"{number}-rocketmq-{name}", seed=args.seed + number
            )
        else:
            scenario = SCENARIOS[number]
            print(f"== scenario {number}: {scenario.summary} (seed {args.seed})", flush=True)
            result = run_scenario(
                scenario, run_dir / f"{number}-{scenario.name}", seed=args.seed + number,
                duration_s=args.duration, short=args.short, loopback=args.loopback,
            )  # fmt: skip
        print(result.table())
        print(f"   ({time.monotonic() - started:.0f} s)\n", flush=True)
        results.append(result)
    print(summary_table(results))
    ran = [r for r in results if not r.skipped]
    windows = [w for r in ran for w in r.failover_windows]
    line = {
        "scenarios": len(ran),
        "violations": sum(len(r.violations) for r in ran),
        "lost": sum(len(r.lost) for r in ran),
        "unexpected": sum(len(r.unexpected) for r in ran),
        "failover_p50_s": round(percentile(windows, 50), 3) if windows else None,
        "failover_max_s": round(max(windows), 3) if windows else None,
        "lost_allowed": sum(len(r.lost_allowed) for r in ran),
        "skipped": [r.scenario for r in results if r.skipped],
        "seed": args.seed,
        "system": args.system,
        "histories": str(run_dir),
    }
    print(json.dumps(line))
    return 1 if line["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
