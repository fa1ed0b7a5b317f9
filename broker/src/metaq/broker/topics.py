"""The topic table: which topics this broker serves, with queue counts and permissions.

Persisted as a snapshot, ``topics.json``, and a change log beside it, ``topics.log``:
every change appends one record (the topic's new settings, or its deletion) and is
fsynced before the call returns, so a create costs the same at 10 topics as at 10,000
(the table was rewritten whole on every change: at 10,000 topics a create took 150 ms).
Once the log holds more records than the table has topics (and at least
``COMPACT_AFTER``), the table is written whole as a new snapshot and the log starts
again: the cost of the rewrite is shared by as many changes as the table is long.

The log's first record names the snapshot it follows (``snapshot_id``): a crash between
a new snapshot and the log's restart leaves a log that names the old one, and it is
ignored, as the new snapshot holds all of it. A start reads the snapshot, then the log,
cutting a torn last record (a crash in the middle of an append). A ``topics.json``
written by an older version, without a log, is the whole table.

``version`` grows with every change; :meth:`TopicTable.changes_since` tells what changed
since a version, so the nameserver registration sends only those.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Final, Literal

from metaq.broker.files import ChangeLog, load_json_state, write_json_atomically
from metaq.common.errors import ErrorCode, InvalidMessage, MetaqError
from metaq.common.model import TOPIC_PERMISSIONS, Permission, TopicChanges, TopicConfig
from metaq.common.names import GROUP_TOPIC_PREFIXES, SYSTEM_PREFIX, TRACE_TOPIC
from metaq.common.record import MAX_QUEUES_PER_TOPIC, check_topic

log = logging.getLogger(__name__)

FILE_NAME: Final = "topics.json"
LOG_NAME: Final = "topics.log"
_FORMAT: Final = 1
COMPACT_AFTER: Final = 1024
"""The fewest log records that make a new snapshot (a small table is not rewritten at
every other change)."""
RECENT_CHANGES: Final = 4096
"""Changes remembered for :meth:`TopicTable.changes_since`; a reader further behind gets
the whole table."""

TopicListener = Callable[[str | None], object]
"""Called after a change with the topic's name, or None when the whole table changed."""


class UnknownTopic(MetaqError):
    """The topic does not exist on this broker (and is not auto-created)."""

    code = ErrorCode.UNKNOWN_TOPIC


class NoPermission(MetaqError):
    """The topic exists but does not allow the operation; retriable when another broker may."""

    code = ErrorCode.NO_PERMISSION

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message)
        self.retriable = retriable


def check_config(config: TopicConfig) -> TopicConfig:
    """``config`` when this broker can serve it, else InvalidMessage saying why not."""
    check_topic(config.name)
    if config.name.startswith(SYSTEM_PREFIX):
        raise InvalidMessage(
            f"topic names starting with {SYSTEM_PREFIX!r} are the broker's own; "
            f"choose another name than {config.name!r}"
        )
    for key in ("read_queues", "write_queues"):
        value = getattr(config, key)
        if not 1 <= value <= MAX_QUEUES_PER_TOPIC:
            raise InvalidMessage(
                f"topic {config.name!r}: {key} must be 1-{MAX_QUEUES_PER_TOPIC}, not {value}"
            )
    if config.permission not in TOPIC_PERMISSIONS:
        raise InvalidMessage(
            f"topic {config.name!r}: permission must be one of "
            + ", ".join(p.topic_text for p in TOPIC_PERMISSIONS)
        )
    return config


