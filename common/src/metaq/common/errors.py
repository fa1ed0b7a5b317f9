"""Errors shared by every component; each says whether retrying can help."""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """What an ERROR frame reports; mirrors ``metaq.v1.ErrorResponse.Code`` number for number.

    Kept here rather than imported from the generated module so that raising an error never
    needs protobuf; a test checks the two enums agree.
    """

    UNSPECIFIED = 0
    UNSUPPORTED_VERSION = 1
    MALFORMED_FRAME = 2
    FRAME_TOO_LARGE = 3
    UNKNOWN_FRAME_TYPE = 4
    UNKNOWN_TOPIC = 5
    INVALID_MESSAGE = 6
    STORE_UNAVAILABLE = 7
    NOT_MASTER = 8
    NO_PERMISSION = 9
    BUSY = 10
    INTERNAL = 11
    NOT_ENOUGH_REPLICAS = 12
    EPOCH_MISMATCH = 13


class MetaqError(Exception):
    """Base of all metaq errors.

    ``retriable`` tells a retry loop whether the same request may succeed later or on
    another broker; it is policy carried by the error, not something callers infer from
    the type. ``code`` is what a broker puts in the ERROR frame when the error ends a
    request.
    """

    retriable: bool = False
    code: ErrorCode = ErrorCode.INTERNAL


class InvalidMessage(MetaqError):
    """The message itself is unacceptable (size, topic name, properties, queue id)."""

    code = ErrorCode.INVALID_MESSAGE


class InvalidRecord(MetaqError):
    """Bytes that do not form a well-made record of a known format version."""

    # Off the wire, a bad record is the sender's bad message.
    code = ErrorCode.INVALID_MESSAGE


class StoreUnavailable(MetaqError):
    """The store refuses writes for now (disk full, repeated I/O errors, shutting down).

    Reads go on; another broker may accept the write.
    """

    retriable = True
    code = ErrorCode.STORE_UNAVAILABLE


class NotMaster(MetaqError):
    """This broker does not take writes now: it is a slave, or a master that was replaced
    or lost contact with the failover controller. ``master_address`` names the group's
    master when known; clients refresh their routes and retry there."""

    retriable = True
    code = ErrorCode.NOT_MASTER

    def __init__(self, message: str, master_address: str = "") -> None:
        super().__init__(message)
        self.master_address = master_address


class NotEnoughReplicas(MetaqError):
    """Sync replication needs more in-sync copies than the group holds now; nothing was
    stored. Retry once a slave has caught up."""

    retriable = True
    code = ErrorCode.NOT_ENOUGH_REPLICAS


class EpochMismatch(MetaqError):
    """A replication peer is in another epoch than this side."""

    retriable = True
    code = ErrorCode.EPOCH_MISMATCH


class NotAuthenticated(MetaqError):
    """A replication peer did not prove the cluster secret (or this side has none to check
    it with); nothing was served, written or cut. The message says what to configure."""

    code = ErrorCode.NO_PERMISSION


class CorruptLog(MetaqError):
    """The commitlog holds damaged bytes that recovery must not skip silently."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(
            f"corrupt record in {path} at commitlog offset {offset}: {reason}. "
            "Records after it are intact, so this is not a torn tail; restore the segment "
            "from a replica or move it aside deliberately before starting the broker."
        )
        self.path = path
        self.offset = offset
        self.reason = reason


class ProtocolError(MetaqError):
    """The peer's bytes break the data-plane framing (``docs/protocol.md``).

    Framing cannot resynchronise after a bad frame, so the connection is unusable: answer
    with an ERROR frame carrying ``code`` if possible, then close it. Retrying the same
    bytes cannot help; a new connection may, once the cause (e.g. versions) is fixed.
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
