"""Data-plane user authentication: the AUTH handshake's proofs and per-frame signatures.

After AUTH (``AuthRequest`` in data.proto) client and broker share a session key that
only they know: it is derived from the user's ClientKey (``metaq.common.users``), which
the client holds and the broker recovers from the proof, and from both nonces, so every
connection has its own. Each later request frame is ``FLAG_SIGNED``: its payload ends
with a :data:`TRAILER` of a u64 timestamp (ms since the Unix epoch) and a Poly1305 tag
over the request id, type, flags, timestamp, header and payload, keyed by a one-time key
``HMAC-SHA256(session key, request id, timestamp)``. Poly1305 because it runs several
times faster than HMAC-SHA256, which at 1 KiB messages would cost more than the broker's
own work per message (docs/benchmarks.md); a one-time key per frame because Poly1305
must never reuse one, and request ids
never repeat on a connection. The broker refuses a frame whose tag does not match, whose
timestamp is more than :data:`MAX_CLOCK_SKEW_MS` from its clock, or whose request id is
not above the last one it took on the connection: a frame replayed on the same
connection reuses an id, and on another connection the session key differs.

One tag per frame, however many messages a batch carries. Responses are not signed.
No I/O here.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from collections.abc import Sequence
from typing import Final

from cryptography.hazmat.primitives.poly1305 import Poly1305

from metaq.common.acl import PermissionDenied
from metaq.common.framing import Buffer, Frame, FrameType
from metaq.common.users import message

NONCE_BYTES: Final = 16
MAC_BYTES: Final = 16
_STAMP: Final = struct.Struct("<Q")
TRAILER: Final = _STAMP.size + MAC_BYTES
"""Bytes a signature adds to the end of a FLAG_SIGNED frame's payload."""
MAX_CLOCK_SKEW_MS: Final = 120_000
"""A signed frame is taken this far either side of the broker's clock."""
_PREFIX: Final = struct.Struct("<IBHQ")
_FRAME_KEY: Final = struct.Struct("<IQ")
_JOIN_OVER_PARTS: Final = 8


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def auth_message(access_key: str, client_nonce: bytes, server_nonce: bytes) -> bytes:
    """What the AUTH proofs (client's and broker's) cover."""
    return message("data-plane", access_key.encode(), client_nonce, server_nonce)


def session_key(
    client_key: bytes, access_key: str, client_nonce: bytes, server_nonce: bytes
) -> bytes:
    return hmac.new(
        client_key,
        message("session", access_key.encode(), client_nonce, server_nonce),
        hashlib.sha256,
    ).digest()


def _mac(
    key: bytes,
    frame_type: int,
    request_id: int,
    flags: int,
    stamp_ms: int,
    header: Buffer,
    payload: Sequence[Buffer],
) -> bytes:
    one_time = hmac.new(key, _FRAME_KEY.pack(request_id, stamp_ms), hashlib.sha256).digest()
    tag = Poly1305(one_time)
    tag.update(_PREFIX.pack(request_id, frame_type, flags, stamp_ms))
    tag.update(len(header).to_bytes(4, "little"))
    tag.update(header)
    if len(payload) > _JOIN_OVER_PARTS:
        # One update over a copy beats hundreds of calls: records are separate buffers.
        tag.update(b"".join(payload))
    else:
        for part in payload:
            tag.update(part)
    return tag.finalize()


def sign(
    key: bytes,
    frame_type: int,
    request_id: int,
    flags: int,
    header: Buffer,
    payload: Sequence[Buffer],
    now_ms: int,
) -> bytes:
    """The trailer to append to a request's payload (``flags`` include FLAG_SIGNED)."""
    stamp = _STAMP.pack(now_ms)
    return stamp + _mac(key, frame_type, request_id, flags, now_ms, header, payload)


class FrameVerifier:
    """One connection's check of signed frames: MAC, time window, rising request ids."""

    __slots__ = ("_key", "access_key", "last_request_id")

    def __init__(self, key: bytes, access_key: str) -> None:
        self._key = key
        self.access_key = access_key
        self.last_request_id = 0

    def verify(self, frame: Frame, now_ms: int) -> Frame:
        """The frame with its trailer cut off; PermissionDenied when it is not a fresh
        frame signed with this connection's session key."""
        payload = frame.payload
        if payload.nbytes < TRAILER:
            raise PermissionDenied(
                f"a signed {frame.type.name} frame needs a {TRAILER}-byte signature trailer",
                "bad_signature",
            )
        body = payload[: payload.nbytes - TRAILER]
        trailer = payload[payload.nbytes - TRAILER :]
        (stamp_ms,) = _STAMP.unpack_from(trailer)
        expected = _mac(
            self._key, frame.type, frame.request_id, frame.flags, stamp_ms, frame.header, (body,)
        )
        if not hmac.compare_digest(expected, trailer[_STAMP.size :]):
            raise PermissionDenied(
                f"the signature of {frame.type.name} request {frame.request_id} does not "
                f"match user {self.access_key}'s session on this connection: the frame was "
                "altered or signed for another connection; reconnect",
                "bad_signature",
            )
        if abs(stamp_ms - now_ms) > MAX_CLOCK_SKEW_MS:
            raise PermissionDenied(
                f"{frame.type.name} request {frame.request_id} is signed "
                f"{(stamp_ms - now_ms) / 1000:+.0f} s from the broker's clock (at most "
                f"{MAX_CLOCK_SKEW_MS // 1000} s); synchronise the clocks (NTP)",
                "clock",
            )
        if frame.request_id <= self.last_request_id:
            raise PermissionDenied(
                f"{frame.type.name} request id {frame.request_id} is not above the last one "
                f"taken on this connection ({self.last_request_id}): a replayed frame",
                "replay",
            )
        self.last_request_id = frame.request_id
        return frame._replace(payload=body)


UNSIGNED_TYPES: Final = frozenset({FrameType.AUTH, FrameType.REPLICA_AUTH})
"""What a connection may send before it proved anything."""
