"""The chaos scenarios (issue 5): each starts its own cluster, runs the workload, makes its
faults, heals everything, checks the replicas, drains the consumers, and hands the
history to the checker.

A scenario's faults are held for fixed times (a pause *is* 15 s of SIGSTOP); every wait
for the cluster to react is a condition with a deadline. ``short`` trims the number of
rounds for the CI selection, never the checks.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoslib import adversary, disk
from chaoslib.checker import Result, check
from chaoslib.cluster import (
    GROUPS,
    NAMESERVERS,
    SEGMENT_BYTES,
    TOPICS,
    Cluster,
    ClusterSpec,
    all_routed,
    broker_id,
    broker_name,
    controller_state,
    group_of,
)
from chaoslib.history import HistoryWriter, read_history
from chaoslib.net import Unsupported
from chaoslib.workload import ConsumerSpec, ProducerSpec
from metaq.client.producer import Producer
from metaq.common.errors import InvalidRecord
from metaq.common.record import decode, encode
from metaq.common.v1.data_pb2 import PullResponse, SendResponse
from metaq.replication.epochs import EpochHistory
from metaq.testing import DataClient
from metaq.testing.waiting import hold, wait_until


def default_producers() -> list[ProducerSpec]:
    return [
        ProducerSpec("main-a", "chaos-a", "a", rate_hz=40),
        ProducerSpec("main-b", "chaos-b", "b", rate_hz=40),
        # One send at a time with a long timeout and no retry: a send stuck in a paused or
        # cut-off master's socket is answered by that master, whatever it answers.
        ProducerSpec("patient-a", "chaos-a", "a", rate_hz=4, send_timeout_s=30.0, retries=0),
        ProducerSpec("ordered-a", "chaos-ordered", "a", rate_hz=20, keys=8),
    ]


def high_rate_producers() -> list[ProducerSpec]:
    """The default producers plus one that keeps hundreds of sends in flight, as a busy
    application does: an attack that slows the broker shows as its failures."""
    return [
        *default_producers(),
        ProducerSpec("bulk-a", "chaos-a", "a", rate_hz=2000, in_flight=300, send_timeout_s=5.0),
    ]


def default_consumers() -> list[ConsumerSpec]:
    return [
        ConsumerSpec("chaos-main", ["chaos-a", "chaos-b"], concurrency=8),
        # One handler at a time, so the history records the order the queue gave.
        ConsumerSpec("chaos-ordered", ["chaos-ordered"], concurrency=1),
    ]


@dataclass
class Ctx:
    cluster: Cluster
    rng: random.Random
    duration_s: float
    short: bool

    def other(self, node: str) -> str:
        return next(n for n in self.cluster.members(group_of(node)) if n != node)


@dataclass
class Scenario:
    number: int
    name: str
    run: Callable[[Ctx], None]
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    expect: dict[str, Any] = field(default_factory=dict)
    summary: str = ""
    producers: Callable[[], list[ProducerSpec]] = default_producers
    consumers: Callable[[], list[ConsumerSpec]] = default_consumers
    after_drain: Callable[[Cluster], None] | None = None
    """Checks on the whole history once the consumers drained."""


# --- 1. kill -9 the master, five times -----------------------------------------------------


def kill_master(ctx: Ctx, kills: int = 5) -> None:
    c = ctx.cluster
    for _ in range(kills):
        c.wait_in_sync("a")
        hold(ctx.rng.uniform(1.0, 3.0))  # traffic with both in sync
        old = c.wait_master("a")
        killed = c.kill(old, failover=True)
        c.wait_new_master("a", old, killed)
        c.wait_acked("a", 20, 20.0, since=killed)
        hold(ctx.rng.uniform(1.0, 4.0))  # the new master writes alone
        c.restart(old)
        c.wait_in_sync("a")


# --- 2. SIGSTOP the master for 15 s ----------------------------------------------------------


def pause_master(ctx: Ctx) -> None:
    c = ctx.cluster
    c.wait_in_sync("a")
    old = c.wait_master("a")
    paused = c.pause(old, failover=True)
    new = c.wait_new_master("a", old, paused)
    c.wait_acked("a", 20, 20.0, since=paused)
    hold(max(0.0, paused + 15.0 - time.monotonic()))
    resumed = c.resume(old)
    wait_until(lambda: (c.health(old) or {}).get("role") == "slave", 20.0,
               f"{old} stepped down after the pause", poll_s=0.1)  # fmt: skip
    c.wait_in_sync("a")
    c.wait_acked("a", 20, 20.0, since=resumed)
    # A patient send stuck in the paused master's socket is answered by it after SIGCONT:
    # by then it was replaced, so it must not say OK.
    stale = [e for e in _sends(c, "patient-a") if paused <= e["invoked"] < resumed
             and e["t"] > resumed and e["type"] == "ok"]  # fmt: skip
    c.check("paused-master-acknowledged-nothing-after-replacement", not stale,
            f"{len(stale)} sends in its socket acknowledged after SIGCONT"
            if stale else f"{new} took over; the old master answered no send OK")  # fmt: skip


def _sends(c: Cluster, producer: str) -> list[dict[str, Any]]:
    """Finished sends of a producer, each with the time it was invoked."""
    invoked: dict[str, float] = {}
    out = []
    for e in read_history(c.history.path):
        if e["type"] == "invoke" and e["producer"] == producer:
            invoked[e["id"]] = e["t"]
        elif e["type"] in ("ok", "info") and e.get("producer") == producer:
            out.append({**e, "invoked": invoked.get(e["id"], e["t"])})
    return out


# --- 3. partition the master from the nameservers and its slave ------------------------------


def partition_master(ctx: Ctx) -> None:
    c = ctx.cluster
    c.wait_in_sync("a")
    old = c.wait_master("a")
    slave = ctx.other(old)
    start = c.partition({old}, {*NAMESERVERS, slave}, node=old, group="a", failover=True)
    try:
        c.wait_new_master("a", old, start)
        c.wait_acked("a", 20, 20.0, since=start)
        refused = _direct_send_refused(c, old)
        c.check("isolated-master-acknowledges-nothing", refused.startswith("refused"), refused)
        hold(max(0.0, start + 10.0 - time.monotonic()))
    finally:
        healed = c.heal(node=old, group="a")
    wait_until(lambda: (c.health(old) or {}).get("role") == "slave", 30.0,
               f"{old} rejoined as a slave after healing", poll_s=0.1)  # fmt: skip
    c.wait_in_sync("a")
    c.wait_acked("a", 20, 20.0, since=healed)


def _direct_send_refused(c: Cluster, node: str) -> str:
    """Send one message straight to ``node`` (the observer still reaches it): "refused"
    when it is not acknowledged (an error, or a status short of OK), else what happened."""
    broker = c.brokers[node]

    async def attempt() -> str:
        client = await DataClient.connect(broker.data_host, broker.data_port)
        try:
            record = encode("chaos-a", b"probe-not-in-history", queue_id=0)
            try:
                async with asyncio.timeout(10):
                    answer = await client.send("chaos-a", 0, [record])
            except TimeoutError:
                return "no answer within 10 s"
            except Exception as exc:
                return f"refused ({type(exc).__name__}: {str(exc)[:80]})"
            if answer.status != SendResponse.OK:
                return f"refused (status {SendResponse.Status.Name(answer.status)})"
            return "acknowledged a send while isolated"
        finally:
            await client.close()

    return asyncio.run(attempt())


# --- 4. kill the slave under min_in_sync_replicas = 2 ---------------------------------------


def kill_slave_min_isr2(ctx: Ctx) -> None:
    c = ctx.cluster
    c.wait_in_sync("a")
    master = c.wait_master("a")
    slave = ctx.other(master)
    killed = c.kill(slave)

    def refused() -> bool:
        c.tail.poll()
        return any(e["t"] > killed and e["group"] == "a" and "NOT_ENOUGH_REPLICAS" in
                   (e.get("error") or "") for e in c.tail.failures)  # fmt: skip

    wait_until(refused, 20.0, "sends to group a are refused for want of in-sync copies",
               poll_s=0.05)  # fmt: skip
    hold(3.0)
    restarted = c.restart(slave)
    c.wait_in_sync("a")
    caught_up = time.monotonic()
    c.wait_acked("a", 10, 20.0, since=restarted)
    oks = [e for e in _sends(c, "main-a") + _sends(c, "ordered-a") + _sends(c, "patient-a")
           if e["type"] == "ok" and e["invoked"] > killed and e["t"] < restarted]  # fmt: skip
    c.check("nothing-acknowledged-without-the-slave", not oks,
            f"{len(oks)} sends invoked after the slave died were acknowledged before it "
            "came back" if oks else "every send while the slave was down was refused or "
            "not acknowledged")  # fmt: skip
    resumed = min((e["t"] for e in _sends(c, "main-a")
                   if e["type"] == "ok" and e["t"] > restarted), default=None)  # fmt: skip
    delay = None if resumed is None else max(0.0, resumed - caught_up)
    c.check("resumed-within-5s-of-catching-up", delay is not None and delay <= 5.0,
            f"first acknowledged send {delay:.2f} s after the slave was seen in sync"
            if delay is not None else "never resumed")  # fmt: skip


# --- 5. power loss on the master, ASYNC flush ------------------------------------------------


def power_loss_master(ctx: Ctx) -> None:
    c = ctx.cluster
    c.wait_in_sync("a")
    old = c.wait_master("a")
    lost_power = c.power_loss(old, failover=True)
    new = c.wait_new_master("a", old, lost_power)
    c.wait_acked("a", 20, 20.0, since=lost_power)
    c.record_stored(old, "after power loss")
    before = c.health(new)
    assert before is not None
    end_at_restart = before["commitlog_write_offset"]
    c.restart(old, "power-loss")
    # It may be elected only once it holds at least what the master held at its return.
    seen: list[tuple[int, bool]] = []

    def electable() -> bool:
        control = c.committed("a")
        state = c.health(old)
        if control is None or state is None:
            return False
        member = broker_id(old) in control.in_sync_ids
        seen.append((state["commitlog_write_offset"], member))
        return member

    wait_until(electable, 40.0, f"{old} is in sync again", poll_s=0.05)
    early = [offset for offset, member in seen if member and offset < end_at_restart]
    c.check(
        "power-lost-master-not-electable-until-caught-up",
        not early,
        f"in the committed in-sync set while holding {early[0]} < {end_at_restart}"
        if early
        else f"first electable holding {seen[-1][0]} >= {end_at_restart}",
    )
    # Now make it the master: nothing acknowledged may be missing from it.
    c.wait_in_sync("a")
    killed = c.kill(new, failover=True)
    c.wait_new_master("a", new, killed)
    c.wait_acked("a", 20, 20.0, since=killed)
    c.restart(new)
    c.wait_in_sync("a")


# --- 9. async replication, kill -9 the master ------------------------------------------------


def async_kill_master(ctx: Ctx) -> None:
    c = ctx.cluster
    c.wait_in_sync("a")
    old = c.wait_master("a")
    slave = ctx.other(old)
    c.wait_acked("a", 100, 30.0)
    # At this workload's rate the slave copies every record within a millisecond, so a
    # kill would find nothing uncopied: hold the slave still for a second first (it
    # stays in sync: replica_lag_max_ms is 2 s), so the kill leaves a real tail behind.
    c.pause(slave)
    hold(1.0)
    lag = (c.health(old) or {}).get("replica_lag_bytes", {})
    killed = c.kill(old, failover=True)
    c.resume(slave)
    new = c.wait_new_master("a", old, killed)
    c.wait_acked("a", 20, 20.0, since=killed)
    fork = EpochHistory(c.data_dir(new) / "epochs.json").entries[-1].start_offset
    tail = [(offset, body.split(b" ", 1)[0].decode()) for offset, topic, body
            in disk.scan(c.data_dir(old)) if offset >= fork and topic in TOPICS]  # fmt: skip
    end = max((o for o, _ in tail), default=fork)
    c.history.write(
        "allow_loss",
        ids=[i for _, i in tail],
        group="a",
        why=f"async replication: {old}'s log past {fork}, never copied to {new}",
    )
    acked = {e["id"] for e in read_history(c.history.path) if e["type"] == "ok"}
    c.history.write("note", text=f"replica lag just before the kill: {lag} bytes; uncopied "
                    f"tail: {len(tail)} messages ({sum(1 for _, i in tail if i in acked)} "
                    f"acknowledged) from offset {fork} to {end}")  # fmt: skip
    c.record_stored(old, "before restart")
    c.restart(old)
    c.wait_in_sync("a")


# --- 6. a corrupted byte in a slave's segment -------------------------------------------------


def corrupt_slave_segment(ctx: Ctx) -> None:
    """Twice: after kill -9 (the start recovers, so it checks records) and after a clean
    stop (the start trusts the files). Each time the slave must not serve the damaged
    record, must not become electable holding it, and must end up with the master's
    bytes."""
    c = ctx.cluster
    for how in ("after kill -9", "after a clean stop"):
        c.wait_in_sync("a")
        c.wait_acked("a", 200, 60.0, since=time.monotonic())
        master = c.wait_master("a")
        slave = ctx.other(master)
        if how == "after kill -9":
            c.kill(slave)
        else:
            c.brokers[slave].terminate()
            c.fault("start", "clean-stop", node=slave, group="a")
        offset, victim = _flip_a_bit(c, slave, ctx.rng)
        tag = "crash" if how == "after kill -9" else "clean"
        try:
            c.restart(slave, "kill")
        except AssertionError as exc:
            detected = "CRC" in str(exc)
            c.check(
                f"{tag}: corruption-detected",
                detected,
                f"{how}: the slave refused to "
                "start" + (", naming the CRC mismatch" if detected else f": {exc}"[:300]),
            )
            c.check(f"{tag}: repaired-from-the-master", False,
                    "not repaired: the broker refuses to start until an operator moves the "
                    "damaged segment aside; here the slave's data directory is wiped and it "
                    "copies the whole log again")  # fmt: skip
            _wipe_and_restart(c, slave)
            continue
        served = _pull_one(c, slave, "chaos-a", victim)
        c.check(f"{tag}: corrupted-record-never-served", served != "corrupt",
                f"{how}: {victim} pulled from {slave}: {served}")  # fmt: skip
        electable_while_corrupt: list[bool] = []

        def repaired(
            slave: str = slave,
            master: str = master,
            offset: int = offset,
            electable_while_corrupt: list[bool] = electable_while_corrupt,
        ) -> bool:
            control = c.committed("a")
            good = _same_bytes(c, slave, master, offset)
            # The controller elects only a live, verified member of the in-sync set.
            state = c.brokers[slave].health()
            verified = state is not None and bool(state.get("verified"))
            in_sync = control is not None and broker_id(slave) in control.in_sync_ids
            electable_while_corrupt.append(in_sync and verified and not good)
            return good

        try:
            wait_until(repaired, 20.0, f"{slave} repaired {victim}", poll_s=0.2)
            fixed = "repaired from the master"
        except AssertionError:
            fixed = "still damaged 20 s after the restart"
        c.check(f"{tag}: repaired-from-the-master", fixed.startswith("repaired"), f"{how}: {fixed}")
        c.check(
            f"{tag}: not-electable-while-damaged",
            not any(electable_while_corrupt),
            f"{how}: "
            + (
                "in the committed in-sync set while holding the damaged record"
                if any(electable_while_corrupt)
                else "never electable while damaged"
            ),
        )
        if not fixed.startswith("repaired"):
            c.brokers[slave].terminate()
            _wipe_and_restart(c, slave)


def _flip_a_bit(c: Cluster, node: str, rng: random.Random) -> tuple[int, str]:
    """Flip the last bit of one chaos-a record's body, a quarter to half way into the log:
    the header still parses, only the CRC can tell. Returns its offset and id."""
    records = [(o, b) for o, t, b in disk.scan(c.data_dir(node)) if t == "chaos-a"]
    offset, body = records[rng.randrange(len(records) // 4, len(records) // 2)]
    victim = body.split(b" ", 1)[0].decode()
    path = c.data_dir(node) / "commitlog" / f"{offset - offset % SEGMENT_BYTES:020d}"
    with path.open("r+b") as file:
        pos = offset % SEGMENT_BYTES
        file.seek(pos)
        at = pos + int.from_bytes(file.read(4), "little") - 1
        file.seek(at)
        byte = file.read(1)[0]
        file.seek(at)
        file.write(bytes([byte ^ 0x01]))
    c.history.write("corrupted", node=node, id=victim, commitlog_offset=offset, byte=at)
    return offset, victim


def _same_bytes(c: Cluster, a: str, b: str, offset: int) -> bool:
    end = offset + 8192
    return (
        disk.commitlog_bytes(c.data_dir(a), end)[offset:]
        == disk.commitlog_bytes(c.data_dir(b), end)[offset:]
    )


def _wipe_and_restart(c: Cluster, node: str) -> None:
    """What an operator does with a damaged slave: empty its data directory; it copies
    the master's whole log again."""
    shutil.rmtree(c.data_dir(node))
    c.history.write("note", text=f"{node}'s data directory wiped by the operator step")
    c.restart(node, "kill")


