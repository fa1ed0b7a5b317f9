"""Support for the Spark tests: a local SparkSession set up for the suite, and a small real
metaq cluster (a nameserver and broker masters as processes) with topics created on a
deadline. Kept with the tests: metaq.spark itself depends on the client only."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from metaq.client.admin import Admin, TopicSettings
from metaq.client.errors import UnknownTopic
from metaq.client.routes import RouteCache
from metaq.common.model import TopicRoute
from metaq.testing import BrokerProcess
from metaq.testing.nameserver_process import NameServerProcess, start_nameserver


def local_spark(app_name: str = "metaq-tests") -> Any:
    """One local SparkSession for a test run: two cores, a failed task tried up to four
    times (``local[2,4]``; plain ``local`` never retries), loopback only, no UI, two shuffle
    partitions, executors' Python = this interpreter (so they import the installed
    ``metaq.spark``), ``format("metaq")`` registered."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Python workers import pyspark, pyarrow and pandas; without cached bytecode each one
    # compiles them again (seconds per worker), which would dominate the tests' run time.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from metaq.spark import register

    spark = (
        SparkSession.builder.master("local[2,4]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


@dataclass
class Cluster:
    """Nameserver + broker masters, stopped by :meth:`stop`."""

    nameserver: NameServerProcess
    brokers: dict[str, BrokerProcess] = field(default_factory=dict)

    @property
    def nameservers(self) -> str:
        return self.nameserver.grpc_address

    def stop(self) -> None:
        for broker in self.brokers.values():
            broker.kill()
        self.nameserver.stop()

    async def create_topic(
        self,
        topic: str,
        *,
        queues: int = 2,
        brokers: Sequence[str] | None = None,
        timeout_s: float = 15.0,
    ) -> TopicRoute:
        """Create the topic on the brokers and wait until the nameserver routes it there
        with ``queues`` queues each."""
        names = list(brokers or self.brokers)
        for name in names:
            await Admin().put_topic(
                self.brokers[name].http_url,
                topic,
                TopicSettings(read_queues=queues, write_queues=queues),
            )
        deadline = time.monotonic() + timeout_s
        async with RouteCache([self.nameservers]) as routes:
            while True:
                with contextlib.suppress(UnknownTopic):
                    route = await routes.route(topic, refresh=True)
                    counts = {g.broker_name: g.read_queues for g in route.groups}
                    if all(counts.get(n) == queues for n in names):
                        return route
                if time.monotonic() > deadline:
                    raise AssertionError(f"the nameserver did not route {topic} to {names}")
                await asyncio.sleep(0.02)  # poll interval of a deadline-bound wait

    async def pulled(self, topic: str) -> int:
        """Messages of ``topic`` the brokers have returned to pulls (their metrics)."""
        total = 0.0
        for broker in self.brokers.values():
            for (name, labels), value in (await Admin().metrics(broker.http_url)).items():
                if name == "metaq_messages_out_total" and ("topic", topic) in labels:
                    total += value
        return int(total)


def start_cluster(
    work_dir: Path, broker_names: Sequence[str] = ("broker-a", "broker-b")
) -> Cluster:
    cluster = Cluster(start_nameserver(work_dir / "ns"))
    try:
        for name in broker_names:
            cluster.brokers[name] = BrokerProcess.start(
                work_dir / name, "--broker-name", name, "--nameserver", cluster.nameservers
            )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def integration_module(name: str) -> ModuleType:
    """A fixture module of tests/integration, such as ``replica_group`` (imported by path:
    tests import in importlib mode)."""
    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).parents[2] / "tests" / "integration" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
