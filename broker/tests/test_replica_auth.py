"""The master's side of REPLICA_AUTH: a slave proves the secret on its connection, for
itself only, and nothing is served before or beside that."""

from __future__ import annotations

import pytest

from metaq.broker.replica_auth import ReplicaGate
from metaq.common import auth
from metaq.common.auth import ClusterSecret
from metaq.common.errors import NotAuthenticated
from metaq.common.framing import Buffer, Frame, FrameDecoder, FrameType, encode_frame
from metaq.common.v1.data_pb2 import ReplicaAuthRequest, ReplicaAuthResponse, ReplicaFetchRequest

SECRET = ClusterSecret(b"0123456789abcdef0123", "test")
OTHER = ClusterSecret(b"fedcba9876543210fedc", "test")
GROUP = "broker-a"
MASTER_AT = "127.0.0.1:10911"
SLAVE_AT = "127.0.0.1:10921"


class Responder:
    def __init__(self, connection_id: int) -> None:
        self.connection_id = connection_id
        self.closed = False
        self.answers: list[Frame] = []

    def respond(self, parts: list[Buffer]) -> None:
        self.answers += FrameDecoder().feed(b"".join(bytes(p) for p in parts))


def _frame(request: ReplicaAuthRequest) -> Frame:
    (frame,) = FrameDecoder().feed(
        b"".join(
            bytes(p) for p in encode_frame(FrameType.REPLICA_AUTH, 1, request.SerializeToString())
        )
    )
    return frame


def _handshake(
    gate: ReplicaGate,
    responder: Responder,
    slave_id: int,
    secret: ClusterSecret = SECRET,
    *,
    proves_address: str = SLAVE_AT,
) -> None:
    """A slave at SLAVE_AT that proves ``proves_address`` as its own."""
    nonce = auth.new_nonce()
    hello = ReplicaAuthRequest(
        broker_name=GROUP, broker_id=slave_id, slave_nonce=nonce, slave_data_address=SLAVE_AT
    )
    gate.handle(responder, _frame(hello))
    answer = ReplicaAuthResponse.FromString(responder.answers[-1].header)
    master_nonce = answer.master_nonce
    assert answer.master_data_address == MASTER_AT
    expected = auth.replica_proof(
        SECRET, auth.MASTER, GROUP, slave_id, nonce, master_nonce, MASTER_AT
    )
    assert auth.check_proof(expected, answer.master_proof)
    proof = auth.replica_proof(
        secret, auth.SLAVE, GROUP, slave_id, nonce, master_nonce, proves_address
    )
    done = ReplicaAuthRequest(
        broker_name=GROUP,
        broker_id=slave_id,
        slave_nonce=nonce,
        slave_proof=proof,
        slave_data_address=SLAVE_AT,
    )
    gate.handle(responder, _frame(done))


def _fetch(slave_id: int) -> ReplicaFetchRequest:
    return ReplicaFetchRequest(broker_name=GROUP, broker_id=slave_id)


def test_a_slave_that_proved_the_secret_fetches_on_its_connection_as_itself_only() -> None:
    gate = ReplicaGate(SECRET, GROUP, MASTER_AT)
    _handshake(gate, Responder(1), 1)

    gate.check_fetch(1, _fetch(1))
    with pytest.raises(NotAuthenticated, match="proved the secret as broker broker-a/1"):
        gate.check_fetch(1, _fetch(2))
    with pytest.raises(NotAuthenticated, match="requires the cluster secret"):
        gate.check_fetch(2, _fetch(1))
    gate.connection_lost(1)
    with pytest.raises(NotAuthenticated, match="requires the cluster secret"):
        gate.check_fetch(1, _fetch(1))


def test_forwarded_offset_commits_need_a_proven_slave_unless_the_cluster_has_no_secret() -> None:
    gate = ReplicaGate(SECRET, GROUP, MASTER_AT)
    with pytest.raises(NotAuthenticated, match="proved the cluster secret on the connection"):
        gate.check_forwarded(1)
    _handshake(gate, Responder(1), 1)
    gate.check_forwarded(1)
    with pytest.raises(NotAuthenticated):
        gate.check_forwarded(2)
    gate.connection_lost(1)
    with pytest.raises(NotAuthenticated):
        gate.check_forwarded(1)

    ReplicaGate(None, GROUP, MASTER_AT).check_forwarded(1)  # a loopback cluster without a secret


def test_a_wrong_proof_or_a_proof_without_the_first_step_is_refused() -> None:
    gate = ReplicaGate(SECRET, GROUP, MASTER_AT)
    with pytest.raises(NotAuthenticated, match="does not match"):
        _handshake(gate, Responder(1), 1, OTHER)
    with pytest.raises(NotAuthenticated, match="requires the cluster secret"):
        gate.check_fetch(1, _fetch(1))

    stray = ReplicaAuthRequest(
        broker_name=GROUP, broker_id=1, slave_nonce=b"n" * 16, slave_proof=b"p" * 32
    )
    with pytest.raises(NotAuthenticated, match="without the first step"):
        gate.handle(Responder(3), _frame(stray))


def test_a_broker_without_a_secret_serves_fetches_but_proves_nothing() -> None:
    gate = ReplicaGate(None, GROUP, MASTER_AT)

    gate.check_fetch(1, _fetch(1))
    with pytest.raises(NotAuthenticated, match="has no cluster secret"):
        _handshake(gate, Responder(1), 1)


def test_the_masters_proof_names_its_address_and_the_slaves_names_the_slaves() -> None:
    gate = ReplicaGate(SECRET, GROUP, MASTER_AT)
    # _handshake checks the master's proof against MASTER_AT; a slave that proves another
    # data address than the one it announced is refused.
    with pytest.raises(NotAuthenticated, match="does not match"):
        _handshake(gate, Responder(1), 1, proves_address="10.6.6.6:1")
    with pytest.raises(NotAuthenticated, match="requires the cluster secret"):
        gate.check_fetch(1, _fetch(1))

    # The master at 127.0.0.1:20000, reached through a relay at MASTER_AT, answers with a
    # proof for its own address, which a slave that dialled MASTER_AT does not accept.
    elsewhere = ReplicaGate(SECRET, GROUP, "127.0.0.1:20000")
    responder = Responder(2)
    nonce = auth.new_nonce()
    elsewhere.handle(
        responder, _frame(ReplicaAuthRequest(broker_name=GROUP, broker_id=1, slave_nonce=nonce))
    )
    answer = ReplicaAuthResponse.FromString(responder.answers[-1].header)
    assert answer.master_data_address == "127.0.0.1:20000"
    dialled = auth.replica_proof(
        SECRET, auth.MASTER, GROUP, 1, nonce, answer.master_nonce, MASTER_AT
    )
    assert not auth.check_proof(dialled, answer.master_proof)