def _pull_one(c: Cluster, node: str, topic: str, wanted: str) -> str:
    """Find ``wanted`` in ``topic`` on ``node`` by pulling every queue: "ok" (found, CRC
    good), "corrupt" (served with a bad CRC), "absent", or an error."""

    broker = c.brokers[node]

    async def search() -> str:
        client = await DataClient.connect(broker.data_host, broker.data_port)
        try:
            for queue_id in range(4):
                offset = 0
                while True:
                    response, payload = await client.pull(topic, queue_id, offset,
                                                          max_messages=64)  # fmt: skip
                    if response.status != PullResponse.FOUND:
                        break
                    view, at = memoryview(payload), 0
                    while at < len(view):
                        size = int.from_bytes(view[at : at + 4], "little")
                        try:
                            record = decode(view, at)
                        except InvalidRecord:
                            record = decode(view, at, verify=False)
                            if record.body.startswith(wanted.encode() + b" "):
                                return "corrupt"
                            return (
                                f"corrupt record served before reaching it ({record.body[:20]!r})"
                            )
                        if record.body.startswith(wanted.encode() + b" "):
                            return "ok"
                        at += size
                    offset = response.next_offset
            return "absent"
        except Exception as exc:
            return f"error: {exc}"
        finally:
            await client.close()

    return asyncio.run(search())


