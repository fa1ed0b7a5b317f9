"""``make spark-demo``: the Double-11 live room end to end, for a bounded time.

Uses the cluster at ``$METAQ_NAMESERVERS``, or starts the local one (``make run``'s, data
under ``run-data/spark-demo/cluster``). Creates ``orders`` and ``order-stats``, sends
orders at ``--rate`` per second while ``live_orders`` aggregates them for ``--seconds``,
then prints the last closed minute's aggregates and where the Parquet went.
``--spark-master`` runs the job with spark-submit on a Spark master (``standalone``:
start one from the pyspark installation first); by default it runs in ``local[*]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from metaq.spark.jobs import live_orders
from metaq.spark.jobs.order_generator import generate
from metaq.spark.standalone import StandaloneCluster

DATA = Path("run-data/spark-demo")
READY_TIMEOUT_S = 60.0


def start_local_cluster() -> subprocess.Popen[bytes]:
    cluster = subprocess.Popen(
        [sys.executable, "scripts/local_cluster.py", "--data-dir", str(DATA / "cluster")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert cluster.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    said: list[str] = []
    for line in cluster.stdout:
        if b"local cluster up" in line:
            threading.Thread(target=cluster.stdout.read, daemon=True).start()  # drain
            return cluster
        said.append(line.decode(errors="replace").rstrip())
        if time.monotonic() > deadline:
            break
    cluster.kill()
    why = [line for line in said if line.startswith("local cluster:")] or said[-5:]
    raise SystemExit("the local cluster did not start:\n  " + "\n  ".join(why or ["(no output)"]))


def create_topic(nameserver: str, topic: str) -> None:
    """Create the topic unless an earlier demo run (same data dir) already did."""
    done = subprocess.run(
        [sys.executable, "-m", "metaq.client.cli", "topic", "create", "-n", nameserver,
         "--queues", "4", topic],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    if done.returncode and "already exists" not in done.stderr:
        raise SystemExit(f"creating topic {topic} failed: {done.stderr.strip()}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=150.0)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--spark-master", default="")
    args = p.parse_args()
    nameservers = os.environ.get("METAQ_NAMESERVERS", "")
    cluster = None if nameservers else start_local_cluster()
    nameservers = nameservers or "127.0.0.1:9876"
    standalone: StandaloneCluster | None = None
    try:
        for topic in ("orders", "order-stats"):
            create_topic(nameservers.split(",")[0], topic)
        output = DATA / f"live-orders-{int(time.time())}"
        generator = threading.Thread(
            target=lambda: asyncio.run(
                generate(nameservers.split(","), "orders", args.rate, seconds=args.seconds)
            ),
            daemon=True,
        )
        generator.start()
        job = [
            "--nameservers", nameservers, "--output", str(output.resolve()),
            "--run-seconds", str(args.seconds + 15),
        ]  # fmt: skip
        if args.spark_master:
            master = args.spark_master
            if master == "standalone":
                standalone = StandaloneCluster.start(DATA / "spark-standalone")
                master = standalone.master_url
            print(f"submitting live_orders to {master}")
            submitted = StandaloneCluster(DATA / "spark-standalone", master)
            print(submitted.submit(Path(live_orders.__file__), *job, timeout_s=args.seconds + 300))
        else:
            live_orders.main([*job, "--master", "local[*]"])
        generator.join()
        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        spark = SparkSession.builder.master("local[1]").getOrCreate()
        stats = spark.read.parquet(str(output / "stats"))
        newest = stats.agg({"window_start": "max"}).first()
        if newest is None or newest[0] is None:
            raise SystemExit(f"no minute closed yet in {output / 'stats'}; run it longer")
        print(f"\nlast closed minute ({newest[0]}):")
        stats.where(F.col("window_start") == newest[0]).orderBy("category").show(truncate=False)
        print(f"Parquet: {output / 'stats'}; the same rows on topic order-stats")
    finally:
        if standalone is not None:
            standalone.stop()
        if cluster is not None:
            cluster.send_signal(signal.SIGTERM)
            cluster.wait(60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