class TopicTable:
    """Topics by name; every change is on disk before the call returns."""

    def __init__(
        self, data_dir: Path, *, auto_create: bool = False, default_queue_count: int = 8
    ) -> None:
        self.path = data_dir / FILE_NAME
        self.auto_create = auto_create
        self.default_queue_count = default_queue_count
        self.version = 0
        self.journal_offset = -1
        """The journal record this table is as of (see metaq.broker.journal)."""
        self.listeners: list[TopicListener] = []
        """Called after every change (the journal writes it, the registrar re-registers)."""
        self._topics: dict[str, TopicConfig] = {}
        self._saving = False
        self._snapshot_id = 0
        self._log = ChangeLog(data_dir / LOG_NAME)
        self._log_follows = False
        """Whether the log file names the snapshot on disk (else it is restarted first)."""
        self._recent: deque[tuple[int, str]] = deque(maxlen=RECENT_CHANGES)
        self._recent_floor = 0
        """:meth:`changes_since` knows every change after this version."""
        self._load()

    # --- on disk ----------------------------------------------------------------------

    def _load(self) -> None:
        load_json_state(self.path, _FORMAT, self._apply, "restore it from a backup")
        records = self._log.read()
        if records and records[0].get("snapshot_id") == self._snapshot_id:
            try:
                for record in records[1:]:
                    self._replay(record)
            except (KeyError, TypeError, ValueError, AttributeError, MetaqError) as exc:
                raise ValueError(
                    f"{self._log.path} is damaged: {exc!r}; restore the data directory from "
                    "a backup (or a slave's copy)"
                ) from None
            self._log_follows = True
        self._recent_floor = self.version

    def _apply(self, data: Any) -> None:
        self.version = int(data["version"])
        self.journal_offset = int(data.get("journal_offset", -1))
        self._snapshot_id = int(data.get("snapshot_id", 0))
        for name, entry in data["topics"].items():
            self._topics[name] = check_config(TopicConfig.from_json(name, entry))

    def _replay(self, record: dict[str, Any]) -> None:
        for name, entry in record.get("put", {}).items():
            self._topics[name] = check_config(TopicConfig.from_json(name, entry))
        for name in record.get("deleted", ()):
            self._topics.pop(name, None)
        self.version = int(record["version"])
        self.journal_offset = int(record["journal_offset"])

    def _save(self, name: str | None) -> None:
        """Persist a change of topic ``name`` (None: of the whole table) made in memory."""
        self.version += 1
        # The journal's listener tells the table which record it is as of: the log record
        # written after the listeners holds that too.
        self._saving = True
        try:
            for listener in self.listeners:
                listener(name)
        finally:
            self._saving = False
        if name is None:
            self._write_snapshot()
            self._recent.clear()
            self._recent_floor = self.version
            return
        config = self._topics.get(name)
        change = {"put": {name: config.to_json()}} if config else {"deleted": [name]}
        self._append(change)
        self._recent.append((self.version, name))
        if len(self._recent) == self._recent.maxlen:
            self._recent_floor = max(self._recent_floor, self._recent[0][0] - 1)

    def _append(self, change: dict[str, Any]) -> None:
        if not self._log_follows or self._log.records > max(COMPACT_AFTER, len(self._topics)):
            # The table, this change included, as a new snapshot: the rewrite is shared by
            # at least as many changes as there are topics.
            self._write_snapshot()
            return
        self._log.append({**change, "version": self.version, "journal_offset": self.journal_offset})

    def _write_snapshot(self) -> None:
        self._snapshot_id += 1
        write_json_atomically(
            self.path,
            {
                "format": _FORMAT,
                "version": self.version,
                "journal_offset": self.journal_offset,
                "snapshot_id": self._snapshot_id,
                "topics": {name: t.to_json() for name, t in sorted(self._topics.items())},
            },
        )
        self._log_follows = False
        self._log.reset([{"snapshot_id": self._snapshot_id}])
        self._log_follows = True

    # --- admin ------------------------------------------------------------------------

    def get(self, name: str) -> TopicConfig | None:
        return self._topics.get(name)

    def all(self) -> list[TopicConfig]:
        return sorted(self._topics.values(), key=lambda t: t.name)

    def create(
        self,
        name: str,
        *,
        read_queues: int | None = None,
        write_queues: int | None = None,
        permission: Permission = Permission.READ_WRITE,
        ordered: bool = False,
    ) -> TopicConfig:
        """Create a topic, or replace its settings when it exists (RocketMQ's
        updateAndCreateTopic); queue counts default to ``default_queue_count``."""
        config = TopicConfig(
            name,
            read_queues or self.default_queue_count,
            write_queues or self.default_queue_count,
            permission,
            ordered,
        )
        return self.put(config)

    def update(
        self,
        name: str,
        *,
        read_queues: int | None = None,
        write_queues: int | None = None,
        permission: Permission | None = None,
        ordered: bool | None = None,
    ) -> TopicConfig:
        """Change some settings of an existing topic; raises UnknownTopic if there is none."""
        current = self._require(name)
        changes: dict[str, Any] = {
            "read_queues": read_queues,
            "write_queues": write_queues,
            "permission": permission,
            "ordered": ordered,
        }
        return self.put(replace(current, **{k: v for k, v in changes.items() if v is not None}))

    def put(self, config: TopicConfig) -> TopicConfig:
        """Create or replace a topic."""
        check_config(config)
        if self._topics.get(config.name) != config:
            previous = self._topics.get(config.name)
            self._topics[config.name] = config
            try:
                self._save(config.name)
            except BaseException:
                self._restore(config.name, previous)
                raise
            log.info("topic %s: %s", config.name, config.to_json())
        return config

    def delete(self, name: str) -> bool:
        """Forget a topic; its messages stay in the log until retention removes them."""
        previous = self._topics.pop(name, None)
        if previous is None:
            return False
        try:
            self._save(name)
        except BaseException:
            self._restore(name, previous)
            raise
        log.info("topic %s deleted", name)
        return True

    def replace_all(self, configs: list[TopicConfig], journal_offset: int) -> None:
        """Adopt a whole table from the master's journal."""
        table = {c.name: check_config(c) for c in configs}
        if table == self._topics:
            self.journaled(journal_offset)
            return
        self._topics = table
        self.journal_offset = journal_offset
        self._save(None)
        log.info("topic table from the master's journal: %d topics", len(table))

    def apply_changes(self, changes: TopicChanges, journal_offset: int) -> None:
        """Apply one change record of the master's journal."""
        for config in changes.put:
            check_config(config)
        self.journal_offset = journal_offset
        for config in changes.put:
            if self._topics.get(config.name) != config:
                self._topics[config.name] = config
                self._save(config.name)
                log.info("topic %s from the master's journal: %s", config.name, config.to_json())
        for name in changes.deleted:
            if self._topics.pop(name, None) is not None:
                self._save(name)
                log.info("topic %s deleted by the master's journal", name)

    def journaled(self, journal_offset: int) -> None:
        """The master journaled this table, or the change being saved, as record
        ``journal_offset``."""
        self.journal_offset = journal_offset
        if not self._saving:
            self._append({"version": self.version})

    def changes_since(self, version: int) -> TopicChanges | None:
        """What changed after ``version`` (a value :attr:`version` had): the topics put,
        as they are now, and those deleted; None when that is too long ago to know (the
        caller takes the whole table)."""
        if version < self._recent_floor or version > self.version:
            return None
        names: dict[str, None] = {}
        for changed_at, name in reversed(self._recent):
            if changed_at <= version:
                break
            names[name] = None
        put = tuple(self._topics[n] for n in names if n in self._topics)
        return TopicChanges(put, tuple(n for n in names if n not in self._topics))

    def _restore(self, name: str, previous: TopicConfig | None) -> None:
        self.version -= 1
        if previous is None:
            self._topics.pop(name, None)
        else:
            self._topics[name] = previous

    # --- data plane -------------------------------------------------------------------

    def resolve_send(self, name: str, queue_id: int) -> TopicConfig:
        """The topic a send may go to, or the error to answer with.

        An unknown topic with auto-create on yields a config not yet in the table: call
        :meth:`put` once the messages are stored, so a refused send creates nothing.
        """
        config = self._topics.get(name)
        if config is None:
            check_topic(name)
            if name.startswith(SYSTEM_PREFIX):
                raise UnknownTopic(f"topic {name!r} is the broker's own; clients cannot send to it")
            if name.startswith(GROUP_TOPIC_PREFIXES) or name == TRACE_TOPIC:
                # A consumer group's retry or dead-letter topic, or the message trace
                # topic: made on first use.
                return TopicConfig(name, 1, 1)
            if not self.auto_create:
                raise UnknownTopic(
                    f"topic {name!r} does not exist on this broker and auto_create_topics "
                    "is off: create it first (admin API) or check the name"
                )
            config = TopicConfig(name, self.default_queue_count, self.default_queue_count)
            return _open_for(config, "write", queue_id, "; refresh the route")
        return _open_for(config, "write", queue_id, "; refresh the route")

    def resolve_pull(self, name: str, queue_id: int) -> TopicConfig:
        config = self._require(name)
        return _open_for(config, "read", queue_id)

    def _require(self, name: str) -> TopicConfig:
        config = self._topics.get(name)
        if config is None:
            check_topic(name)
            raise UnknownTopic(f"topic {name!r} does not exist on this broker")
        return config


def _open_for(
    config: TopicConfig, operation: Literal["read", "write"], queue_id: int, hint: str = ""
) -> TopicConfig:
    """``config``, if its permission allows ``operation`` on ``queue_id``; else the error
    to answer with (``hint`` ends the message of a queue out of range)."""
    if not (config.permission.writable if operation == "write" else config.permission.readable):
        raise _refusal(config, operation)
    queues = config.write_queues if operation == "write" else config.read_queues
    if queue_id >= queues:
        raise InvalidMessage(
            f"queue id {queue_id} is out of range: topic {config.name!r} has "
            f"{queues} {operation} queues (0-{queues - 1}){hint}"
        )
    return config


def _refusal(config: TopicConfig, operation: str) -> NoPermission:
    if config.permission is Permission.WRITE_WIPE:
        return NoPermission(
            f"topic {config.name!r} is write-wiped on this broker (being drained for "
            "maintenance): send to another broker of the topic",
            retriable=True,
        )
    return NoPermission(
        f"topic {config.name!r} does not allow {operation}s "
        f"(permission {config.permission.topic_text})",
        retriable=False,
    )
