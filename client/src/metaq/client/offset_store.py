"""Consumed offsets kept on the consumer's own disk, for broadcasting consumers.

In broadcasting mode every member consumes every queue, so one offset per queue on the
broker could not say how far each member got: each member keeps its own, in a JSON
file written atomically (temp file, fsync, rename, directory fsync), so a crash leaves
either the old file or the new one, never a torn one. As on the broker, an offset is the
**next** offset to consume. A crash loses the offsets since the last save; the consumer
then sees those messages again (at least once).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Final

_FORMAT: Final = 1


class LocalOffsetStore:
    """Offsets by (topic, broker group, queue id) in one file; load on creation."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offsets: dict[tuple[str, str, int], int] = {}
        self._changes = 0
        self._saved = 0
        self._load()

    def _load(self) -> None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return
        try:
            data = json.loads(text)
            if data["format"] != _FORMAT:
                raise ValueError(f"format {data['format']!r} is not {_FORMAT}")
            for topic, brokers in data["offsets"].items():
                for broker_name, queues in brokers.items():
                    for queue_id, offset in queues.items():
                        if int(offset) < 0:
                            raise ValueError(f"negative offset {offset}")
                        self._offsets[(topic, broker_name, int(queue_id))] = int(offset)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(
                f"consumer offset file {self.path} is damaged: {exc!r}; move it aside to "
                "start from the consumer's configured position instead"
            ) from None

    def get(self, topic: str, broker_name: str, queue_id: int) -> int | None:
        """The next offset to consume in the queue, or None if none was stored."""
        return self._offsets.get((topic, broker_name, queue_id))

    def update(self, topic: str, broker_name: str, queue_id: int, offset: int) -> None:
        """Set the queue's offset in memory; :meth:`save` writes it."""
        if offset < 0:
            raise ValueError(f"a queue offset cannot be negative ({offset})")
        key = (topic, broker_name, queue_id)
        if self._offsets.get(key) != offset:
            self._offsets[key] = offset
            self._changes += 1

    @property
    def dirty(self) -> bool:
        return self._changes != self._saved

    def save(self) -> bool:
        """Write the file atomically if anything changed since the last save."""
        if not self.dirty:
            return False
        changes = self._changes
        nested: dict[str, dict[str, dict[str, int]]] = {}
        for (topic, broker_name, queue_id), offset in sorted(self._offsets.items()):
            nested.setdefault(topic, {}).setdefault(broker_name, {})[str(queue_id)] = offset
        _write_json_atomically(self.path, {"format": _FORMAT, "offsets": nested})
        self._saved = changes
        return True


def _write_json_atomically(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
