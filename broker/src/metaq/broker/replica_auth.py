"""The master's side of REPLICA_AUTH: which data-plane connections proved the secret.

A broker with a cluster secret serves REPLICA_FETCH only on a connection whose slave
proved it (the two-step handshake of ``ReplicaAuthRequest`` in data.proto), and only for
the broker that proved it there; a fetch on any other connection is refused before the
replica set sees it, so a stranger gets no bytes, never joins the in-sync set and never
reports an offset that holds consumers back. Proofs are per connection and die with it.

The master's proof covers its own advertised data address, which the slave checks
against the address it dialled: a process at another address (a master's old one) that
passes a slave's handshake through to this master gets an answer the slave refuses, so
it can neither feed that slave nor fetch and report offsets as it. The slave's proof
covers the data address it advertises, which is logged with the slave it proved.

The same proof admits a slave's forwarded offset commits (:meth:`ReplicaGate.check_forwarded`):
a stranger cannot overwrite a group's offsets with ones it says a slave held.

A broker without a secret (a loopback-only cluster) serves fetches as before and answers
a handshake with NO_PERMISSION, so a slave that has a secret does not follow it.
"""

from __future__ import annotations

import logging

from metaq.broker.connection import Responder
from metaq.common import auth
from metaq.common.auth import ClusterSecret
from metaq.common.errors import InvalidMessage, NotAuthenticated
from metaq.common.framing import FLAG_RESPONSE, Frame, encode_frame
from metaq.common.v1.data_pb2 import ReplicaAuthRequest, ReplicaAuthResponse, ReplicaFetchRequest

log = logging.getLogger(__name__)

_DONE = ReplicaAuthResponse().SerializeToString()


class ReplicaGate:
    """Per connection: the handshake in progress, or the slave it proved to be."""

    def __init__(self, secret: ClusterSecret | None, broker_name: str, data_address: str) -> None:
        self._secret = secret
        self._broker_name = broker_name
        self._data_address = data_address
        """This master's advertised data address: what its slaves dial, and check."""
        # connection id -> (slave id, slave nonce, slave data address, master nonce)
        # between the two steps.
        self._pending: dict[int, tuple[int, bytes, str, bytes]] = {}
        # connection id -> the slave id that proved the secret on it.
        self._proven: dict[int, int] = {}

    def handle(self, responder: Responder, frame: Frame) -> None:
        """The REPLICA_AUTH handler."""
        request = ReplicaAuthRequest.FromString(frame.header)
        secret = self._secret
        if secret is None:
            raise NotAuthenticated(
                f"this broker has no cluster secret, so it cannot prove one; {auth.HOW_TO}"
            )
        if request.broker_name != self._broker_name:
            raise NotAuthenticated(
                f"broker {request.broker_name}/{request.broker_id} is not of group "
                f"{self._broker_name}; it cannot replicate from it"
            )
        connection = responder.connection_id
        if len(request.slave_nonce) != auth.NONCE_BYTES:
            raise InvalidMessage(f"slave_nonce must be {auth.NONCE_BYTES} bytes")
        if not request.slave_proof:
            master_nonce = auth.new_nonce()
            self._pending[connection] = (
                request.broker_id, request.slave_nonce, request.slave_data_address, master_nonce
            )  # fmt: skip
            self._proven.pop(connection, None)
            proof = auth.replica_proof(
                secret, auth.MASTER, self._broker_name, request.broker_id,
                request.slave_nonce, master_nonce, self._data_address,
            )  # fmt: skip
            answer = ReplicaAuthResponse(
                master_nonce=master_nonce,
                master_proof=proof,
                master_data_address=self._data_address,
            )
            self._respond(responder, frame, answer.SerializeToString())
            return
        pending = self._pending.pop(connection, None)
        if pending is None or pending[:3] != (
            request.broker_id, request.slave_nonce, request.slave_data_address
        ):  # fmt: skip
            raise NotAuthenticated(
                "REPLICA_AUTH: a proof without the first step on this connection; start over"
            )
        slave_id, slave_nonce, slave_address, master_nonce = pending
        expected = auth.replica_proof(
            secret, auth.SLAVE, self._broker_name, slave_id, slave_nonce, master_nonce,
            slave_address,
        )  # fmt: skip
        if not auth.check_proof(expected, request.slave_proof):
            log.warning(
                "connection %d: broker %s/%d failed the cluster-secret handshake",
                connection,
                self._broker_name,
                slave_id,
            )
            raise NotAuthenticated(
                f"broker {self._broker_name}/{slave_id}: the proof does not match this "
                "master's cluster secret; give both the same one"
            )
        log.info(
            "connection %d: slave %s/%d at %s proved the cluster secret",
            connection,
            self._broker_name,
            slave_id,
            slave_address or "(no address given)",
        )
        self._proven[connection] = slave_id
        self._respond(responder, frame, _DONE)

    def check_fetch(self, connection_id: int, request: ReplicaFetchRequest) -> None:
        """Raise NotAuthenticated unless this connection may fetch as the request says."""
        if self._secret is None:
            return
        proven = self._proven.get(connection_id)
        if proven is None:
            raise NotAuthenticated(
                "this master requires the cluster secret before it serves REPLICA_FETCH "
                "(REPLICA_AUTH first); configure the slave with the cluster's secret: "
                f"{auth.HOW_TO}"
            )
        if proven != request.broker_id or request.broker_name != self._broker_name:
            raise NotAuthenticated(
                f"this connection proved the secret as broker {self._broker_name}/{proven}, "
                f"not {request.broker_name}/{request.broker_id}"
            )

    def check_forwarded(self, connection_id: int) -> None:
        """Raise NotAuthenticated unless a slave of this group proved the secret on this
        connection: only one may pass on commits it holds for consumers (COMMIT_OFFSET
        marked ``forwarded``), which the master takes even where they move offsets back."""
        if self._secret is None or connection_id in self._proven:
            return
        raise NotAuthenticated(
            "this master takes forwarded offset commits only from a slave of group "
            f"{self._broker_name} that proved the cluster secret on the connection "
            "(REPLICA_AUTH first); consumers commit without 'forwarded'; configure the "
            f"slave with the cluster's secret: {auth.HOW_TO}"
        )

    def proven(self, connection_id: int) -> bool:
        """Whether a slave of this group proved the cluster secret on the connection."""
        return connection_id in self._proven

    def connection_lost(self, connection_id: int) -> None:
        self._pending.pop(connection_id, None)
        self._proven.pop(connection_id, None)

    @staticmethod
    def _respond(responder: Responder, frame: Frame, header: bytes) -> None:
        if not frame.is_one_way:
            responder.respond(
                encode_frame(frame.type, frame.request_id, header, flags=FLAG_RESPONSE)
            )
