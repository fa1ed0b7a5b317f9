"""Errors shared by every component; each says whether retrying can help."""

from __future__ import annotations


class MetaqError(Exception):
    """Base of all metaq errors.

    ``retriable`` tells a retry loop whether the same request may succeed later or on
    another broker; it is policy carried by the error, not something callers infer from
    the type.
    """

    retriable: bool = False


class InvalidMessage(MetaqError):
    """The message itself is unacceptable (size, topic name, properties, queue id)."""


class InvalidRecord(MetaqError):
    """Bytes that do not form a well-made record of a known format version."""


class StoreUnavailable(MetaqError):
    """The store refuses writes for now (disk full, repeated I/O errors, shutting down).

    Reads go on; another broker may accept the write.
    """

    retriable = True


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
