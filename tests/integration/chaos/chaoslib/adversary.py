"""A stranger on the cluster's network: what a process that speaks metaq's protocols but
does not hold the cluster secret tries against a running cluster (docs/chaos.md, the
adversary scenarios).

Each attack is bounded in connections, requests and time, aims only at the cluster's own
addresses, and returns a one-line account of what the target answered; the scenarios
judge the cluster by what it did meanwhile (no failover, no failed send, nothing lost,
nothing truncated), not by these answers alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import resource
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import grpc

from metaq.common.auth import call_metadata
from metaq.common.framing import (
    MAX_FRAME_BYTES,
    PREFIX,
    PROTOCOL_VERSION,
    FrameType,
    encode_frame,
)
from metaq.common.server_names import target_of
from metaq.common.users import Credentials
from metaq.common.v1 import control_pb2 as pb
from metaq.common.v1 import control_pb2_grpc
from metaq.common.v1.data_pb2 import (
    CommitOffsetRequest,
    PullRequest,
    QueueOffset,
    ReplicaFetchRequest,
)
from metaq.testing import DataClient
from metaq.testing.http_signing import signed_for
from metaq.testing.waiting import cluster_secret_for_tests

# --- 1. a pickle on the Raft port -------------------------------------------------------------


class _MakeDirectory:
    """Unpickling this calls ``os.mkdir(path)``: proof that the receiver ran our code."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.mkdir, (self.path,))


def raft_pickle(address: str, marker: Path, timeout_s: float = 5.0) -> str:
    """Send pysyncobj's framing (a 4-byte length, then zlib(pickle)) holding a payload
    that creates ``marker`` when unpickled; wait until the peer closes or ``timeout_s``."""
    host, port = address.rsplit(":", 1)
    data = zlib.compress(pickle.dumps(_MakeDirectory(marker)), 3)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(struct.pack("i", len(data)) + data)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if not sock.recv(4096):
                    return "the peer closed the connection"
            except TimeoutError:
                break
            except OSError as exc:
                return f"the connection ended: {exc}"
    return f"the peer kept the connection open for {timeout_s:.0f} s"


def raft_flood(
    address: str, stop: threading.Event, chunk_bytes: int = 64 * 1024
) -> tuple[int, int]:
    """Announce a 2 GiB message on the Raft port and send junk behind it, over and over
    (a new connection each time the peer drops one) until ``stop``. Returns (connections,
    the most bytes one connection got out before the peer dropped it)."""
    host, port = address.rsplit(":", 1)
    connections = most = 0
    junk = bytes(chunk_bytes)
    while not stop.is_set() and connections < 10_000:
        sent = 0
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, chunk_bytes)
            sock.settimeout(1.0)
            try:
                sock.connect((host, int(port)))
                connections += 1
                sent += sock.send(struct.pack("i", 2**31 - 1) + junk)
                while not stop.is_set() and sent < 64 * 1024 * 1024:
                    sent += sock.send(junk)
            except OSError:  # dropped (reset, broken pipe) or stalled past the timeout
                pass
        most = max(most, sent)
    return connections, most


# --- 2. taking a group over -------------------------------------------------------------------


