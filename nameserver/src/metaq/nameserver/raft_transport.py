"""pysyncobj's TCP transport with a guard on what a stranger can make it hold.

pysyncobj reads a peer's length prefix and buffers that many bytes before it checks the
message's Fernet signature, and it grows the buffer by copying it: a stranger who
announces a 2 GiB message and keeps sending makes the nameserver copy an ever larger
buffer on the Raft thread, which starves elections. This transport keeps pysyncobj's
protocol (wire format, handshake, encryption) and changes only what an incoming
connection may cost before it proves the cluster's password:

- until its first message is authenticated, a connection may announce and buffer at
  most :data:`UNVERIFIED_FRAME_MAX` bytes, and it must get there within
  :data:`UNVERIFIED_DEADLINE_S`; at most :data:`UNVERIFIED_CONNECTIONS_MAX` such
  connections are open at once (the oldest is dropped for a new one);
- an authenticated peer's frames are capped at :data:`FRAME_MAX`, far above what the
  controller's log sends (entries and dump chunks of at most 64 KiB);
- a peer that proves the password but names no configured member (pysyncobj's
  read-only nodes, which the controller never uses) is dropped;
- the read buffer grows in place instead of being copied on every read.

Outgoing connections dial configured members only and stay pysyncobj's own.
"""

from __future__ import annotations

import errno
import logging
import socket
import struct
import zlib
from time import monotonic
from typing import Any, Final

import pysyncobj.pickle as pysyncobj_pickle  # type: ignore[import-untyped]
from pysyncobj.dns_resolver import globalDnsResolver  # type: ignore[import-untyped]
from pysyncobj.poller import POLL_EVENT_TYPE  # type: ignore[import-untyped]
from pysyncobj.tcp_connection import (  # type: ignore[import-untyped]
    CONNECTION_STATE,
    TcpConnection,
)
from pysyncobj.tcp_server import TcpServer  # type: ignore[import-untyped]
from pysyncobj.transport import TCPTransport  # type: ignore[import-untyped]

from metaq.common.log_limit import Repeated

log = logging.getLogger(__name__)

UNVERIFIED_FRAME_MAX: Final = 4096
"""Bytes an incoming connection may buffer before its first message is authenticated: its
first message is a 32-byte key, pickled, compressed and encrypted (about 200 bytes)."""
UNVERIFIED_DEADLINE_S: Final = 5.0
"""How long an incoming connection has to authenticate its first message."""
UNVERIFIED_CONNECTIONS_MAX: Final = 32
"""Incoming connections waiting to authenticate at once; a member needs one per peer."""
FRAME_MAX: Final = 16 * 1024 * 1024
"""The largest frame an authenticated peer may send."""
_PREFIX: Final = struct.Struct("i")  # pysyncobj's length prefix: native int, native order

# Logged when it starts, then once a minute with a count: a flood does not flood the log.
refusals = Repeated(log, "dropped a stranger's connection to the Raft port")


class GuardedConnection(TcpConnection):  # type: ignore[misc]  # pysyncobj ships no types
    """An incoming connection that buffers little until it proves the password.

    pysyncobj's connection keeps its state in name-mangled attributes and calls its
    read and parse steps through them: overriding those two steps is the narrowest
    change that bounds the buffer.
    """

    _TcpConnection__readBuffer: bytes | bytearray  # pysyncobj's read buffer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.verified = False
        self.opened_at = monotonic()
        super().__init__(*args, **kwargs)

    def _TcpConnection__processRead(self) -> bool:  # pysyncobj's name
        sock = self._TcpConnection__socket
        try:
            incoming = sock.recv(self._TcpConnection__recvBufferSize)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.disconnect()
            return False
        if not incoming or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.disconnect()
            return False
        buffer = self._TcpConnection__readBuffer
        if not isinstance(buffer, bytearray):  # pysyncobj resets it to bytes()
            buffer = bytearray(buffer)
            self._TcpConnection__readBuffer = buffer
        buffer += incoming
        limit = FRAME_MAX if self.verified else UNVERIFIED_FRAME_MAX
        announced = _PREFIX.unpack_from(buffer)[0] if len(buffer) >= _PREFIX.size else 0
        if announced < 0 or announced > limit or (not self.verified and len(buffer) > limit):
            self.refuse(f"a frame of {announced} bytes (at most {limit} here)")
            return False
        return True

    def _TcpConnection__processParseMessage(self) -> Any:  # pysyncobj's name
        buffer = self._TcpConnection__readBuffer
        if len(buffer) < _PREFIX.size:
            return None
        assert isinstance(buffer, bytearray)  # bytes arrived: a read made it one
        size = _PREFIX.unpack_from(buffer)[0]
        end = _PREFIX.size + size
        if len(buffer) < end:
            return None
        frame = bytes(buffer[_PREFIX.size : end])
        del buffer[:end]
        message = _open(self, frame)
        if message is _REFUSED:
            self.refuse("a message that does not prove the cluster's password")
            return None
        self.verified = True
        return message

    def refuse(self, why: str) -> None:
        refusals.happened(f"it sent {why}")
        self.disconnect()

    def disconnect(self) -> None:
        self.verified = False
        super().disconnect()