# --- 12. disk full on a master ----------------------------------------------------------------


def disk_full_master(ctx: Ctx) -> None:
    """Fill group a's master's filesystem past ``disk_full_ratio``: it refuses writes
    (never acknowledging one it did not store), keeps serving reads, the producers carry
    on with group b, and writes resume once space is freed."""
    c = ctx.cluster
    c.wait_in_sync("a")
    master = c.wait_master("a")
    filler = disk.fill_disk(c.data_dir(master), used_ratio=0.95)
    c.fault("start", "disk-full", node=master, group="a")
    wait_until(lambda: (c.health(master) or {}).get("status") == "not-writable", 20.0,
               f"{master} refuses writes with its disk full", poll_s=0.2)  # fmt: skip
    refused = time.monotonic()
    reason = str((c.health(master) or {}).get("reason"))
    c.check("disk-full: refusal says why", "disk" in reason, reason)
    c.wait_acked("b", 20, 20.0, since=refused)
    served = asyncio.run(_first_record(c, master, "chaos-a"))
    c.check("disk-full: reads go on", served == "found", f"pull from {master}: {served}")
    hold(10.0)
    # Sends invoked once the refusal showed must all have failed on group a.
    invoked: dict[str, float] = {}
    acked = []
    for e in read_history(c.history.path):
        if e["type"] == "invoke":
            invoked[e["id"]] = e["t"]
        elif e["type"] == "ok" and e["group"] == "a" and invoked.get(e["id"], 0.0) > refused:
            acked.append(e)
    c.check("disk-full: nothing acknowledged by the full master", not acked,
            f"{len(acked)} sends to group a acknowledged while its master's disk was full"
            if acked else "every send to group a failed while its disk was full")  # fmt: skip
    filler.unlink()
    freed = c.fault("end", "disk-full", node=master, group="a")
    c.wait_acked("a", 20, 30.0, since=freed)
    resumed = c.tail.first_ack_since("a", freed)
    c.check("disk-full: writes resume within 5 s of space freed",
            resumed is not None and resumed - freed <= 5.0,
            f"first acknowledgement {resumed - freed:.2f} s after the filler was removed"
            if resumed is not None else "no acknowledgement")  # fmt: skip


async def _first_record(c: Cluster, node: str, topic: str) -> str:
    broker = c.brokers[node]
    client = await DataClient.connect(broker.data_host, broker.data_port)
    try:
        response, _ = await client.pull(topic, 0, 0, max_messages=1)
        return "found" if response.status == PullResponse.FOUND else str(response.status)
    except Exception as exc:
        return f"error: {exc}"
    finally:
        await client.close()


# --- 7. every nameserver down for 60 s --------------------------------------------------------


def nameservers_down(ctx: Ctx) -> None:
    c = ctx.cluster
    for group in GROUPS:
        c.wait_in_sync(group)
    outage_s = 20.0 if ctx.short else 60.0
    for node in NAMESERVERS:
        c.nameservers[node].kill()
    down = time.monotonic()
    for group in GROUPS:
        c.fault("start", "nameservers-down", node="ns*", group=group)
    reads_before = c.tail.reads
    hold(5.0)
    # New clients fail at once with a message that says why.
    new_client = _new_producer_error(c)
    c.check("new-client-fails-clearly", "no nameserver answered" in new_client, new_client)
    hold(max(0.0, down + outage_s - 10.0 - time.monotonic()))
    late = time.monotonic()
    hold(10.0)
    for group in GROUPS:
        n = c.tail.acked_since(group, late)
        c.check(f"group-{group}-writes-on-cached-routes", n > 0,
                f"{n} sends acknowledged in the outage's last 10 s")  # fmt: skip
    c.tail.poll()
    c.check("consumers-read-on-cached-routes", c.tail.reads > reads_before,
            f"{c.tail.reads - reads_before} messages read during the outage")  # fmt: skip
    # One nameserver back: how long until it routes every topic to a master again?
    c.start_nameserver("ns0")
    back = time.monotonic()
    for group in GROUPS:
        c.fault("end", "nameservers-down", node="ns0", group=group)
    converged = _route_convergence(c, ["ns0"], back, 30.0)
    c.check(
        "routes-converge-within-5s-of-one-nameserver",
        converged is not None and converged <= 5.0,
        f"{converged} s" if converged is not None else "not in 30 s",
    )
    c.start_nameserver("ns1")
    back = time.monotonic()
    converged = _route_convergence(c, ["ns0", "ns1"], back, 30.0)
    c.check(
        "routes-converge-within-5s-of-a-majority",
        converged is not None and converged <= 5.0,
        f"{converged} s" if converged is not None else "not in 30 s",
    )
    c.start_nameserver("ns2")
    for group in GROUPS:
        c.wait_in_sync(group, 60.0)


def _new_producer_error(c: Cluster) -> str:
    async def attempt() -> str:
        try:
            async with Producer(c.nameserver_addresses, retries=0, send_timeout_s=3.0) as p:
                await p.send("chaos-a", b"from a new client")
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "the send succeeded"

    return asyncio.run(attempt())


def _route_convergence(c: Cluster, nodes: list[str], since: float,
                       timeout_s: float) -> float | None:  # fmt: skip
    addresses = [c.nameservers[n].grpc_address for n in nodes]
    try:
        wait_until(lambda: asyncio.run(all_routed(addresses)), timeout_s,
                   f"{nodes} route every topic to a master", poll_s=0.1)  # fmt: skip
    except AssertionError:
        return None
    return round(time.monotonic() - since, 2)


