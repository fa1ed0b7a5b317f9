"""How far a slave's master confirmed the log, kept on disk across restarts.

A slave under a controller serves consumers no further than the confirmed offset its
master announced (docs/replication.md, "What consumers may read"). Without this file a
restarted slave would serve nothing until a master answered it, so while its group has
no master (a failover after a double kill, say) it could serve none of the records it
served before. An offset that was confirmed once stays safe to read for good, so a value
a little old is only a lower bound: it is written at most once a second off the event
loop, and once more at a clean stop.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Final

from metaq.broker.files import load_json_state, write_json_atomically

FILE_NAME: Final = "confirmed.json"
_FORMAT: Final = 1
_EVERY_S: Final = 1.0


class ConfirmedMark:
    """The confirmed offset as last written (:attr:`offset`); :meth:`note` new ones."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE_NAME
        self.offset = 0
        load_json_state(
            self.path, _FORMAT, self._apply, "delete it: the slave then serves nothing until "
            "its master has answered it"
        )  # fmt: skip
        self._saved = self.offset
        self._latest = self.offset
        self._saved_at = -1e18
        self._timer: asyncio.TimerHandle | None = None
        self._writing: asyncio.Future[None] | None = None

    def _apply(self, data: Any) -> None:
        self.offset = int(data["offset"])

    def note(self, offset: int) -> None:
        """The slave learned ``offset`` as confirmed: written within about a second."""
        self._latest = max(self._latest, offset)
        if self._timer is None and self._writing is None and self._latest > self._saved:
            wait_s = max(0.0, self._saved_at + _EVERY_S - time.monotonic())
            self._timer = asyncio.get_running_loop().call_later(wait_s, self._write)

    def _write(self) -> None:
        self._timer = None
        offset = self._latest
        self._saved_at = time.monotonic()
        loop = asyncio.get_running_loop()
        self._writing = loop.run_in_executor(None, self._save, offset)
        self._writing.add_done_callback(lambda _: self._written())

    def _written(self) -> None:
        self._writing = None
        self.note(self._latest)  # anything learned meanwhile

    def _save(self, offset: int) -> None:
        write_json_atomically(self.path, {"format": _FORMAT, "offset": offset})
        self._saved = max(self._saved, offset)

    async def close(self) -> None:
        """Write the latest offset now (a clean stop)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._writing is not None:
            await self._writing
        if self._latest > self._saved:
            await asyncio.to_thread(self._save, self._latest)