async def _rpc(address: str, method: str, request: Any, metadata: Any = ()) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = control_pb2_grpc.NameServerStub(channel)
        try:
            await getattr(stub, method)(request, timeout=3, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            return f"{method}: {exc.code().name} {(exc.details() or '')[:120]}"
    return f"{method}: accepted"


async def forge_registration(nameserver: str, broker_name: str, broker_id: int,
                             data_address: str, epoch: int) -> str:  # fmt: skip
    """Register a forged master under the live master's own key."""
    state = pb.BrokerState(
        cluster="DefaultCluster", broker_name=broker_name, broker_id=broker_id,
        role=pb.BROKER_ROLE_MASTER, data_address=data_address, epoch=epoch + 1,
        controlled=True, configured_master=True, in_sync_ids=[broker_id],
        permission=pb.PERMISSION_READ_WRITE, replication_mode=pb.REPLICATION_MODE_ASYNC,
    )  # fmt: skip
    request = pb.RegisterBrokerRequest(broker=state, topic_table=pb.TopicTable())
    return await _rpc(nameserver, "RegisterBroker", request)


async def unregister(nameserver: str, broker_name: str, broker_id: int) -> str:
    request = pb.UnregisterBrokerRequest(broker_name=broker_name, broker_id=broker_id)
    return await _rpc(nameserver, "UnregisterBroker", request)


async def switchover(nameserver: str, broker_name: str, broker_id: int, epoch: int) -> str:
    return await _rpc(nameserver, "Switchover", pb.SwitchoverRequest(
        broker_name=broker_name, broker_id=broker_id, expected_epoch=epoch))  # fmt: skip


async def fake_slave(host: str, port: int, broker_name: str, broker_id: int, epoch: int,
                     segment_bytes: int, seconds: float) -> str:  # fmt: skip
    """Fetch the master's log as a slave that never holds anything (acked_offset 0),
    for ``seconds``: a master that believes it would count it in sync and hold every
    consumer's reads at offset 0."""
    client = await DataClient.connect(host, port)
    got, answers, refusal = 0, 0, ""
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and not refusal:
            request = ReplicaFetchRequest(
                broker_name=broker_name, broker_id=broker_id, epoch=epoch, offset=0,
                acked_offset=0, max_bytes=1 << 20, wait_ms=100, segment_bytes=segment_bytes,
            )  # fmt: skip
            try:
                async with asyncio.timeout(5):
                    reply = await client.request(FrameType.REPLICA_FETCH, request)
            except Exception as exc:
                refusal = f"{type(exc).__name__}: {str(exc)[:120]}"
                break
            answers += 1
            got += len(reply.payload)
    finally:
        await client.close()
    if refusal:
        return f"fake slave refused after {answers} answers, {got} bytes: {refusal}"
    return f"fake slave got {answers} answers, {got} bytes of the log"


# --- 4. exhausting a broker ---------------------------------------------------------------


class Flood:
    """Connections an attacker opens to one broker and keeps open until :meth:`close`."""

    def __init__(self) -> None:
        self.sockets: list[socket.socket] = []
        self.refused = 0

    def idle(self, host: str, port: int, count: int) -> str:
        """``count`` connections that never send anything."""
        for _ in range(count):
            try:
                self.sockets.append(socket.create_connection((host, port), timeout=2))
            except OSError:
                self.refused += 1
        return f"{count - self.refused} idle connections open, {self.refused} refused"

    def unread_pulls(self, host: str, port: int, topic: str, connections: int,
                     pulls: int) -> str:  # fmt: skip
        """Each connection pipelines ``pulls`` PULLs of the topic's first queue, each for
        as much as the broker gives (1,024 messages), and never reads an answer."""
        request = PullRequest(consumer_group="stranger", topic=topic, queue_id=0, offset=0,
                              max_messages=1024).SerializeToString()  # fmt: skip
        frames = b"".join(_frame(FrameType.PULL, n + 1, request) for n in range(pulls))
        sent = 0
        for _ in range(connections):
            sock = socket.create_connection((host, port), timeout=2)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            self.sockets.append(sock)
            with contextlib.suppress(OSError):
                sock.sendall(frames)
                sent += pulls
        return f"{sent} PULLs pipelined on {connections} connections, none read"

    def huge_frames(self, host: str, port: int, connections: int, body_bytes: int) -> str:
        """Each connection declares a frame just under the protocol's limit and sends
        ``body_bytes`` of it, then stalls."""
        declared = MAX_FRAME_BYTES - 1024
        prefix = PREFIX.pack(declared, PROTOCOL_VERSION, int(FrameType.SEND), 0, 1, 0)
        for _ in range(connections):
            sock = socket.create_connection((host, port), timeout=2)
            self.sockets.append(sock)
            with contextlib.suppress(OSError):
                sock.sendall(prefix + b"\0" * body_bytes)
        return f"{connections} frames declared at {declared >> 20} MiB, {body_bytes} bytes sent"

    def close(self) -> None:
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()
        self.sockets.clear()


def _frame(frame_type: FrameType, request_id: int, header: bytes) -> bytes:
    return b"".join(bytes(part) for part in encode_frame(frame_type, request_id, header))


async def fake_groups(host: str, port: int, topic: str, groups: int) -> tuple[int, str]:
    """COMMIT_OFFSET for ``groups`` consumer groups nobody runs, pipelined in batches:
    how many were accepted, and an account with the first refusal."""
    client = await DataClient.connect(host, port)
    refused, reason = 0, ""
    try:
        for start in range(0, groups, 500):
            batch = []
            for n in range(start, min(start + 500, groups)):
                request = CommitOffsetRequest(
                    consumer_group=f"stranger-{n:06d}",
                    offsets=[QueueOffset(topic=topic, queue_id=0, offset=0)],
                )
                batch.append(client.request(FrameType.COMMIT_OFFSET, request))
            for outcome in await asyncio.gather(*batch, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    refused += 1
                    reason = reason or f"{type(outcome).__name__}: {str(outcome)[:120]}"
    finally:
        await client.close()
    accepted = groups - refused
    return accepted, f"{accepted} of {groups} fake groups' commits accepted" + (
        f"; refused: {reason}" if reason else ""
    )


def huge_topic(http_url: str, topic: str, queues: int) -> tuple[int, str]:
    """Ask a broker's HTTP admin API, without credentials, for a topic of ``queues``
    queues (each a file descriptor once written): its status and its words."""
    body = json.dumps({"read_queues": queues, "write_queues": queues}).encode()
    request = urllib.request.Request(
        f"{http_url}/topics/{topic}", body, {"Content-Type": "application/json"}, method="PUT"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def held_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def set_soft_nofile(pid: int, soft: int) -> int:
    """Set a process's soft open-file limit (as ``prlimit --pid`` does); the old one."""
    old, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (min(soft, hard), hard))
    return old


def rss_bytes(pid: int, kind: str = "RssAnon") -> int:
    """Resident memory of a process (0 when it is gone): by default the anonymous part,
    what buffering grows, without the commitlog's mapped pages, which count in the
    total (``VmRSS``) as the log grows."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{kind}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# --- 6. a signed request replayed to another server ---------------------------------------
# Someone on the path (no TLS) copies what an operator's tool sent to one server and sends
# it to another within the proofs' window. The copy is made here by signing as the tool
# did: with the admin user's key or the cluster secret, for the server it was meant for.


def replayed_http(meant_url: str, sent_url: str, method: str, body: bytes = b"", *,
                  credentials: Credentials | None = None) -> tuple[int, str]:  # fmt: skip
    """Sign ``method meant_url`` (as ``credentials``' user, else as a cluster member) and
    send it to ``sent_url`` instead: the status and the words of the answer."""
    headers = signed_for(meant_url, method, body, credentials=credentials)
    if body:
        headers["Content-Type"] = (
            "application/json" if body.startswith(b"{") else "application/x-www-form-urlencoded"
        )
    request = urllib.request.Request(sent_url, body or None, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, refused.read().decode(errors="replace")


async def replayed_switchover(meant: str, sent: str, broker_name: str, broker_id: int,
                              epoch: int) -> str:  # fmt: skip
    """A Switchover signed with the cluster secret for nameserver ``meant``, sent to
    nameserver ``sent``."""
    request = pb.SwitchoverRequest(broker_name=broker_name, broker_id=broker_id,
                                   expected_epoch=epoch)  # fmt: skip
    body = request.SerializeToString(deterministic=True)
    metadata = call_metadata(cluster_secret_for_tests(), "Switchover", target_of(meant), body,
                             time.time())  # fmt: skip
    return await _rpc(sent, "Switchover", request, metadata)


# --- 9. scraping without the metrics credentials -----------------------------------------


def scrape(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """GET ``url``: the status and the JSON answer (the text when it is not JSON)."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            status, text = answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as refused:
        with refused:
            status, text = refused.code, refused.read().decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text