# --- 8. the nameserver majority cut from one nameserver ----------------------------------------


def nameserver_partition(ctx: Ctx) -> None:
    c = ctx.cluster
    for group in GROUPS:
        c.wait_in_sync(group)
    leader = next(n for n in NAMESERVERS if _is_leader(c, n))
    rest = [n for n in NAMESERVERS if n != leader]
    watch = SplitBrainWatch(c)
    watch.start()
    try:
        cut = c.partition({leader}, set(rest), node=leader, group="")
        hold(4.0)
        old = c.wait_master("a")
        killed = c.kill(old, failover=True)
        c.wait_new_master("a", old, killed, timeout_s=30.0)
        c.wait_acked("a", 20, 30.0, since=killed)
        hold(max(0.0, cut + 15.0 - time.monotonic()))
        c.heal(node=leader)
        c.restart(old)
        for group in GROUPS:
            c.wait_in_sync(group, 60.0)
        wait_until(lambda: watch.nameservers_agree(), 30.0, "every nameserver holds the "
                   "same controller state", poll_s=0.2)  # fmt: skip
    finally:
        watch.stop()
    c.check(
        "at-most-one-master-per-group-and-epoch-among-brokers",
        not watch.broker_conflicts,
        "; ".join(watch.broker_conflicts[:3]) or f"{watch.samples} samples",
    )
    c.check(
        "at-most-one-master-per-group-and-epoch-in-the-controller",
        not watch.controller_conflicts,
        "; ".join(watch.controller_conflicts[:3]) or f"{watch.samples} samples",
    )


def _is_leader(c: Cluster, node: str) -> bool:
    try:
        return asyncio.run(controller_state(c.nameservers[node].grpc_address)).is_leader
    except Exception:
        return False


class Watch:
    """A thread that calls :meth:`sample` every ``interval_s`` until stopped."""

    name = "watch"

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples += 1
            self.sample()

    def sample(self) -> None:
        raise NotImplementedError


class SplitBrainWatch(Watch):
    """Samples every broker's (role, epoch) and every nameserver's controller state,
    remembering who was master of which group at which epoch, by either account."""

    name = "split-brain-watch"

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(0.1)
        self.c = cluster
        self.brokers_seen: dict[tuple[str, int], set[str]] = {}
        self.controller_seen: dict[tuple[str, int], set[int]] = {}
        self.last_states: dict[str, dict[str, tuple[int, int]]] = {}

    def sample(self) -> None:
        for node in self.c.spec.brokers:
            state = self.c.health(node)
            if state and state["role"] == "master":
                key = (group_of(node), state["epoch"])
                self.brokers_seen.setdefault(key, set()).add(node)
        for ns in NAMESERVERS:
            server = self.c.nameservers.get(ns)
            if server is None or server.process.poll() is not None:
                continue
            try:
                answer = asyncio.run(controller_state(server.grpc_address))
            except Exception:
                continue
            states = {}
            for g in answer.groups:
                self.controller_seen.setdefault((g.broker_name, g.epoch), set()).add(g.master_id)
                states[g.broker_name] = (g.epoch, g.master_id)
            self.last_states[ns] = states

    @property
    def broker_conflicts(self) -> list[str]:
        return [f"group {g} epoch {e}: masters {sorted(n)}"
                for (g, e), n in sorted(self.brokers_seen.items()) if len(n) > 1]  # fmt: skip

    @property
    def controller_conflicts(self) -> list[str]:
        return [f"{g} epoch {e}: masters {sorted(m)}"
                for (g, e), m in sorted(self.controller_seen.items()) if len(m) > 1]  # fmt: skip

    def nameservers_agree(self) -> bool:
        states = list(self.last_states.values())
        return len(states) == len(NAMESERVERS) and all(s == states[0] for s in states)


# --- 11. a stale nameserver and the master's lease (async) ------------------------------------


def stale_nameserver_lease(ctx: Ctx) -> None:
    """Beyond the issue's list: group a's master keeps one nameserver, itself cut off from
    the Raft majority; the majority replaces the master. A replaced master must stop
    acknowledging within its lease, whatever a stale nameserver tells it (under async
    replication nothing else stops it)."""
    c = ctx.cluster
    for group in GROUPS:
        c.wait_in_sync(group)
    old = c.wait_master("a")
    slave = ctx.other(old)
    stale = next(n for n in NAMESERVERS if not _is_leader(c, n))
    majority = {n for n in NAMESERVERS if n != stale}
    start = c.partition({old}, {*majority, slave}, node=old, group="a", failover=True)
    c.net.partition({stale}, majority)
    c.history.write(
        "note", text=f"{old} reaches only {stale}, which is cut from {sorted(majority)}"
    )
    try:
        c.wait_new_master("a", old, start, timeout_s=30.0)
        elected = time.monotonic()
        hold(10.0)
        role = (c.health(old) or {}).get("role")
        c.history.write("note", text=f"10 s after the election {old} reports role {role}")
        # The old master's log as it stands, before healing cuts its tail: read while
        # it is stopped, so nothing it acknowledges is missed.
        c.brokers[old].pause()
        held_by_old = set(disk.stored_ids(c.data_dir(old), list(TOPICS)))
    finally:
        c.heal(node=old, group="a")
        c.brokers[old].resume()
    c.history.write("stored", node=old, group="a", when="before healing", ids=sorted(held_by_old))
    c.wait_in_sync("a", 60.0)
    lease_s = 2.0
    acks = [e for e in read_history(c.history.path) if e["type"] == "ok" and e["group"] == "a"]
    new_log = set(disk.stored_ids(c.data_dir(slave), list(TOPICS)))
    only_old = {i for i in held_by_old if i not in new_log}
    # Async replication may lose what the old master acknowledged before its successor
    # was elected and its lease ran out; nothing after.
    c.history.write("allow_loss", group="a", why="async: acknowledged within the old lease",
                    ids=[e["id"] for e in acks if e["id"] in only_old
                         and e["t"] <= elected + lease_s])  # fmt: skip
    late = [e["id"] for e in acks if e["id"] in only_old and e["t"] > elected + lease_s]
    c.check("replaced-master-acknowledged-nothing-after-its-lease", not late,
            f"{old} acknowledged {len(late)} sends more than {lease_s} s after {slave} was "
            f"elected (first: {late[0]})" if late else "none")  # fmt: skip


# --- 13-16, 18-20. a stranger on the network: the adversary scenarios --------------------------


def _unchanged(c: Cluster, group: str, master: str, epoch: int, what: str) -> None:
    """The group kept its master and epoch through an attack."""
    now = c.wait_master(group)
    state = c.health(now) or {}
    c.check(f"{what}: group {group} kept its master", now == master and
            state.get("epoch") == epoch, f"master {now} at epoch {state.get('epoch')}, "
            f"was {master} at epoch {epoch}")  # fmt: skip


def adversary_raft(ctx: Ctx) -> None:
    """A pickle that would run code, sent to every nameserver's Raft port; then a real
    failover, which the controller must still decide while strangers flood every Raft
    port with a message announced as 2 GiB."""
    c = ctx.cluster
    for group in GROUPS:
        c.wait_in_sync(group)
    c.fault("start", "adversary-raft", node="nameservers", group="")
    for node in NAMESERVERS:
        marker = c.work_dir / f"ran-code-on-{node}"
        answer = adversary.raft_pickle(c.raft_address(node), marker)
        c.history.write("note", text=f"pickle to {node}'s Raft port: {answer}")
        c.check(f"raft: no code run on {node}", not marker.exists(),
                f"{marker.name} was created: the payload ran" if marker.exists()
                else answer)  # fmt: skip
    # Then streams of junk behind a 2 GiB length to every Raft port, while the controller
    # must decide a failover: each stream may cost a nameserver a few KiB at most.
    stop = threading.Event()
    floods = ThreadPoolExecutor(len(NAMESERVERS) * 2)
    streams = [floods.submit(adversary.raft_flood, c.raft_address(node), stop)
               for node in NAMESERVERS for _ in range(2)]  # fmt: skip
    try:
        old = c.wait_master("a")
        killed = c.kill(old, failover=True)
        c.wait_new_master("a", old, killed)
        c.wait_acked("a", 20, 20.0, since=killed)
    finally:
        stop.set()
        accounts = [stream.result() for stream in streams]
        floods.shutdown()
    c.fault("end", "adversary-raft", node="nameservers", group="")
    most = max(m for _, m in accounts)
    c.history.write("note", text=f"Raft floods: {accounts} (connections, most bytes out)")
    c.check("raft: a stranger's stream is dropped within a few KiB", most < 2 * 1024 * 1024,
            f"one connection got {most} bytes out before it was dropped")  # fmt: skip
    c.restart(old)
    c.wait_in_sync("a")


