"""What the cluster builder asks each process to be, read from its flags (nothing started)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from metaq.common import acl
from metaq.common.users import Credentials
from metaq.testing.cluster import (
    ADMIN,
    DATA_PORT,
    GRPC_PORT,
    HTTP_PORT,
    RAFT_PORT,
    Cluster,
    ClusterBuilder,
)


def value(flags: Sequence[str], name: str) -> str | None:
    """The last value given to ``name`` (the processes' parsers keep the last)."""
    found = [flags[i + 1] for i, flag in enumerate(flags[:-1]) if flag == name]
    return found[-1] if found else None


class TenDotHosts:
    """Hosts at 10.0.0.N, N by node name; commands prefixed with the node's name."""

    def __init__(self, *nodes: str) -> None:
        self.addresses = {node: f"10.0.0.{n}" for n, node in enumerate(nodes, start=1)}

    def address(self, node: str) -> str:
        return self.addresses[node]

    def command(self, node: str, argv: Sequence[str]) -> list[str]:
        return [f"on-{node}", *argv]


def test_each_group_starts_its_own_replicas_and_a_later_broker_gets_its_id(
    tmp_path: Path,
) -> None:
    builder = ClusterBuilder(groups=("a", "b"), replicas=2, group_replicas={"b": 1})
    cluster = Cluster(builder, tmp_path)

    assert [builder.replicas_of(g) for g in builder.groups] == [2, 1]
    assert value(builder.broker_flags(cluster, "a", 1), "--broker-id") == "1"
    # One replica: the deployed master, named by nothing but its group.
    assert value(builder.broker_flags(cluster, "b", 0), "--broker-id") is None
    assert value(builder.broker_flags(cluster, "b", 1), "--broker-id") == "1"
    assert value(builder.broker_flags(cluster, "b", 0), "--broker-name") == "b"


def test_the_broker_group_and_node_flags_come_last_in_that_order(tmp_path: Path) -> None:
    builder = ClusterBuilder(
        groups=("a",), replicas=2, replication_mode="sync", min_in_sync=2,
        broker_args=("--set", "x=broker"), group_args={"a": ("--set", "x=group")},
        node_args={"a-1": ("--set", "x=node")},
    )  # fmt: skip
    cluster = Cluster(builder, tmp_path)

    first = builder.broker_flags(cluster, "a", 0)
    second = builder.broker_flags(cluster, "a", 1)

    assert first[-4:] == ["--set", "x=broker", "--set", "x=group"]
    assert second[-6:] == ["--set", "x=broker", "--set", "x=group", "--set", "x=node"]
    assert "replication_mode=sync" in first and "min_in_sync_replicas=2" in first


def test_on_hosts_of_their_own_every_process_listens_there_on_the_deployed_ports(
    tmp_path: Path,
) -> None:
    hosts = TenDotHosts("ns0", "ns1", "a-0")
    builder = ClusterBuilder(nameservers=2, groups=("a",), hosts=hosts)
    cluster = Cluster(builder, tmp_path)

    nameservers = builder.nameserver_flags(cluster)
    broker = builder.broker_flags(cluster, "a", 0)

    peers = f"10.0.0.1:{RAFT_PORT},10.0.0.2:{RAFT_PORT}"
    for index, flags in enumerate(nameservers):
        assert value(flags, "--listen-host") == f"10.0.0.{index + 1}"
        assert value(flags, "--grpc-port") == str(GRPC_PORT)
        assert value(flags, "--controller-address") == f"10.0.0.{index + 1}:{RAFT_PORT}"
        assert value(flags, "--controller-peers") == peers
    assert value(broker, "--listen-host") == "10.0.0.3"
    assert (value(broker, "--data-port"), value(broker, "--http-port")) == (
        str(DATA_PORT),
        str(HTTP_PORT),
    )


def test_on_loopback_one_nameserver_takes_a_free_port_and_no_controller_peers(
    tmp_path: Path,
) -> None:
    builder = ClusterBuilder(nameserver_args=("--http-port", "0"))

    (flags,) = builder.nameserver_flags(Cluster(builder, tmp_path))

    assert flags == ["--http-port", "0"]


def test_users_on_without_an_acl_of_the_tests_grant_the_admin_cluster_admin(
    tmp_path: Path,
) -> None:
    own = Credentials("bench", "a-secret-key-for-the-builder-test")

    for builder, admin in ((ClusterBuilder(auth=True), ADMIN),
                           (ClusterBuilder(auth=True, admin=own), own)):  # fmt: skip
        work_dir = tmp_path / admin.access_key
        work_dir.mkdir()
        path = builder.acl(work_dir)
        assert path is not None
        user = acl.load(path).user(admin.access_key)
        assert user is not None and user.is_admin

    assert ClusterBuilder().acl(tmp_path) is None
