"""Topic configuration and consumer offsets, carried to slaves by the replicated log.

A master writes every change of its topic table (one record per change: the topic's
settings, or its deletion) and the consumer offsets committed since its last tick into
two system topics of its own commitlog. Slaves receive those records like any others and
apply them, so a promoted slave has every topic and every offset that reached it: there
is no separate, periodic copy to fall behind (RocketMQ's slaves pull offsets every 10 s,
and a failover rolls the offsets back by that much, which consumers see as a burst of
re-deliveries).

Offsets committed with COMMIT_OFFSET are journaled before they are answered, and under
sync replication answered once replicated; commits piggybacked on pulls are journaled on
the next tick (``journal_interval_ms``). At restart every broker replays the offsets
journal past its last snapshot, so a crash no longer loses the commits of the last
snapshot interval either. Each tick that finds nothing new may write nothing; every
``journal_full_interval_s`` the master writes the whole state again (the whole topic
table, which replaces a slave's table), so that a slave starting from the oldest
retained data still finds a complete state.

Topic records are applied one after another, in order: a change record is ``{"put":
{name: settings}, "deleted": [names]}`` (a record of the whole table per change made a
create at 10,000 topics append a megabyte for slaves to copy and apply). A slave of a
version from before change records (it took every topics record for the whole table)
cannot apply one: upgrade slaves before their master, as the rolling upgrade does.

The whole table is one record, ``{"topics": {name: settings}}``, when it fits the
store's record limit (``store.max_message_bytes``; about 45,000 topics at the default
4 MiB). A larger one is split into parts of at most ``ROWS_PER_RECORD`` topics, appended
as one batch: ``{"put": {...}, "deleted": [], "write": id, "part": i, "parts": n}``. A
slave collects the parts of one write in order and replaces its table only with the
last, so it never takes part of the table for the whole of it (it registers its topics
with the nameservers, and a promoted slave serves them). A part that does not follow
the one collected before it (retention or a cut log took the earlier parts, or the write
was cut short and another began: each write has its own random id) discards what was
collected, and the slave keeps its table until the master's next whole write. One
master's parts are one append, so nothing comes between them; after parts cut short, a
new master's change records may: a slave applies a change record at once and, if a
write is being collected, again on top of that write's table when it is complete (the
parts hold the table as it was before the change), so the table ends as the master's
after its last record either way. A slave of a version from before split tables reads
the parts as change records: it gets every topic but keeps those the whole table would
have dropped. Upgrade slaves before their master, as the rolling upgrade does.

The offsets state is written as many records as it takes, each well under the store's
record limit: every record is a list of rows that applies on its own, so a table of
100,000 groups is a few dozen records, not one a promotion cannot write.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from metaq.broker.offsets import ConsumerOffsets
from metaq.broker.store import GetStatus, MessageStore
from metaq.broker.store.commitlog import Appended
from metaq.broker.topics import TopicTable
from metaq.common.errors import MetaqError
from metaq.common.log_limit import Repeated
from metaq.common.model import TopicChanges, TopicConfig
from metaq.common.record import decode, encode
from metaq.common.service import PeriodicService

log = logging.getLogger(__name__)

TOPICS_JOURNAL: Final = "%SYS%TOPICS"
OFFSETS_JOURNAL: Final = "%SYS%OFFSETS"
_BATCH: Final = 256
ROWS_PER_RECORD: Final = 2048
"""Offsets rows, or topics of a split table, per journal record; a record that still
encodes too big is halved."""


@dataclass
class _Split:
    """The parts of one split whole-table write a slave has collected so far."""

    write: str
    parts: int
    first: int
    """The journal offset of part 0: the table is as of the record before it until the
    last part is applied."""
    next_offset: int
    next_part: int = 0
    topics: dict[str, Any] = field(default_factory=dict)
    changes: list[TopicChanges] = field(default_factory=list)
    """Change records that came between the parts, applied again on the whole table."""


class Journal:
    """``is_master`` says which side this broker is on right now (it changes)."""

    def __init__(
        self,
        store: MessageStore,
        topics: TopicTable,
        offsets: ConsumerOffsets,
        is_master: Callable[[], bool],
        full_interval_s: float = 600.0,
    ) -> None:
        self._store = store
        self._topics = topics
        self._offsets = offsets
        self._is_master = is_master
        self._full_interval_s = full_interval_s
        self._last_full = 0.0
        self._failing = Repeated(log, "journaling the topics and offsets failed")
        self._split: _Split | None = None

    # --- master ---------------------------------------------------------------------------

    def write_topics(self) -> Appended | None:
        """Journal the whole topic table (on becoming master, and every full interval)."""
        if not self._is_master():
            return None
        self._split = None  # collected as a slave; this write has the whole table
        appended = self._store.append(self._table_records(), wake_dispatcher=False)
        self._store.dispatch_appended()
        self._topics.journaled(appended.queue_offsets[-1])
        return appended

    def _table_records(self) -> list[bytes | bytearray]:
        """The whole table as one record when it fits, else as parts of one write."""
        table = {t.name: t.to_json() for t in self._topics.all()}
        limit = self._store.config.max_message_bytes
        whole = _dumps({"topics": table})
        if len(whole) <= limit:
            return [encode(TOPICS_JOURNAL, whole)]
        write = os.urandom(8).hex()

        def part(chunk: list[Any], number: int, parts: int) -> bytes:
            header = {"write": write, "part": number, "parts": parts}
            return _dumps({"put": dict(chunk), "deleted": [], **header})

        # Cut with the widest numbers a part can carry, so the real ones fit as well.
        widest = len(table)
        chunks = _fitting(list(table.items()), limit, lambda c: part(c, widest, widest))
        return [
            encode(TOPICS_JOURNAL, part(chunk, number, len(chunks)))
            for number, (chunk, _) in enumerate(chunks)
        ]

    def topic_changed(self, name: str | None) -> Appended | None:
        """The table's listener: journal the change of topic ``name`` alone (its settings
        now, or its deletion), or the whole table when ``name`` is None."""
        if name is None:
            return self.write_topics()
        if not self._is_master():
            return None
        config = self._topics.get(name)
        body: dict[str, Any] = {"put": {name: config.to_json()} if config else {}}
        body["deleted"] = [] if config else [name]
        appended = self._append(TOPICS_JOURNAL, body)
        self._topics.journaled(appended.queue_offsets[0])
        return appended

    def write_offsets(self, *, full: bool = False) -> Appended | None:
        """Journal the offsets committed since the last call (all of them with ``full``);
        returns the last record's append, None when there was nothing to write.

        The commits count as journaled only once every record is appended: a write that
        fails (disk full, say) leaves them to the next tick instead of losing them."""
        if not self._is_master():
            return None
        changed = self._offsets.changes(full=full)
        if not changed:
            return None
        rows = [[group, topic, queue_id, offset] for (group, topic, queue_id), offset in changed]
        records = self._offsets_records(rows, full)
        appended = self._store.append(records, wake_dispatcher=False)
        self._store.dispatch_appended()
        self._offsets.journaled(changed)
        # A snapshot taken from now on includes these records: a restart replays after them.
        self._offsets.journal_offset = appended.queue_offsets[-1] + 1
        return appended

    def write_deleted_group(self, group: str) -> Appended | None:
        """Journal that ``group`` was deleted, so slaves forget its offsets too.

        A record of its own, ``{"offsets": [], "deleted": [group]}``: a slave of an
        older version applies its (empty) rows and ignores the key, keeping the group's
        offsets until it is upgraded, which is harmless (they are only read back if the
        group comes again); it never fails on it."""
        if not self._is_master():
            return None
        return self._append(OFFSETS_JOURNAL, {"offsets": [], "deleted": [group], "full": False})

    def _offsets_records(self, rows: list[list[Any]], full: bool) -> list[bytes | bytearray]:
        limit = self._store.config.max_message_bytes
        chunks = _fitting(rows, limit, lambda chunk: _dumps({"offsets": chunk, "full": full}))
        return [encode(OFFSETS_JOURNAL, body) for _, body in chunks]

    def write_all(self) -> None:
        """Journal the whole state: on becoming master and every ``full_interval_s``.

        A failed write (disk full, say) is logged and tried again on the next tick, so it
        cannot stop a promotion half-way: the commits stay unjournaled until it works."""
        if not self._is_master():
            # A new master waiting for the controller's lease takes no writes yet: the
            # first tick that finds it writable writes the whole state.
            self._last_full = -math.inf
            return
        self._last_full = time.monotonic()
        try:
            self.write_topics()
            self.write_offsets(full=True)
        except MetaqError as exc:
            self._last_full = -math.inf
            self._failing.happened(f"{exc}; trying again every tick")
            return
        self._failing.ended()
        if len(self._offsets.held):
            # Commits consumers made here as a slave are in the table just journaled.
            log.info("journaled %d offsets committed here as a slave", len(self._offsets.held))
            self._offsets.held.clear()

    def hold_unjournaled(self) -> None:
        """On demotion: commits taken as master but not journaled go to the new master."""
        self._offsets.hold_unjournaled()

    async def persist_held(self) -> None:
        await self._offsets.held.persist()

    def tick(self) -> None:
        if self._is_master():
            if time.monotonic() - self._last_full >= self._full_interval_s:
                self.write_all()
            else:
                self.write_offsets()
        else:
            self.apply()

    def _append(self, topic: str, body: dict[str, Any]) -> Appended:
        record = encode(topic, _dumps(body))
        # Dispatched here, as a SEND's records are: waking the dispatcher thread for one
        # small record ten times a second takes the GIL from sends and pulls in flight.
        appended = self._store.append([record], wake_dispatcher=False)
        self._store.dispatch_appended()
        return appended

    # --- slave (and every broker at start) ---------------------------------------------

    def consumed_floors(self) -> dict[tuple[str, int], int]:
        """How far the broker itself is done with its journal topics, for retention:
        every topics record up to the one the table is as of, since the table on disk
        (snapshot and change log) holds that one's content (a master writes it as it
        journals it, a slave as it applies it), and an offsets record once the offsets
        snapshot on disk covers it.

        Under disk pressure the segment holding the newest topics record may then go; a
        slave that starts from the oldest retained offset meets the table at the master's
        next whole-state write (``journal_full_interval_s``)."""
        return {
            (TOPICS_JOURNAL, 0): self._topics.journal_offset + 1,
            (OFFSETS_JOURNAL, 0): self._offsets.saved_journal_offset,
        }

    def apply(self) -> int:
        """Apply journal records dispatched since the last call; return how many."""
        return self._apply_topics() + self._apply_offsets()

    def _apply_topics(self) -> int:
        applied = 0
        while True:
            split = self._split
            start = self._topics.journal_offset + 1 if split is None else split.next_offset
            result = self._store.get(TOPICS_JOURNAL, 0, start, max_messages=_BATCH)
            if result.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY):
                # Retention passed it (the master's next whole table brings what was
                # missed), or a cut log (a demoted master's own tail) ends before it: go
                # on from where the journal is now.
                self._discard_split("the journal it was in is gone")
                self._topics.journal_offset = result.next_offset - 1
                if result.status is GetStatus.OFFSET_OVERFLOW_BADLY:
                    return applied
                continue
            if result.status is not GetStatus.FOUND:
                return applied
            try:
                for record in result.records:
                    message = decode(record)
                    offset = message.queue_offset
                    self._apply_topic_record(json.loads(message.body), offset)
                    applied += 1
                    split = self._split
                    if split is None:
                        self._topics.journal_offset = max(self._topics.journal_offset, offset)
                    else:
                        # The table stays as of the record before the write (a restart
                        # collects it again), while the parts are read on.
                        split.next_offset = offset + 1
                        self._topics.journal_offset = max(
                            self._topics.journal_offset, split.first - 1
                        )
            finally:
                result.release()

    def _apply_topic_record(self, body: dict[str, Any], journal_offset: int) -> None:
        if "parts" in body:
            self._collect_part(body, journal_offset)
            return
        if "topics" in body:
            self._discard_split("a whole table followed")
            configs = [TopicConfig.from_json(name, e) for name, e in body["topics"].items()]
            self._topics.replace_all(configs, journal_offset)
            return
        changes = TopicChanges(
            tuple(TopicConfig.from_json(name, e) for name, e in body["put"].items()),
            tuple(body["deleted"]),
        )
        self._topics.apply_changes(changes, journal_offset)
        if self._split is not None:
            self._split.changes.append(changes)

    def _collect_part(self, body: dict[str, Any], journal_offset: int) -> None:
        """Collect one part of a split whole table; adopt the table with the last part."""
        write, number, parts = str(body["write"]), int(body["part"]), int(body["parts"])
        split = self._split
        if number == 0:
            self._discard_split("a new whole table began")
            split = self._split = _Split(write, parts, journal_offset, journal_offset + 1)
        elif split is None or (split.write, split.next_part, split.parts) != (write, number, parts):
            # Without the parts before it (retention took them, or the slave started
            # after them): the master's next whole write brings the table.
            self._discard_split(f"part {number + 1} of {parts} of write {write} came instead")
            return
        split.topics.update(body["put"])
        split.next_part += 1
        if split.next_part < split.parts:
            return
        self._split = None
        table = {name: TopicConfig.from_json(name, e) for name, e in split.topics.items()}
        for changes in split.changes:
            table.update((config.name, config) for config in changes.put)
            for name in changes.deleted:
                table.pop(name, None)
        self._topics.replace_all(list(table.values()), journal_offset)

    def _discard_split(self, why: str) -> None:
        split, self._split = self._split, None
        if split is not None:
            log.info(
                "topic table parts from the master's journal discarded (%d of %d of write "
                "%s collected; %s): the table stays as it is until the master's next "
                "whole write",
                split.next_part,
                split.parts,
                split.write,
                why,
            )

    def _apply_offsets(self) -> int:
        applied = 0
        while True:
            start = self._offsets.journal_offset
            result = self._store.get(OFFSETS_JOURNAL, 0, start, max_messages=_BATCH)
            if result.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY):
                # Retention passed it, or a cut log (a demoted master's own tail) ends
                # before it: go on from where the journal is now.
                self._offsets.journal_offset = result.next_offset
                if result.status is GetStatus.OFFSET_OVERFLOW_BADLY:
                    return applied
                continue
            if result.status is not GetStatus.FOUND:
                return applied
            for record in result.records:
                body = json.loads(decode(record).body)
                for group, topic, queue_id, offset in body["offsets"]:
                    self._offsets.commit(group, topic, int(queue_id), int(offset), journaled=True)
                for group in body.get("deleted", ()):
                    self._offsets.delete_group(group)
                applied += 1
            self._offsets.journal_offset = result.next_offset
            result.release()


class JournalService(PeriodicService):
    name = "journal"

    def __init__(self, journal: Journal, interval_s: float) -> None:
        super().__init__(interval_s)
        self.journal = journal

    async def run_once(self) -> None:
        self.journal.tick()
        await self.journal.persist_held()


def _dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _fitting(
    rows: list[Any], limit: int, body: Callable[[list[Any]], bytes]
) -> list[tuple[list[Any], bytes]]:
    """``rows`` in order, cut into chunks of at most ROWS_PER_RECORD, each with its
    ``body``: a chunk whose body is over ``limit`` bytes (long names) is halved until
    each half fits."""
    chunks: list[tuple[list[Any], bytes]] = []
    pending = [rows[i : i + ROWS_PER_RECORD] for i in range(0, len(rows), ROWS_PER_RECORD)]
    pending.reverse()
    while pending:
        chunk = pending.pop()
        encoded = body(chunk)
        if len(encoded) > limit and len(chunk) > 1:
            half = len(chunk) // 2
            pending.extend([chunk[half:], chunk[:half]])
            continue
        chunks.append((chunk, encoded))
    return chunks
