"""A gRPC call signed for one nameserver is good at that one only, on a real cluster with
users: two nameservers and a master with its slave.

Before, a proof covered the method, the request and the time: a Switchover signed with
the cluster secret for one nameserver, a Session a broker opened with one, or a user's
call captured on its way to one, was taken by the other within the 120 s window.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import grpc
import pytest

from metaq.common.auth import call_metadata
from metaq.common.server_names import TARGET_METADATA_KEY, signed_purpose, target_of
from metaq.common.users import USER_METADATA_KEY, sign_request
from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1 import control_pb2_grpc
from metaq.testing import Cluster, ClusterBuilder
from metaq.testing.cluster import ADMIN
from metaq.testing.nameserver_process import session_proof
from metaq.testing.waiting import cluster_secret_for_tests, wait_until

GROUP = "broker-a"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # The brokers' own Sessions and the admin's calls go through the bound proofs too:
    # the cluster starting, electing a master and creating its topic is the first check.
    builder = ClusterBuilder(nameservers=2, groups=(GROUP,), replicas=2, auth=True)
    with builder.start(tmp_path_factory.mktemp("grpc-signed-for-one")) as started:
        yield started


async def _unary(address: str, call: str, request: object, metadata: object) -> object:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = control_pb2_grpc.NameServerStub(channel)
        return await getattr(stub, call)(request, metadata=metadata, timeout=10)


def _refused_as_for_another(call: object, meant: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        asyncio.run(call)  # type: ignore[arg-type]
    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED, caught.value
    assert f"signed for server '{meant}'" in (caught.value.details() or ""), caught.value


def test_a_switchover_signed_for_one_nameserver_moves_nothing_at_the_other(
    cluster: Cluster,
) -> None:
    a, b = cluster.nameserver_addresses
    master = cluster.master_id(GROUP)
    cluster.wait_committed_in_sync(GROUP, [0, 1])
    (control,) = [g for g in cluster.controller().groups if g.broker_name == GROUP]
    request = pb.SwitchoverRequest(
        broker_name=GROUP, broker_id=1 - master, expected_epoch=control.epoch
    )
    body = request.SerializeToString(deterministic=True)
    # What an admin tool holding the cluster secret sent to nameserver a, as captured.
    captured = call_metadata(cluster_secret_for_tests(), "Switchover", target_of(a), body,
                             time.time())  # fmt: skip

    _refused_as_for_another(_unary(b, "Switchover", request, captured), target_of(a))
    assert cluster.master_id(GROUP) == master
    # Naming b instead, under the same proof, breaks the proof.
    renamed = tuple((k, target_of(b) if k == TARGET_METADATA_KEY else v) for k, v in captured)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        asyncio.run(_unary(b, "Switchover", request, renamed))
    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "does not match" in (caught.value.details() or "")
    assert cluster.master_id(GROUP) == master

    # At the nameserver it was signed for, the proof is good: the master moves.
    asyncio.run(_unary(a, "Switchover", request, captured))
    wait_until(lambda: cluster.master_id(GROUP) == 1 - master, 30.0, "the switchover")


def test_a_users_call_signed_for_one_nameserver_is_refused_by_the_other(
    cluster: Cluster,
) -> None:
    a, b = cluster.nameserver_addresses
    request = pb.GetClusterInfoRequest()
    purpose = signed_purpose("grpc", "GetClusterInfo", target_of(a))
    proof = sign_request(ADMIN, purpose, request.SerializeToString(deterministic=True),
                         time.time())  # fmt: skip
    captured = ((TARGET_METADATA_KEY, target_of(a)), (USER_METADATA_KEY, proof))

    _refused_as_for_another(_unary(b, "GetClusterInfo", request, captured), target_of(a))
    answer = asyncio.run(_unary(a, "GetClusterInfo", request, captured))
    assert isinstance(answer, pb.GetClusterInfoResponse) and answer.clusters


def test_a_session_opened_with_one_nameserver_cannot_be_opened_with_the_other(
    cluster: Cluster,
) -> None:
    a, b = cluster.nameserver_addresses

    async def open_session(address: str) -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            call = control_pb2_grpc.NameServerStub(channel).Session(
                metadata=session_proof(a), timeout=10
            )
            await call.read()

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        asyncio.run(open_session(b))
    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED, caught.value
    assert f"signed for server '{target_of(a)}'" in (caught.value.details() or "")
