"""Consumer offsets: what each consumer group has consumed, per topic queue.

The stored offset is the **next queue offset the group will consume** — one past the
last message it processed (RocketMQ's convention). A consumer that (re)starts pulls from
exactly the stored offset, and lag is ``max_offset - stored``.

Commits land in memory and are snapshotted to ``consumer_offsets.json`` (atomically:
temp file, fsync, rename, directory fsync) every ``offset_snapshot_interval_ms`` and at a
clean shutdown. A crash can lose the commits since the last snapshot; consumers then
re-read those messages, which at-least-once delivery allows.

On a slave, consumers' commits are held (:mod:`metaq.broker.held_offsets`) until the
master takes them; the master's journal does not overwrite a held commit meanwhile.

An operator's reset (:meth:`ConsumerOffsets.reset`) would be undone by the group's live
members, who go on committing the positions they had (RocketMQ pushes its
resetOffsetByTime to the clients for that reason). So each reset moves the (group,
topic)'s **reset generation** on: consumers carry the generation their position comes
from on every pull and commit, a commit from an older one is not stored, and a pull
from one is answered OFFSET_RESET with the new offset, from which the member goes on
(``metaq.broker.pull``). A generation is the reset's wall-clock time in ms (at least one
past the last): generations live in memory only, and a broker that restarted or was
elected since knows none, yet still counts its next reset newer than any position a
consumer holds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final

from metaq.broker.files import load_json_state, write_json_atomically
from metaq.broker.held_offsets import HeldOffsets, OffsetKey
from metaq.common.errors import InvalidMessage
from metaq.common.names import check_group
from metaq.common.service import PeriodicService

FILE_NAME: Final = "consumer_offsets.json"
_FORMAT: Final = 1
DEFAULT_MAX_GROUPS: Final = 100_000


class ConsumerOffsets:
    """Committed offsets by (group, topic, queue id), with dirty tracking for snapshots."""

    def __init__(self, data_dir: Path, *, max_groups: int = DEFAULT_MAX_GROUPS) -> None:
        self.path = data_dir / FILE_NAME
        self.max_groups = max_groups
        """Consumers may bring no group beyond this many (the master's journal and a
        slave's forwarded commits may)."""
        self._offsets: dict[OffsetKey, int] = {}
        self._groups: set[str] = set()
        self._generations: dict[tuple[str, str], int] = {}
        self.on_reset: Callable[[str, Iterable[int]], None] = lambda _topic, _queues: None
        """Called after a reset with its topic and queue ids (the pull handler wakes the
        long polls parked there, so their members learn of it at once)."""
        self.on_acknowledged: Callable[[str, str, int], None] = lambda _g, _t, _n: None
        """Called with (group, topic, messages) when a consumer's commit here moves the
        group's offset forward by that many (the consume-rate metric). Not for the
        master's journal replayed on a slave nor a slave's forwarded commits (counted
        where the consumer committed), nor resets (an operator's, not a consumer's)."""
        self._unjournaled: dict[OffsetKey, int] = {}
        self._journal_offset = 0
        self.saved_journal_offset = 0
        """``journal_offset`` as of the snapshot on disk: a start replays from there."""
        self._changes = 0
        self._saved = 0
        self._load()
        self.held = HeldOffsets(data_dir)
        """Commits consumers made while this broker was a slave, not yet the master's."""
        for (group, topic, queue_id), held in self.held.items():
            self._offsets[(group, topic, queue_id)] = held.offset
        self._groups = {group for group, _, _ in self._offsets}

    def _load(self) -> None:
        load_json_state(
            self.path,
            _FORMAT,
            self._apply,
            "move it aside to start with no committed offsets (consumers then start from "
            "their configured position)",
        )

    def _apply(self, data: Any) -> None:
        self._journal_offset = int(data.get("journal_offset", 0))
        self.saved_journal_offset = self._journal_offset
        for group, topics in data["offsets"].items():
            for topic, queues in topics.items():
                for queue_id, offset in queues.items():
                    self._offsets[(group, topic, int(queue_id))] = int(offset)

    @property
    def journal_offset(self) -> int:
        """The next offsets-journal record to apply (see metaq.broker.journal)."""
        return self._journal_offset

    @journal_offset.setter
    def journal_offset(self, offset: int) -> None:
        # A change to save: until the snapshot on disk holds it, retention keeps the
        # journal records a restart would replay.
        if offset != self._journal_offset:
            self._journal_offset = offset
            self._changes += 1

    def commit(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        journaled: bool = False,
        held: bool = False,
        forwarded: bool = False,
        reset: bool = False,
    ) -> None:
        """Store ``offset`` (the next one to consume), replacing any earlier commit.

        ``journaled``: the commit comes from the master's journal, not from a consumer,
        so it is not journaled again; it does not replace a commit held here, which is
        newer (the master takes or refuses that one when it is forwarded).
        ``held``: a consumer's commit at a slave, held until the master has it.
        ``forwarded``: a commit a slave held and forwarded; like a journaled one it is not
        refused for ``max_groups`` (the slave answered its consumer OK already), but it
        is journaled here.
        ``reset``: an operator's reset, not a consumer's acknowledgement.
        """
        key = (group, topic, queue_id)
        if journaled and key in self.held:
            return
        current = self._offsets.get(key)
        if current == offset:
            return
        if current is None:
            check_group(group)
            if group not in self._groups:
                exempt = journaled or forwarded
                if not exempt and len(self._groups) >= self.max_groups:
                    raise InvalidMessage(
                        f"this broker holds offsets of {len(self._groups)} consumer groups, "
                        f"its limit (max_consumer_groups); a commit of new group {group!r} "
                        "is refused: reuse an existing group or raise max_consumer_groups"
                    )
                self._groups.add(group)
        if offset < 0:
            raise InvalidMessage(f"a committed offset cannot be negative ({offset})")
        if held:
            self.held.hold(key, offset, current)
        elif not journaled:
            self._unjournaled[key] = offset
        self._offsets[key] = offset
        self._changes += 1
        if current is not None and offset > current and not (journaled or forwarded or reset):
            self.on_acknowledged(group, topic, offset - current)

    def reset(self, group: str, topic: str, offsets: dict[int, int]) -> int:
        """Commit ``offsets`` (queue id -> next offset to consume) for ``group`` as an
        operator's reset of its position on ``topic``: the reset generation moves on, so
        members' commits from before it are refused and their pulls told. Returns the
        new generation. InvalidMessage as :meth:`commit` (a new group past
        ``max_groups``), before anything is stored."""
        for queue_id, offset in offsets.items():
            self.commit(group, topic, queue_id, offset, reset=True)
        key = (group, topic)
        generation = max(self._generations.get(key, 0) + 1, time.time_ns() // 1_000_000)
        self._generations[key] = generation
        self.on_reset(topic, offsets)
        return generation

    def delete_group(self, group: str) -> int:
        """Forget every offset of ``group`` (an operator deleting the group); how many
        there were. Its reset generations stay, so a member's commit from before a reset
        is still refused."""
        gone = [key for key in self._offsets if key[0] == group]
        for key in gone:
            del self._offsets[key]
            self._unjournaled.pop(key, None)
        self._groups.discard(group)
        if gone:
            self._changes += 1
        return len(gone)

    def reset_generation(self, group: str, topic: str) -> int:
        """The generation of ``group``'s last reset on ``topic`` here (0: none known)."""
        return self._generations.get((group, topic), 0)

    def stale(self, group: str, topic: str, generation: int) -> bool:
        """Whether a position of that reset generation predates the group's last reset."""
        return generation < self._generations.get((group, topic), 0)

    def forwarded(self, sent: list[tuple[OffsetKey, int]], answer: dict[OffsetKey, int]) -> None:
        """The master answered held commits ``sent``: its offsets (``answer``) replace
        them, except where a consumer committed here again meanwhile."""
        for key, offset in sent:
            settled = self.held.settle(key, offset)
            if settled and key in answer and self._offsets.get(key) != answer[key]:
                self._offsets[key] = answer[key]
                self._changes += 1

    def hold_unjournaled(self) -> None:
        """A master demoted before it journaled its last commits: hold them for the new
        master (nothing is known of the new master's offsets for them)."""
        for key, offset in self._unjournaled.items():
            self.held.hold(key, offset, None)
        self._unjournaled = {}

    def changes(self, *, full: bool = False) -> list[tuple[OffsetKey, int]]:
        """The commits not journaled yet (every offset with ``full``); see :meth:`journaled`."""
        return self.items() if full else sorted(self._unjournaled.items())

    def journaled(self, changes: list[tuple[OffsetKey, int]]) -> None:
        """Count ``changes`` (from :meth:`changes`) as journaled, unless committed again
        since."""
        unjournaled = self._unjournaled
        for key, offset in changes:
            if unjournaled.get(key) == offset:
                del unjournaled[key]

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        """The next offset ``group`` will consume in the queue, or None if never committed."""
        return self._offsets.get((group, topic, queue_id))

    def items(self) -> list[tuple[OffsetKey, int]]:
        return sorted(self._offsets.items())

    def consumed_floors(self) -> dict[tuple[str, int], int]:
        """Per (topic, queue id): the lowest committed offset among the groups that
        committed anything on the topic; a group with no commit on a queue of its topic
        has consumed nothing of it. Queues of topics no group committed on are absent.

        Safe from another thread: the commits are copied in one step first.
        """
        commits = list(self._offsets.items())
        groups_of: dict[str, set[str]] = {}
        lowest: dict[tuple[str, int], int] = {}
        counted: dict[tuple[str, int], int] = {}
        for (group, topic, queue_id), offset in commits:
            groups_of.setdefault(topic, set()).add(group)
            key = (topic, queue_id)
            lowest[key] = min(offset, lowest.get(key, offset))
            counted[key] = counted.get(key, 0) + 1
        return {
            key: offset if counted[key] == len(groups_of[key[0]]) else 0
            for key, offset in lowest.items()
        }

    def groups(self) -> list[str]:
        return sorted(self._groups)

    @property
    def dirty(self) -> bool:
        return self._changes != self._saved

    def snapshot(self) -> tuple[int, int, list[tuple[OffsetKey, int]]]:
        """(change count, journal offset, every offset) for :meth:`write`, taken on the
        owning thread: one copy of the table, whatever its size; :meth:`write` does the
        rest (100,000 groups take a second to encode, which must not hold the loop)."""
        return self._changes, self._journal_offset, list(self._offsets.items())

    def write(self, snapshot: tuple[int, int, list[tuple[OffsetKey, int]]]) -> None:
        """Write a snapshot atomically (may run in another thread), then mark it saved."""
        changes, journal_offset, items = snapshot
        nested: dict[str, dict[str, dict[str, int]]] = {}
        for (group, topic, queue_id), offset in items:
            nested.setdefault(group, {}).setdefault(topic, {})[str(queue_id)] = offset
        data = {"format": _FORMAT, "journal_offset": journal_offset, "offsets": nested}
        write_json_atomically(self.path, data)
        self._saved = max(self._saved, changes)
        self.saved_journal_offset = max(self.saved_journal_offset, journal_offset)

    def save(self) -> bool:
        """Write now if anything changed since the last write; return whether it wrote."""
        if not self.dirty:
            return False
        self.write(self.snapshot())
        return True


class OffsetSnapshotService(PeriodicService):
    """Snapshots the offsets on an interval (the file write in a worker thread) and once
    more when stopped."""

    name = "offset-snapshot"

    def __init__(
        self,
        offsets: ConsumerOffsets,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(interval_s)
        self.offsets = offsets
        self._clock = clock
        self._next_write = 0.0

    async def run_once(self) -> None:
        now = self._clock()
        if not self.offsets.dirty or now < self._next_write:
            return
        await asyncio.to_thread(self.offsets.write, self.offsets.snapshot())
        # A table so large that writing it takes long (a flood of made-up groups) is
        # written less often, so its writer takes at most a tenth of the broker's time;
        # the journal keeps every commit meanwhile.
        self._next_write = now + 10 * (self._clock() - now)

    async def on_stop(self) -> None:
        # The held commits are the forwarder's to write (OffsetForwarder.on_stop).
        self.offsets.save()
