"""``python -m chaoslib.lossy_broker [metaq-broker flags]``: a real broker whose store
syncs through :class:`chaoslib.disk.MarkedLossyDisk`, so that after ``kill -9``
:func:`chaoslib.disk.drop_unsynced` can take away what a power loss would have.

Everything else is the unmodified ``metaq-broker``: only the store's ``Disk`` (the seam
the store offers for exactly this) is replaced.
"""

from __future__ import annotations

import sys
from typing import Any

from chaoslib.disk import MarkedLossyDisk
from metaq.broker import __main__ as broker_main
from metaq.broker import process
from metaq.broker.store import MessageStore, StoreConfig


def _lossy_store(config: StoreConfig, **kwargs: Any) -> MessageStore:
    return MessageStore(config, disk=MarkedLossyDisk(config.data_dir), **kwargs)


def main() -> int:
    process.MessageStore = _lossy_store  # type: ignore[misc,assignment]
    return broker_main.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
