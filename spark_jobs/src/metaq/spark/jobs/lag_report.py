"""A consumer group's accumulation (lag) over time, from the brokers' offsets.

Samples every queue's end offset and the group's committed offset ``--samples`` times,
``--interval-s`` apart, then writes the samples as CSV (through Spark, so the table can
live wherever Spark writes), prints the total per sample, and draws the total per topic
over time to a PNG.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from metaq.client.pull_consumer import PullConsumer
from metaq.spark.jobs.common import parser, session


@dataclass(frozen=True)
class LagSample:
    at_ms: int
    topic: str
    broker: str
    queue: int
    end_offset: int
    committed: int
    """-1 when the group never committed this queue (then all of it counts as lag)."""

    @property
    def lag(self) -> int:
        return max(self.end_offset - max(self.committed, 0), 0)


async def sample(nameservers: Sequence[str], group: str, topics: Sequence[str]) -> list[LagSample]:
    """One sample of every readable queue of ``topics``."""
    now = int(time.time() * 1000)
    out: list[LagSample] = []
    async with PullConsumer(nameservers, group) as consumer:
        for topic in topics:
            queues = await consumer.queues(topic, refresh=True)
            answers = await asyncio.gather(*(consumer.query(topic, q) for q in queues))
            out += (
                LagSample(
                    now,
                    topic,
                    q.broker_name,
                    q.queue_id,
                    a.max_offset,
                    -1 if a.committed is None else a.committed,
                )
                for q, a in zip(queues, answers, strict=True)
            )
    return out


def chart(samples: Sequence[LagSample], group: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    totals: dict[str, dict[int, int]] = {}
    for s in samples:
        per_topic = totals.setdefault(s.topic, {})
        per_topic[s.at_ms] = per_topic.get(s.at_ms, 0) + s.lag
    start = min(s.at_ms for s in samples)
    fig, ax = plt.subplots(figsize=(8, 4))
    for topic, series in sorted(totals.items()):
        xs = sorted(series)
        ax.plot([(x - start) / 1000 for x in xs], [series[x] for x in xs], marker="o", label=topic)
    ax.set_xlabel("seconds since the first sample")
    ax.set_ylabel("messages not yet consumed")
    ax.set_title(f"accumulation of consumer group {group}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = parser("Chart a consumer group's lag over time.")
    p.add_argument("--group", required=True)
    p.add_argument("--topics", required=True, help="comma list")
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--interval-s", type=float, default=5.0)
    p.add_argument("--output", required=True, help="directory for lag.csv/ and lag.png")
    args = p.parse_args(argv)
    if args.samples < 1 or args.interval_s < 0:
        p.error("--samples must be at least 1 and --interval-s not negative")
    nameservers = args.nameservers.split(",")
    topics = [t.strip() for t in args.topics.split(",") if t.strip()]
    samples: list[LagSample] = []
    for n in range(args.samples):
        if n:
            time.sleep(args.interval_s)  # the sampling period the user asked for
        samples += asyncio.run(sample(nameservers, args.group, topics))
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    spark = session("lag_report", args.master)
    table = spark.createDataFrame(
        [(s.at_ms, s.topic, s.broker, s.queue, s.end_offset, s.committed, s.lag) for s in samples],
        "at_ms long, topic string, broker string, queue int, end_offset long, committed long, "
        "lag long",
    )
    table.coalesce(1).write.mode("overwrite").option("header", True).csv(str(output / "lag.csv"))
    table.groupBy("at_ms", "topic").sum("lag").orderBy("at_ms", "topic").show(truncate=False)
    chart(samples, args.group, output / "lag.png")
    print(f"lag table in {output / 'lag.csv'}, chart in {output / 'lag.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
