"""``make bench-failover-compare``: kill -9 of the leader (master) under a steady producer,
``--kills`` times per system, for metaq, Apache RocketMQ 5 in controller mode and Apache
Kafka 4 on KRaft, each as a system under the chaos suite (``tests/integration/chaos``):
its scenario 1 with more rounds, its history checked by the chaos checker.

- metaq: group ``a`` of three replicas, sync replication with ``min_in_sync_replicas = 2``
  (a send is answered once two of the three hold it), ASYNC flush (kill -9 keeps the page
  cache; the peers do not fsync before answering either), every other broker setting its
  production default, three nameservers hosting the controller; on loopback, as the peers.
  The chaos cluster's group ``b`` (two replicas, 40 msgs/s of its own) runs beside it.
- RocketMQ: ``bench/peer_rocketmq.py``'s ``controller_group`` (three brokers,
  ``inSyncReplicas = 2``, ``minInSyncReplicas = 2``, ASYNC_FLUSH).
- Kafka: ``bench/peer_kafka.py``'s three KRaft nodes, RF 3, ``min.insync.replicas = 2``,
  ``acks=all``, idempotent producer.

The same workload on the killed group for all three: one producer, one send at a time at
40 msgs/s, each given 2 s; a consumer reads everything at the end. Each round waits for
all three replicas in sync, holds 1-3 s of traffic, kills the master, waits for a new one
and 20 acknowledged sends, holds 1-4 s, starts the killed node again on its data.

Figures per system: the time from each kill to the acknowledgement of the first send begun
after it (p50, max) and the acknowledged messages never read (lost). The histories stay
under ``--work-dir`` (evidence when a system loses messages). The last line is one JSON
object; exit status 1 when a system broke an invariant of the checker.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Final

from chaoslib.checker import Result
from chaoslib.cluster import ClusterSpec
from chaoslib.compare import SYSTEMS, failover_figures, table
from chaoslib.scenarios import Scenario, kill_master, run_scenario
from chaoslib.workload import ConsumerSpec, ProducerSpec

RATE_HZ: Final = 40.0
SEND_TIMEOUT_S: Final = 2.0


def metaq_scenario(kills: int) -> Scenario:
    return Scenario(
        1, f"kill-master-x{kills}-three-replicas", functools.partial(kill_master, kills=kills),
        ClusterSpec(brokers=("a0", "a1", "a2", "b0", "b1"), min_in_sync=2, flush_mode="async",
                    settings=()),
        summary=f"kill -9 group a's master (3 replicas, 2 acknowledge), {kills} times",
        producers=lambda: [
            ProducerSpec(f"main-{g}", f"chaos-{g}", g, RATE_HZ, SEND_TIMEOUT_S) for g in "ab"
        ],
        consumers=lambda: [ConsumerSpec("chaos-main", ["chaos-a", "chaos-b"], concurrency=8)],
    )  # fmt: skip


def run_system(system: str, work_dir: Path, kills: int, seed: int) -> Result:
    if system == "metaq":
        return run_scenario(metaq_scenario(kills), work_dir, seed=seed, loopback=True)
    if system == "kafka":
        # Imported here: each needs its peer's jars (make peers), and only its own run.
        from chaoslib import kafka

        return kafka.run_kafka_scenario(1, work_dir, seed=seed, kills=kills)
    from chaoslib import rocketmq

    return rocketmq.run_rocketmq_scenario(1, work_dir, seed=seed, kills=kills)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=20, help="kill -9 rounds per system")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", default=",".join(SYSTEMS),
                        help=f"systems to run, comma-separated ({','.join(SYSTEMS)})")  # fmt: skip
    parser.add_argument("--work-dir", type=Path, default=Path("run-data/failover-compare"),
                        help="where each run's histories stay")  # fmt: skip
    args = parser.parse_args(argv)
    systems = [s for s in args.only.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"--only: unknown system {', '.join(unknown)}; choose from "
                     f"{', '.join(SYSTEMS)}")  # fmt: skip
    if args.kills < 1:
        parser.error(f"--kills must be at least 1, not {args.kills}")

    # Absolute: the peers' tools run in folders of their own.
    run_dir = args.work_dir.resolve() / time.strftime("%Y%m%d-%H%M%S")
    results: dict[str, Result] = {}
    for system in systems:
        began = time.monotonic()
        print(f"== {system}: {args.kills} kills", flush=True)
        result = run_system(system, run_dir / system, args.kills, args.seed)
        results[system] = result
        print(result.table())
        print(f"({time.monotonic() - began:.0f} s; history {run_dir / system}/history.jsonl)\n",
              flush=True)  # fmt: skip
    print(table(results))
    print(json.dumps(failover_figures(results)))
    return 1 if any(r.violations for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
