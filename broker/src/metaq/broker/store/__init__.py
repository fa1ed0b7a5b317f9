"""The MetaQ 2.0 store: one shared commitlog, per-queue consume queues, an index."""

from metaq.broker.store.config import FlushMode, StoreConfig
from metaq.broker.store.reads import GetResult, GetStatus
from metaq.broker.store.store import MessageStore, PutResult, PutStatus

__all__ = [
    "FlushMode",
    "GetResult",
    "GetStatus",
    "MessageStore",
    "PutResult",
    "PutStatus",
    "StoreConfig",
]