def adversary_takeover(ctx: Ctx) -> None:
    """Without the cluster secret: register a forged master under the live master's key,
    switch the group over (to a forged broker and to the real slave), unregister the
    master, and fetch the log as a slave that holds nothing."""
    c = ctx.cluster
    for group in GROUPS:
        c.wait_in_sync(group)
    master = c.wait_master("a")
    slave = ctx.other(master)
    epoch = (c.health(master) or {})["epoch"]
    name = broker_name("a")
    broker = c.brokers[master]
    # Nothing listens there: a client routed to it fails every send.
    forged = "127.0.0.1:9"
    start = c.fault("start", "adversary-takeover", node=master, group="a")

    async def attack() -> list[str]:
        # The fake slave first, while its target is surely the master; the switchovers
        # last, since each of the others would be moot once one of them succeeded.
        answers = [await adversary.fake_slave(
            broker.data_host, broker.data_port, name, 9, epoch, SEGMENT_BYTES, 3.0)]  # fmt: skip
        answers += [await adversary.forge_registration(ns, name, broker_id(master), forged, epoch)
                    for ns in c.nameserver_addresses]  # fmt: skip
        answers += [await adversary.unregister(ns, name, broker_id(master))
                    for ns in c.nameserver_addresses]  # fmt: skip
        answers.append(await adversary.switchover(c.nameserver_addresses[0], name, 7, epoch))
        answers.append(await adversary.switchover(c.nameserver_addresses[1], name,
                                                  broker_id(slave), epoch))  # fmt: skip
        return answers

    answers = asyncio.run(attack())
    for answer in answers:
        c.history.write("note", text=f"takeover: {answer}")
    accepted = [a for a in answers if a.endswith("accepted")]
    c.check("takeover: no forged request accepted", not accepted,
            "; ".join(accepted) or "every one refused")  # fmt: skip
    c.check("takeover: no log shipped to a stranger", " 0 bytes" in answers[0], answers[0])
    # What the forgeries would have set off (a route to nowhere, an election) shows within
    # the nameservers' expiry and the controller's cycle; hold that long, then judge.
    hold(5.0)
    in_sync = sorted((c.health(master) or {}).get("in_sync_ids", []))
    control = c.committed("a")
    c.check("takeover: the stranger never counted in sync", 9 not in in_sync and
            (control is None or 9 not in control.in_sync_ids),
            f"master's in-sync set {in_sync}, the controller's "
            f"{sorted(control.in_sync_ids) if control else None}")  # fmt: skip
    c.wait_acked("a", 100, 20.0, since=start)
    c.fault("end", "adversary-takeover", node=master, group="a")
    _unchanged(c, "a", master, epoch, "takeover")


def adversary_exhaustion(ctx: Ctx) -> None:
    """Against group a's master: thousands of idle connections, pipelined PULLs never
    read, frames declared near the size limit, and 120,000 made-up consumer groups (past
    the broker's limit); then a failover, whose promotion journals the offsets table
    those groups grew."""
    c = ctx.cluster
    for group in GROUPS:
        c.wait_in_sync(group)
    master = c.wait_master("a")
    epoch = (c.health(master) or {})["epoch"]
    broker = c.brokers[master]
    host, port = broker.data_host, broker.data_port
    pid = broker.proc.pid
    rss_before = adversary.rss_bytes(pid)
    watch = HealthWatch(c, master, pid)
    flood = adversary.Flood()
    start = c.fault("start", "adversary-exhaustion", node=master, group="a")
    watch.start()
    try:
        # Past the broker's max_consumer_groups (100,000): the rest are refused. First,
        # while this address may still connect (max_connections_per_address).
        accepted, answer = asyncio.run(adversary.fake_groups(host, port, "chaos-a", 120_000))
        c.history.write("note", text=f"exhaustion: {answer}")
        c.check("exhaustion: the consumer group limit held", 0 < accepted <= 100_000, answer)
        for answer in (
            flood.idle(host, port, 3000),
            flood.unread_pulls(host, port, "chaos-a", connections=3, pulls=2000),
            flood.huge_frames(host, port, connections=8, body_bytes=1 << 20),
        ):
            c.history.write("note", text=f"exhaustion: {answer}")
        c.wait_acked("a", 200, 30.0, since=start)
        hold(10.0)  # the attack stays in place while the workload goes on
    finally:
        flood.close()
        watch.stop()
        c.fault("end", "adversary-exhaustion", node=master, group="a")
    grown = watch.peak_rss - rss_before
    peak = watch.peak_rss >> 20
    c.history.write("note", text=f"exhaustion: {master}'s anonymous memory grew by "
                    f"{grown >> 20} MiB (peak {peak} MiB, {watch.peak_total >> 20} MiB with "
                    f"mapped files); {watch.samples} samples")  # fmt: skip
    c.check("exhaustion: health stayed ok", not watch.bad,
            "; ".join(watch.bad[:3]) or f"{watch.samples} samples ok")  # fmt: skip
    # What the limits allow here: 3 x (16 MiB of answers queued + what the kernel and
    # the transport hold) for the unread pulls, 100,000 groups' offsets and a snapshot
    # of them being written: about 240 MiB measured; unbounded, the pulls alone took
    # 1,022 MiB.
    c.check("exhaustion: memory bounded", grown < 384 << 20,
            f"grew by {grown >> 20} MiB (bound 384 MiB)")  # fmt: skip
    _unchanged(c, "a", master, epoch, "exhaustion")
    # The promotion after all that: taking the role, the new master journals every
    # group's offsets (Journal.write_offsets(full=True)) before it reports master.
    killed = c.kill(master, failover=True)
    new = c.wait_new_master("a", master, killed)
    c.wait_acked("a", 20, 20.0, since=killed)
    failed = [line for line in c.brokers[new].output.splitlines() if "offsets" in
              line.lower() and ("ERROR" in line or "Traceback" in line)]  # fmt: skip
    c.check("exhaustion: the promotion journaled every group's offsets", not failed,
            failed[0][:200] if failed else f"{new}'s output shows no offsets error")  # fmt: skip
    c.restart(master)
    c.wait_in_sync("a")


class HealthWatch(Watch):
    """Samples one broker's /health and resident memory until stopped."""

    name = "health-watch"

    def __init__(self, cluster: Cluster, node: str, pid: int) -> None:
        super().__init__(0.2)
        self.c, self.node, self.pid = cluster, node, pid
        self.peak_rss = 0
        self.peak_total = 0
        self.bad: list[str] = []

    def sample(self) -> None:
        self.peak_rss = max(self.peak_rss, adversary.rss_bytes(self.pid))
        self.peak_total = max(self.peak_total, adversary.rss_bytes(self.pid, "VmRSS"))
        state = self.c.health(self.node)
        if state is None or state.get("status") != "ok":
            self.bad.append(f"{time.monotonic():.1f}: {state}"[:200])


