"""Every nameserver of a three-member controller killed -9 and started again at once, twice.

The controller's decisions (per group: master, epoch, in-sync set) live in the nameservers'
Raft journals (``controller_dir``). A restart of every member at once is where a Raft
member that forgot its term could be elected below the terms in the others' journals and
have a stale log overwrite committed entries: here an epoch that goes backward, or members
that disagree. The group has made a failover (epoch 2) before the first restart.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import grpc
import pytest

from metaq.testing.cluster import Cluster, ClusterBuilder, nameserver_node
from metaq.testing.waiting import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux", reason="real processes on loopback"),
]

GROUP = "broker-a"
NAMESERVERS = 3
SETTLE_S = 30.0


def decisions(cluster: Cluster) -> list[tuple[int, int, tuple[int, ...]] | None]:
    """(epoch, master, in sync) of GROUP as each nameserver's controller holds it; None for
    one that does not answer yet or holds nothing for the group."""
    held: list[tuple[int, int, tuple[int, ...]] | None] = []
    for index in range(NAMESERVERS):
        found = None
        with contextlib.suppress(grpc.RpcError, OSError):
            for g in cluster.controller(index).groups:
                if g.broker_name == GROUP:
                    found = (g.epoch, g.master_id, tuple(g.in_sync_ids))
        held.append(found)
    return held


def agreed(cluster: Cluster, at_least: int) -> tuple[int, int, tuple[int, ...]]:
    """Wait until all three hold the same decision at epoch ``at_least`` or later."""
    seen: list[list[tuple[int, int, tuple[int, ...]] | None]] = []  # every view, last last

    def same() -> bool:
        seen.append(decisions(cluster))
        first = seen[-1][0]
        return first is not None and first[0] >= at_least and seen[-1] == [first] * NAMESERVERS

    # A member still replaying its journal may show an older prefix for a moment; what
    # counts is what they settle on.
    wait_until(same, SETTLE_S, f"all nameservers hold one decision at epoch >= {at_least}")
    decision = seen[-1][0]
    assert decision is not None
    return decision


def test_decisions_survive_every_nameserver_restarting_at_once(tmp_path: Path) -> None:
    builder = ClusterBuilder(
        nameservers=NAMESERVERS,
        groups=(GROUP,),
        replicas=2,
        node_args={
            nameserver_node(i): ("--controller-dir", str(tmp_path / "raft" / f"ns{i}"))
            for i in range(NAMESERVERS)
        },
    )
    with builder.start(tmp_path / "cluster") as cluster:
        first_master = cluster.master_id(GROUP)
        # Only a slave the controller holds in sync may be elected.
        cluster.wait_committed_in_sync(GROUP, [0, 1], SETTLE_S)
        cluster.broker(GROUP, first_master).kill()  # kill -9: the controller fails over
        cluster.master_id(GROUP, SETTLE_S, other_than=first_master)
        history = [agreed(cluster, 2)]

        for _ in range(2):
            for server in cluster.nameservers:
                server.kill()  # kill -9 every member before any comes back
            for index in range(NAMESERVERS):
                cluster.start_nameserver(index)
            history.append(agreed(cluster, history[-1][0]))

    epochs = [epoch for epoch, _, _ in history]
    assert epochs == sorted(epochs) and epochs[0] >= 2, history
    # Nothing failed over meanwhile: the decision made before the restarts is the one held.
    assert {master for _, master, _ in history} == {1 - first_master}, history
