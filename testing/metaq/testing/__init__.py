"""metaq's test support, a pytest plugin kept out of every product wheel: real nameserver
and broker processes, a minimal data-plane client, in-process fakes, a disk that can lose
unsynced bytes, deadline-bound waiting, and the :class:`ClusterBuilder` that starts a
whole cluster (fixture ``cluster_factory``)."""

from metaq.testing.broker_process import BrokerProcess
from metaq.testing.cluster import Cluster, ClusterBuilder
from metaq.testing.data_client import BrokerError, DataClient, Reply
from metaq.testing.nameserver_process import (
    NameServerProcess,
    free_ports,
    session_proof,
    signed_channel,
    start_controller_group,
    start_nameserver,
)
from metaq.testing.waiting import (
    cluster_secret_for_tests,
    deadline,
    holds_for,
    run_async,
    secret_env,
    wait_until,
    wait_until_async,
)

__all__ = [
    "BrokerError",
    "BrokerProcess",
    "Cluster",
    "ClusterBuilder",
    "DataClient",
    "NameServerProcess",
    "Reply",
    "cluster_secret_for_tests",
    "deadline",
    "free_ports",
    "holds_for",
    "run_async",
    "secret_env",
    "session_proof",
    "signed_channel",
    "start_controller_group",
    "start_nameserver",
    "wait_until",
    "wait_until_async",
]