def adversary_disk(ctx: Ctx) -> None:
    """Fill group a's master's disk past the force-clean and the full ratios under a
    high-rate workload while consumer group ``chaos-held`` has read nothing yet; free it.
    Writes are refused before the kernel's ENOSPC, resume without a restart, and every
    acknowledged message is still there for the held group to read."""
    c = ctx.cluster
    c.wait_in_sync("a")
    master = c.wait_master("a")
    c.wait_acked("a", 40_000, 90.0)  # more than a segment of chaos-a nobody in chaos-held read
    filler = disk.fill_disk(c.data_dir(master), used_ratio=0.96)
    c.fault("start", "disk-full", node=master, group="a")
    wait_until(lambda: (c.health(master) or {}).get("status") == "not-writable", 20.0,
               f"{master} refuses writes with its disk full", poll_s=0.2)  # fmt: skip
    reason = str((c.health(master) or {}).get("reason"))
    c.check("disk: refusal says why", "disk" in reason, reason)
    hold(10.0)  # force-clean rounds run (store.clean_interval_s = 1)
    filler.unlink()
    freed = c.fault("end", "disk-full", node=master, group="a")
    c.wait_acked("a", 20, 30.0, since=freed)
    resumed = c.tail.first_ack_since("a", freed)
    c.check("disk: writes resume within 5 s of space freed",
            resumed is not None and resumed - freed <= 5.0,
            f"first acknowledgement {resumed - freed:.2f} s after the filler was removed"
            if resumed is not None else "no acknowledgement")  # fmt: skip
    enospc = [line for line in c.brokers[master].output.splitlines() if "No space left" in line]
    c.check("disk: no ENOSPC reached the store", not enospc,
            enospc[0][:200] if enospc else "none in the broker's output")  # fmt: skip
    c.release_held_consumers()


def adversary_descriptors(ctx: Ctx) -> None:
    """Against group a's master, under load: the master's open-file limit is cut below
    what it holds while new queues get their first messages (a new queue file
    needs a descriptor for a moment, a mapped one none), and given back after 10 s. The
    dispatcher waits for descriptors instead of dying, group a refuses sends meanwhile
    (the producers go to group b), and goes on when they return."""
    c = ctx.cluster
    c.wait_in_sync("a")
    master = c.wait_master("a")
    epoch = (c.health(master) or {})["epoch"]
    broker = c.brokers[master]
    pid = broker.proc.pid
    start = c.fault("start", "adversary-descriptors", node=master, group="a")
    status, said = adversary.huge_topic(broker.http_url, "chaos-grow", 64)
    c.check("descriptors: a topic that fits is taken", status == 200, f"{status} {said[:200]}")
    acked: dict[int, bytes] = {}

    async def first_messages() -> None:
        client = await DataClient.connect(broker.data_host, broker.data_port)
        try:
            for queue in range(64):
                body = f"chaos-grow {queue}".encode()
                record = encode("chaos-grow", body, queue_id=queue)
                try:
                    sent = await client.send("chaos-grow", queue, [record])
                except Exception:  # refused once the dispatcher waits: what is tested
                    continue
                if sent.status == SendResponse.OK:
                    acked[queue] = body
        finally:
            await client.close()

    # None free: a queue's file needs a descriptor only while it is created and mapped,
    # so any room at all would let the dispatcher through.
    soft = adversary.set_soft_nofile(pid, adversary.held_descriptors(pid) - 8)
    try:
        asyncio.run(first_messages())
        broker.wait_for_line("dispatch waiting for a file descriptor", 20.0)
        hold(10.0)  # the workload goes on against a master out of descriptors
        alive = broker.proc.poll() is None
        c.check("descriptors: the master lives through it", alive,
                f"pid {pid} running" if alive else "it exited")  # fmt: skip
    finally:
        adversary.set_soft_nofile(pid, soft)
    freed = c.fault("end", "adversary-descriptors", node=master, group="a")
    broker.wait_for_line("dispatch waiting for a file descriptor no longer", 20.0)
    c.wait_acked("a", 20, 30.0, since=freed)
    died = [line for line in broker.output.splitlines() if " died" in line]
    c.check("descriptors: no store thread died", not died, died[0][:200] if died else "none")

    async def read_back() -> list[int]:
        client = await DataClient.connect(broker.data_host, broker.data_port)
        try:
            read = {q: [r.body for r in await client.read_queue("chaos-grow", q)] for q in acked}
            return [q for q, body in acked.items() if read[q] != [body]]
        finally:
            await client.close()

    missing = asyncio.run(read_back())
    c.check("descriptors: every first message acknowledged is readable", not missing,
            f"{len(acked)} acknowledged, queues unreadable: {missing}")  # fmt: skip
    _unchanged(c, "a", master, epoch, "descriptors")
    c.history.write("note", text=f"descriptors: held {time.monotonic() - start:.1f} s, "
                    f"{len(acked)} of 64 first messages acknowledged")  # fmt: skip


def adversary_replay(ctx: Ctx) -> None:
    """What an operator's tools signed for one server, copied off the wire and sent to
    another within the proofs' window: a console switchover signed for ns0 (as the admin
    user and as a cluster member) sent to ns1, a gRPC Switchover signed for ns0 sent to
    ns1, and a topic creation signed for group a's master sent to its slave. Each is
    refused (401, UNAUTHENTICATED) naming the server it was signed for, and nothing
    changes: the group keeps its master and epoch, the slave gets no topic."""
    c = ctx.cluster
    for group in GROUPS:
        c.wait_in_sync(group)
    master = c.wait_master("a")
    slave = ctx.other(master)
    epoch = (c.health(master) or {})["epoch"]
    name = broker_name("a")
    ns0, ns1 = c.nameservers["ns0"], c.nameservers["ns1"]
    start = c.fault("start", "adversary-replay", node=master, group="a")
    console = f"/console/cluster/{name}/switchover"
    form = f"to={broker_id(slave)}&epoch={epoch}".encode()
    topic = b'{"read_queues": 2, "write_queues": 2}'
    created = "/topics/chaos-replayed"
    answers: dict[str, tuple[int, str]] = {}
    for signer, credentials in (("the admin user", c.credentials), ("a cluster member", None)):
        answers[f"a console switchover signed by {signer} for ns0, sent to ns1"] = (
            adversary.replayed_http(f"http://{ns0.http_address}{console}",
                                    f"http://{ns1.http_address}{console}", "POST", form,
                                    credentials=credentials))  # fmt: skip
        answers[f"a topic creation signed by {signer} for {master}, sent to {slave}"] = (
            adversary.replayed_http(c.brokers[master].http_url + created,
                                    c.brokers[slave].http_url + created, "PUT", topic,
                                    credentials=credentials))  # fmt: skip
    for what, (status, said) in answers.items():
        c.history.write("note", text=f"replay: {what}: {status} {said[:200]}")
        c.check(f"replay: {what} is refused as signed for another server",
                status == 401 and "signed for server" in said,
                f"{status} {said[:300]}")  # fmt: skip
    answer = asyncio.run(adversary.replayed_switchover(
        ns0.grpc_address, ns1.grpc_address, name, broker_id(slave), epoch))  # fmt: skip
    c.history.write("note", text=f"replay: a gRPC Switchover for ns0 sent to ns1: {answer}")
    c.check("replay: a gRPC Switchover signed for ns0, sent to ns1, is refused",
            "UNAUTHENTICATED" in answer and "signed for server" in answer, answer)  # fmt: skip
    # What a switchover would set off shows within the controller's cycle: hold that
    # long, then judge.
    hold(5.0)
    c.wait_acked("a", 100, 20.0, since=start)
    c.fault("end", "adversary-replay", node=master, group="a")
    _unchanged(c, "a", master, epoch, "replay")
    slave_topics = c.brokers[slave].http_url + "/topics"
    status, said = adversary.replayed_http(slave_topics, slave_topics, "GET",
                                           credentials=c.credentials)  # fmt: skip
    c.check(f"replay: {slave} holds no topic from a replayed creation",
            status == 200 and "chaos-replayed" not in said, f"{status} {said[:300]}")  # fmt: skip


