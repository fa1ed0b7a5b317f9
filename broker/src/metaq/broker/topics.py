"""The topic table: which topics this broker serves, with queue counts and permissions.

Persisted as ``topics.json`` in the data directory, rewritten atomically on every change
(changes are rare: admin calls and the first send to an auto-created topic). ``version``
grows with every change, so the nameserver registration can tell when to re-register.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Final, Literal

from metaq.broker.files import load_json_state, write_json_atomically
from metaq.common.errors import ErrorCode, InvalidMessage, MetaqError
from metaq.common.model import TOPIC_PERMISSIONS, Permission, TopicConfig
from metaq.common.names import GROUP_TOPIC_PREFIXES, SYSTEM_PREFIX, TRACE_TOPIC
from metaq.common.record import MAX_QUEUES_PER_TOPIC, check_topic

log = logging.getLogger(__name__)

FILE_NAME: Final = "topics.json"
_FORMAT: Final = 1
"""Topics the broker keeps for itself (the replicated journals); clients cannot use them."""


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
        self.listeners: list[Callable[[], object]] = []
        """Called after every change (the registrar re-registers)."""
        self._topics: dict[str, TopicConfig] = {}
        self._saving = False
        self._load()

    def _load(self) -> None:
        load_json_state(self.path, _FORMAT, self._apply, "restore it from a backup")

    def _apply(self, data: Any) -> None:
        self.version = int(data["version"])
        self.journal_offset = int(data.get("journal_offset", -1))
        for name, entry in data["topics"].items():
            self._topics[name] = check_config(TopicConfig.from_json(name, entry))

    def _save(self) -> None:
        self.version += 1
        # The journal's listener tells the table which record it is as of: one write
        # after the listeners holds that too (the table is rewritten whole, so twice per
        # change cost twice as much at 10,000 topics).
        self._saving = True
        try:
            for listener in self.listeners:
                listener()
        finally:
            self._saving = False
        self._write()

    def _write(self) -> None:
        write_json_atomically(
            self.path,
            {
                "format": _FORMAT,
                "version": self.version,
                "journal_offset": self.journal_offset,
                "topics": {name: t.to_json() for name, t in sorted(self._topics.items())},
            },
        )

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
                self._save()
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
            self._save()
        except BaseException:
            self._restore(name, previous)
            raise
        log.info("topic %s deleted", name)
        return True

    def replace_all(self, configs: list[TopicConfig], journal_offset: int) -> None:
        """Adopt a whole table from the master's journal."""
        table = {c.name: check_config(c) for c in configs}
        if table == self._topics:
            self.journal_offset = journal_offset
            return
        self._topics = table
        self.journal_offset = journal_offset
        self._save()
        log.info("topic table from the master's journal: %s", sorted(table))

    def journaled(self, journal_offset: int) -> None:
        """The master journaled this table as record ``journal_offset``."""
        self.journal_offset = journal_offset
        if not self._saving:
            self._write()

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