_REFUSED: Final = object()


def _open(conn: GuardedConnection, frame: bytes) -> Any:
    """pysyncobj's checks of one frame, in its order: timestamp, signature, random key.
    Without a password (a controller with no peers) nothing reaches a Raft port."""
    try:
        if conn.encryptor:
            stamp = conn.encryptor.extract_timestamp(frame)
            if stamp < conn.recvLastTimestamp:
                return _REFUSED
            conn.recvLastTimestamp = stamp
            frame = conn.encryptor.decrypt(frame)
        message = pysyncobj_pickle.loads(zlib.decompress(frame))
        if conn.recvRandKey:
            key, message = message
            if key != conn.recvRandKey:
                return _REFUSED
    except Exception:  # pysyncobj drops the connection on any of these
        return _REFUSED
    return message


class GuardedServer(TcpServer):  # type: ignore[misc]
    """pysyncobj's listening socket, handing out :class:`GuardedConnection` objects."""

    def __init__(self, *args: Any, transport: GuardedTransport, **kwargs: Any) -> None:
        self._guard = transport
        super().__init__(*args, **kwargs)

    def _TcpServer__onNewConnection(self, descr: int, event: int) -> None:
        if event & POLL_EVENT_TYPE.READ:
            try:
                sock, _addr = self._TcpServer__socket.accept()
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    self.unbind()
                return
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._TcpServer__sendBufferSize)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._TcpServer__recvBufferSize)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            conn = GuardedConnection(
                poller=self._TcpServer__poller,
                socket=sock,
                timeout=self._TcpServer__connectionTimeout,
                sendBufferSize=self._TcpServer__sendBufferSize,
                recvBufferSize=self._TcpServer__recvBufferSize,
                keepalive=self._TcpServer__keepalive,
            )
            self._TcpServer__onNewConnectionCallback(conn)
        if event & POLL_EVENT_TYPE.ERROR:
            self.unbind()


class GuardedTransport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's TCP transport with :class:`GuardedServer` and member-only peers."""

    def _createServer(self) -> None:  # pysyncobj's name
        conf = self._syncObj.conf
        host, port = conf.bindAddress.rsplit(":", 1)
        self._server = GuardedServer(
            self._syncObj._poller,
            globalDnsResolver().resolve(host),
            port,
            onNewConnection=self._onNewIncomingConnection,
            sendBufferSize=conf.sendBufferSize,
            recvBufferSize=conf.recvBufferSize,
            connectionTimeout=conf.connectionTimeout,
            transport=self,
        )

    def _onNewIncomingConnection(self, conn: GuardedConnection) -> None:
        waiting = sorted(
            (c for c in self._unknownConnections if isinstance(c, GuardedConnection)),
            key=lambda c: c.opened_at,
        )
        for old in waiting[: max(0, len(waiting) + 1 - UNVERIFIED_CONNECTIONS_MAX)]:
            old.refuse("nothing authenticated while more connections waited")
            self._unknownConnections.discard(old)
        super()._onNewIncomingConnection(conn)

    def _onIncomingMessageReceived(self, conn: GuardedConnection, message: Any) -> None:
        handshake = self._syncObj.encryptor is not None and not conn.sendRandKey
        member = isinstance(message, str) and message in self._nodeAddrToNode
        if not handshake and not member:
            conn.refuse(f"a peer name that is no configured member: {str(message)[:80]!r}")
            self._unknownConnections.discard(conn)
            return
        super()._onIncomingMessageReceived(conn, message)

    def _onTick(self) -> None:  # pysyncobj's name
        now = monotonic()
        for conn in list(self._unknownConnections):
            if (
                isinstance(conn, GuardedConnection)
                and conn.state != CONNECTION_STATE.DISCONNECTED
                and now - conn.opened_at > UNVERIFIED_DEADLINE_S
            ):
                conn.refuse(f"no member's name within {UNVERIFIED_DEADLINE_S:g} s")
                self._unknownConnections.discard(conn)
        super()._onTick()