def adversary_scrape(ctx: Ctx) -> None:
    """With ``metrics_auth`` on every server: a stranger asks each one's ``/metrics`` and
    ``/health`` without the scrape token and with a wrong one, while the workload runs.
    ``/metrics`` is refused (401) both ways; ``/health`` without a token says only its
    status, with a wrong one is refused; the observer's token gets both in full."""
    c = ctx.cluster
    for group in GROUPS:
        c.wait_in_sync(group)
    start = c.fault("start", "adversary-scrape", node="all", group="")
    bases = {node: broker.http_url for node, broker in c.brokers.items()}
    bases |= {node: f"http://{ns.http_address}" for node, ns in c.nameservers.items()}
    wrong = {"Authorization": "Bearer not-the-scrape-token"}

    def ask(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any, str]:
        status, said = adversary.scrape(url, headers)
        return status, said, f"{status} {str(said)[:200]}"

    for node, base in bases.items():
        for headers, how in (({}, "without the token"), (wrong, "with a wrong token")):
            status, said, got = ask(f"{base}/metrics", headers)
            c.check(f"scrape: {node}'s /metrics {how} is refused",
                    status == 401 and "metaq_" not in str(said), got)  # fmt: skip
        status, said, got = ask(f"{base}/health")
        c.check(f"scrape: {node}'s /health without the token says only its status",
                status in (200, 503) and isinstance(said, dict) and set(said) == {"status"},
                got)  # fmt: skip
        status, said, got = ask(f"{base}/health", wrong)
        c.check(f"scrape: {node}'s /health with a wrong token is refused", status == 401, got)
        status, said, got = ask(f"{base}/health", c.scrape_headers)
        c.check(f"scrape: {node}'s /health with the token says more than its status",
                isinstance(said, dict) and len(said) > 1, got)  # fmt: skip
        status, said, got = ask(f"{base}/metrics", c.scrape_headers)
        c.check(f"scrape: {node}'s /metrics with the token answers",
                status == 200 and "metaq_" in str(said), got)  # fmt: skip
    for group in GROUPS:
        c.wait_acked(group, 100, 20.0, since=start)
    c.fault("end", "adversary-scrape", node="all", group="")


# --- 17. three replicas: the master dies while the slaves hold different tails -------------


def uneven_tails_failover(ctx: Ctx) -> None:
    """Group a has three replicas. A slave paused for a moment leaves the master and the
    other slave holding sends nobody acknowledged; the master and the controller's Raft
    leader die together, so the group stays without a master for a while and consumers
    read from the slave with the longer log; then that slave dies too and the paused one,
    lacking the tail, is elected. A slave that served its unconfirmed tail shows as
    phantom reads (read, then cut) and as acknowledged messages skipped at their queue
    offsets."""
    c = ctx.cluster
    rounds = 2 if ctx.short else 5
    for _ in range(rounds):
        c.wait_in_sync("a")
        hold(ctx.rng.uniform(1.0, 2.0))
        old = c.wait_master("a")
        reader, lagging = sorted(n for n in c.members("a") if n != old)
        leader = next((n for n in NAMESERVERS if _is_leader(c, n)), None)
        c.pause(lagging)
        hold(ctx.rng.uniform(0.2, 0.5))  # sends pile up unacknowledged on old and reader
        if leader is not None:
            c.nameservers[leader].kill()
        c.kill(old)
        hold(ctx.rng.uniform(2.0, 4.0))  # consumers find no master and read the reader
        killed = c.kill(reader, failover=True)  # the group's outage is counted from here
        c.resume(lagging)
        c.wait_new_master("a", old, killed, timeout_s=60.0)
        if leader is not None:
            c.start_nameserver(leader)
        c.restart(old)
        c.restart(reader)
        c.wait_in_sync("a", 60.0)


def held_read_everything(c: Cluster) -> None:
    """After the drain: every acknowledged chaos-a message was read by chaos-held."""
    acked, held = set(), set()
    for e in read_history(c.history.path):
        if e["type"] == "ok" and e["topic"] == "chaos-a":
            acked.add(e["id"])
        elif e["type"] == "read" and e["consumer"] == "chaos-held":
            held.add(e["id"])
    missing = sorted(acked - held)
    c.check("disk: the held group read every acknowledged message", not missing,
            f"{len(missing)} never read by chaos-held (first {missing[0]})" if missing
            else f"{len(acked)} read")  # fmt: skip


def held_consumers() -> list[ConsumerSpec]:
    return [*default_consumers(), ConsumerSpec("chaos-held", ["chaos-a"], held=True)]


# --- 10. mixed chaos --------------------------------------------------------------------------


def mixed(ctx: Ctx) -> None:
    c = ctx.cluster
    rng = ctx.rng
    faults: list[tuple[str, Callable[[Ctx, str], None]]] = [
        ("kill master", _mixed_kill_master), ("kill slave", _mixed_kill_slave),
        ("pause master", _mixed_pause_master), ("partition master", _mixed_partition_master),
        ("isolate slave", _mixed_isolate_slave), ("kill a nameserver", _mixed_kill_nameserver),
        ("lossy replication link", _mixed_lossy_link), ("power loss master", _mixed_power_loss),
    ]  # fmt: skip
    end = time.monotonic() + ctx.duration_s
    rounds = 0
    while time.monotonic() < end:
        group = rng.choice(GROUPS)
        name, fault = rng.choice(faults)
        for g in GROUPS:
            c.wait_in_sync(g, 60.0)
        started = time.monotonic()
        c.history.write("note", text=f"round {rounds}: {name} in group {group}")
        fault(ctx, group)
        rounds += 1
        for g in GROUPS:
            c.wait_in_sync(g, 60.0)
        hold(max(0.0, started + rng.uniform(10.0, 30.0) - time.monotonic()))
    c.history.write("note", text=f"{rounds} faults in {ctx.duration_s:.0f} s")


def _mixed_kill_master(ctx: Ctx, group: str) -> None:
    c = ctx.cluster
    old = c.wait_master(group)
    t = c.kill(old, failover=True)
    c.wait_new_master(group, old, t)
    hold(ctx.rng.uniform(1.0, 8.0))
    c.restart(old)


def _mixed_kill_slave(ctx: Ctx, group: str) -> None:
    c = ctx.cluster
    slave = ctx.other(c.wait_master(group))
    c.kill(slave)
    hold(ctx.rng.uniform(1.0, 8.0))
    c.restart(slave)


def _mixed_pause_master(ctx: Ctx, group: str) -> None:
    c = ctx.cluster
    old = c.wait_master(group)
    c.pause(old, failover=True)
    hold(ctx.rng.uniform(1.0, 12.0))
    c.resume(old)


def _mixed_partition_master(ctx: Ctx, group: str) -> None:
    c = ctx.cluster
    old = c.wait_master(group)
    c.partition({old}, {*NAMESERVERS, ctx.other(old)}, node=old, group=group, failover=True)
    hold(ctx.rng.uniform(2.0, 10.0))
    c.heal(node=old, group=group)


def _mixed_isolate_slave(ctx: Ctx, group: str) -> None:
    c = ctx.cluster
    slave = ctx.other(c.wait_master(group))
    c.partition({slave}, set(c.net.hosts) - {slave}, node=slave, group=group)
    hold(ctx.rng.uniform(2.0, 10.0))
    c.heal(node=slave, group=group)


def _mixed_kill_nameserver(ctx: Ctx, group: str) -> None:
    c = ctx.cluster
    node = ctx.rng.choice(NAMESERVERS)
    c.nameservers[node].kill()
    c.fault("start", "kill-nameserver", node=node, group="")
    hold(ctx.rng.uniform(2.0, 10.0))
    c.start_nameserver(node)
    c.fault("end", "kill-nameserver", node=node, group="")


def _mixed_lossy_link(ctx: Ctx, group: str) -> None:
    c = ctx.cluster
    master = c.wait_master(group)
    slave = ctx.other(master)
    pct = ctx.rng.choice((5, 20, 50))
    c.net.lose(master, slave, pct)
    c.fault("start", "packet-loss", node=f"{master}-{slave}", group=group, detail=f"{pct} %")
    hold(ctx.rng.uniform(3.0, 10.0))
    c.heal(node=f"{master}-{slave}", group=group, fault="packet-loss")


