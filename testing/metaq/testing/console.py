"""What the console tests share: the cluster they run against, the browser page they
drive (Playwright's, passed in: this package does not depend on it), and plain HTTP
calls to the admin APIs."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from metaq.client.message import Message
from metaq.client.push_consumer import PushConsumer
from metaq.testing import BrokerProcess
from metaq.testing.cluster import Cluster, ClusterBuilder
from metaq.testing.nameserver_process import NameServerProcess
from metaq.testing.waiting import run_async

CHROMIUM = Path("/usr/bin/chromium")
GROUPS = ("group-a", "group-b")
TOPIC = "orders"
QUEUES = 2
BROKER_TIMEOUT_MS = 1500
SAMPLE_INTERVAL_MS = 500


def call(method: str, url: str, body: Any = None, timeout_s: float = 10.0) -> tuple[int, Any]:
    """(status, JSON) of one HTTP request; JSON bodies for changes, as the admin APIs want."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as refused:
        return refused.code, json.load(refused)


# The overview shows a group amber once a broker's disk passes the cleaning ratio (0.75 by
# default): the brokers here share the host's filesystem, whose fill level is not the
# test's to choose, so its thresholds sit near the top.
HOST_DISK_IGNORED: Final = (
    "--set", "store.disk_clean_ratio=0.97",
    "--set", "store.disk_force_clean_ratio=0.98",
    "--set", "store.disk_full_ratio=0.99",
)  # fmt: skip

BUILDER = ClusterBuilder(
    groups=GROUPS, replicas=2, replication_mode="sync", min_in_sync=2,
    nameserver_args=("--http-port", "0", "--console-broker-timeout-ms", str(BROKER_TIMEOUT_MS),
                     "--console-sample-interval-ms", str(SAMPLE_INTERVAL_MS)),
    broker_args=HOST_DISK_IGNORED,
)  # fmt: skip
"""One nameserver serving the console and two groups of a master and a sync slave."""


@dataclass
class ConsoleCluster:
    cluster: Cluster

    @property
    def nameserver(self) -> NameServerProcess:
        return self.cluster.nameservers[0]

    @property
    def brokers(self) -> dict[tuple[str, int], BrokerProcess]:
        return self.cluster.brokers

    @property
    def console_url(self) -> str:
        return f"http://{self.nameserver.http_address}"

    def route_master(self, group: str, topic: str = TOPIC) -> int | None:
        """The id of the group's master in the nameserver's route of ``topic``."""
        status, route = call("GET", f"{self.console_url}/route/{topic}")
        if status != 200:
            return None
        for g in route["groups"]:
            if g["broker_name"] == group:
                return next((b["broker_id"] for b in g["brokers"] if b["role"] == "master"), None)
        return None

    def route_ids(self, group: str, topic: str = TOPIC) -> list[int]:
        """The ids of the group's brokers in the nameserver's route of ``topic``."""
        status, route = call("GET", f"{self.console_url}/route/{topic}")
        assert status == 200, route
        return [b["broker_id"] for g in route["groups"] if g["broker_name"] == group
                for b in g["brokers"]]  # fmt: skip

    def master(self, group: str) -> BrokerProcess:
        found = self.route_master(group)
        assert found is not None, f"{group} has no master in the route"
        return self.brokers[(group, found)]


def all_in_sync(cluster: ConsoleCluster) -> bool:
    status, view = call("GET", f"{cluster.console_url}/cluster")
    if status != 200:
        return False
    groups = [g for c in view["clusters"] for g in c["groups"]]
    masters = [b for g in groups for b in g["brokers"] if b["state"]["role"] == "master"]
    return len(groups) == 2 and all(sorted(b["state"]["in_sync_ids"]) == [0, 1] for b in masters)


@dataclass
class Browser:
    """One page of a shared Chromium that records console errors and failed requests."""

    page: Any
    results: Path
    """Where :meth:`screenshot` saves."""
    problems: list[str] = field(default_factory=list)

    def screenshot(self, name: str) -> Path:
        self.results.mkdir(parents=True, exist_ok=True)
        path = self.results / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


class LiveConsumer:
    """A push consumer of the cluster running on its own thread and event loop (the
    browser's sync API keeps one on the test's thread), until :meth:`stop`."""

    def __init__(self, nameserver: str, group: str, topic: str, room: str) -> None:
        self.received: list[bytes] = []
        self.client_id = f"console-test-{room}"
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(nameserver, group, topic, room), daemon=True
        )
        self._thread.start()
        if not self._started.wait(30) or self._error is not None:
            raise AssertionError(f"the consumer did not start: {self._error!r}")

    def _run(self, nameserver: str, group: str, topic: str, room: str) -> None:
        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            consumer = PushConsumer(
                [nameserver], group, client_id=self.client_id, computer_room=room
            )

            async def handle(message: Message) -> None:
                self.received.append(message.body)

            consumer.subscribe(topic, handle)
            await consumer.start()
            self._started.set()
            try:
                await self._stop.wait()
            finally:
                await consumer.close()

        try:
            run_async(main(), timeout_s=300)
        except BaseException as exc:
            self._error = exc
            self._started.set()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        if self._error is not None:
            raise AssertionError(f"the consumer failed: {self._error!r}")


class LiveProducer:
    """A producer of the cluster connected on its own thread and event loop, so the
    brokers list it while a test drives the browser, until :meth:`stop`."""

    def __init__(self, nameserver: str, group: str, client_id: str) -> None:
        from metaq.client.producer import Producer

        async def started() -> Producer:
            producer = Producer([nameserver], group=group, client_id=client_id)
            await producer.start()
            return producer

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.producer: Producer = self._call(started())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    def send(self, topic: str, body: bytes, **options: Any) -> Any:
        """``Producer.send`` on the producer's loop; its result."""
        return self._call(self.producer.send(topic, body, **options))

    def stop(self) -> None:
        try:
            self._call(self.producer.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            self._loop.close()