def _mixed_power_loss(ctx: Ctx, group: str) -> None:
    c = ctx.cluster
    old = c.wait_master(group)
    t = c.power_loss(old, failover=True)
    c.wait_new_master(group, old, t)
    hold(ctx.rng.uniform(1.0, 8.0))
    c.restart(old, "power-loss")


SCENARIOS: dict[int, Scenario] = {
    s.number: s
    for s in (
        Scenario(1, "kill-master-x5", kill_master,
                 expect={"failover_p50_s": 5.0, "failover_max_s": 10.0, "quiet_groups": ["b"]},
                 summary="kill -9 group a's master and restart it, five times"),
        Scenario(2, "pause-master-15s", pause_master, expect={"quiet_groups": ["b"]},
                 summary="SIGSTOP group a's master for 15 s, then SIGCONT"),
        Scenario(3, "partition-master", partition_master, expect={"quiet_groups": ["b"]},
                 summary="cut group a's master from the nameservers and its slave"),
        Scenario(4, "kill-slave-min-isr-2", kill_slave_min_isr2,
                 ClusterSpec(min_in_sync=2), expect={"quiet_groups": ["b"]},
                 summary="kill group a's slave under min_in_sync_replicas=2"),
        Scenario(5, "power-loss-master-async-flush", power_loss_master,
                 ClusterSpec(flush_mode="async", lossy=True,
                             settings=(*ClusterSpec().settings, "store.flush_interval_ms=2000")),
                 expect={"quiet_groups": ["b"]},
                 summary="power loss on group a's master (unsynced bytes dropped), ASYNC flush"),
        Scenario(6, "corrupt-slave-segment", corrupt_slave_segment,
                 expect={"quiet_groups": ["b"]},
                 summary="flip a bit in a record of group a's slave's commitlog, restart it"),
        Scenario(7, "nameservers-down-60s", nameservers_down,
                 summary="kill every nameserver for 60 s, then bring them back one by one"),
        Scenario(8, "nameserver-partition", nameserver_partition,
                 expect={"quiet_groups": ["b"]},
                 summary="cut the controller's Raft leader from the other nameservers; "
                         "kill group a's master meanwhile"),
        Scenario(9, "async-kill-master", async_kill_master,
                 ClusterSpec(replication_mode="async"), expect={"quiet_groups": ["b"]},
                 summary="async replication: kill -9 group a's master"),
        Scenario(11, "stale-nameserver-lease", stale_nameserver_lease,
                 ClusterSpec(replication_mode="async"),
                 summary="async: the master keeps only a nameserver cut from the Raft "
                         "majority; the majority replaces it"),
        Scenario(12, "disk-full-master", disk_full_master,
                 ClusterSpec(small_disks=("a0", "a1"),
                             settings=(*ClusterSpec().settings, "store.clean_interval_s=1")),
                 expect={"quiet_groups": ["b"]},
                 summary="fill group a's master's disk for 10 s, then free it"),
        Scenario(13, "adversary-raft-pickle", adversary_raft, producers=high_rate_producers,
                 expect={"quiet_groups": ["b"]},
                 summary="a code-running pickle on every nameserver's Raft port; a failover"),
        Scenario(14, "adversary-takeover", adversary_takeover, producers=high_rate_producers,
                 expect={"quiet_groups": ["a", "b"]},
                 summary="forged registration, switchover, unregistration and replica fetch"),
        Scenario(15, "adversary-exhaustion", adversary_exhaustion,
                 producers=high_rate_producers, expect={"quiet_groups": ["b"]},
                 summary="idle connections, unread pulls, huge frames, 120,000 fake groups"),
        Scenario(16, "adversary-disk", adversary_disk,
                 ClusterSpec(small_disks=("a0", "a1"),
                             settings=(*ClusterSpec().settings, "store.clean_interval_s=1")),
                 producers=high_rate_producers, consumers=held_consumers,
                 after_drain=held_read_everything, expect={"quiet_groups": ["b"]},
                 summary="disk past force-clean and full under load, one group unread"),
        Scenario(18, "adversary-descriptors", adversary_descriptors,
                 producers=high_rate_producers, expect={"quiet_groups": ["b"]},
                 summary="the master's open-file limit cut while new queues get their "
                         "first messages"),
        Scenario(19, "adversary-replay", adversary_replay,
                 ClusterSpec(auth=True, nameserver_args=("--http-port", "0")),
                 producers=high_rate_producers, expect={"quiet_groups": ["a", "b"]},
                 summary="signed requests copied to another server: a console and a gRPC "
                         "switchover from ns0 to ns1, a topic creation from a master to "
                         "its slave"),
        Scenario(20, "adversary-scrape", adversary_scrape,
                 ClusterSpec(metrics_auth=True, nameserver_args=("--http-port", "0")),
                 producers=high_rate_producers, expect={"quiet_groups": ["a", "b"]},
                 summary="every server's /metrics and /health asked without the "
                         "metrics_auth token and with a wrong one"),
        Scenario(17, "uneven-tails-failover", uneven_tails_failover,
                 ClusterSpec(brokers=("a0", "a1", "a2", "b0", "b1"), min_in_sync=2),
                 producers=high_rate_producers, expect={"quiet_groups": ["b"]},
                 summary="three replicas: a slave paused, then the master and the Raft "
                         "leader killed, then the slave with the longer log; the paused "
                         "slave is elected"),
        Scenario(10, "mixed", mixed,
                 ClusterSpec(flush_mode="async", lossy=True),
                 summary="random faults every 10-30 s for the run's duration"),
    )
}  # fmt: skip


def run_scenario(scenario: Scenario, work_dir: Path, *, seed: int, duration_s: float = 120.0,
                 short: bool = False, loopback: bool = False) -> Result:  # fmt: skip
    """Run one scenario in ``work_dir`` and check its history."""
    work_dir.mkdir(parents=True, exist_ok=True)
    history = HistoryWriter(work_dir / "history.jsonl")
    history.write("scenario", name=f"{scenario.number}-{scenario.name}", number=scenario.number,
                  seed=seed, expect=scenario.expect, summary=scenario.summary)  # fmt: skip
    spec = scenario.cluster
    if loopback:
        spec = ClusterSpec(**{**vars(spec), "loopback": True})
    cluster = Cluster(work_dir, spec, history)
    try:
        cluster.start()
        cluster.start_workload(scenario.producers(), scenario.consumers())
        for group in GROUPS:
            cluster.wait_acked(group, 40, 30.0)
        scenario.run(Ctx(cluster, random.Random(seed), duration_s, short))
        for node in spec.brokers:
            if cluster.brokers[node].proc.poll() is not None:
                raise AssertionError(f"{node} was left stopped by the scenario")
        cluster.check_prefixes()
        cluster.stop_workload()
        if scenario.after_drain is not None:
            scenario.after_drain(cluster)
        for group in GROUPS:
            history.write("final_master", group=group, node=cluster.wait_master(group))
        cluster.stop_brokers_cleanly()
        for node in spec.brokers:
            cluster.record_stored(node, "final")
    except Unsupported as exc:
        history.write("skipped", reason=str(exc))
    except Exception as exc:
        history.write("check", name="scenario-completed", ok=False,
                      detail=f"{type(exc).__name__}: {exc}"[:2000])  # fmt: skip
        (work_dir / "failure.txt").write_text(traceback.format_exc())
    finally:
        cluster.close()
        history.close()
    events = list(read_history(work_dir / "history.jsonl"))
    result = check(events)
    skipped = next((e for e in events if e["type"] == "skipped"), None)
    if skipped is not None:
        result.skipped = skipped["reason"]
        result.violations = []
    net = getattr(cluster, "net", None)
    if net is not None and not net.namespaces:
        result.notes.append(f"ran on loopback: {net.why_loopback}")
    return result
