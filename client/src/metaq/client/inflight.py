"""Which offsets of one queue are still being handled, and so which offset is safe to commit.

A push consumer hands the messages of a pull to handlers that finish in any order. The
broker stores one number per queue, the **next offset the group will consume**; a
consumer restarting (or taking the queue over at a rebalance) reads from exactly there.
So the committed offset must never pass a message whose handler has not finished
successfully, or a crash would lose it.

:class:`InflightOffsets` keeps, per queue:

- ``position``: where the next pull starts — the ``next_offset`` of the last pull whose
  messages were added, so it already covers messages the broker or the client's tag
  check filtered out (they are never handed to a handler and need no finishing);
- the offsets handed out and not finished yet, in ascending order.

and the offset to commit is exactly::

    commit_offset = min(lowest unfinished offset, position)

that is, the lowest unfinished offset while any message is in flight, else the position.
Every offset below it was either handled to completion or filtered out. Messages that
finished above the lowest unfinished one are committed only once everything below them
has finished too, so a restart repeats them (delivery is at least once), never skips.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class InflightOffsets:
    """In-flight offsets of one queue and the commit point they allow; no I/O, no clock.

    Offsets must be added in ascending order, each above the ones added before (a pull
    starts at ``position``, and a queue's offsets only grow). ``reposition`` moves the
    position anywhere (an offset correction from the broker); messages in flight
    below it keep holding the commit point down until they finish.
    """

    __slots__ = ("_bytes", "_pending", "_position")

    def __init__(self, position: int) -> None:
        if position < 0:
            raise ValueError(f"a queue offset cannot be negative ({position})")
        self._position = position
        # offset -> size in bytes, in ascending offset order: the first key is the
        # lowest unfinished offset, and finishing any offset is O(1).
        self._pending: OrderedDict[int, int] = OrderedDict()
        self._bytes = 0

    @property
    def position(self) -> int:
        """Where the next pull of the queue starts."""
        return self._position

    @property
    def count(self) -> int:
        """Messages handed out and not finished."""
        return len(self._pending)

    @property
    def bytes(self) -> int:
        """Record bytes of the messages handed out and not finished."""
        return self._bytes

    @property
    def lowest_unfinished(self) -> int | None:
        return next(iter(self._pending), None)

    @property
    def commit_offset(self) -> int:
        """The next offset to consume as far as the broker may be told: see the module doc."""
        lowest = next(iter(self._pending), None)
        if lowest is None or lowest > self._position:
            return self._position
        return lowest

    def add(self, messages: Iterable[tuple[int, int]], next_offset: int) -> None:
        """Record a pull's delivered messages as (offset, size) and move to ``next_offset``.

        ValueError if an offset is not above every offset added before, or
        ``next_offset`` does not lie past them.
        """
        pending = self._pending
        last = next(reversed(pending), -1)
        added = 0
        for offset, size in messages:
            if offset <= last:  # last is at least -1: a negative offset fails here too
                self._bytes += added
                raise ValueError(
                    f"offset {offset} is not above the offsets already in flight (last {last})"
                )
            pending[offset] = size
            added += size
            last = offset
        self._bytes += added
        if next_offset <= last:
            raise ValueError(f"next offset {next_offset} does not lie past offset {last}")
        self._position = next_offset

    def finish(self, offset: int) -> bool:
        """Mark a message's handling finished; False if it was not in flight."""
        size = self._pending.pop(offset, None)
        if size is None:
            return False
        self._bytes -= size
        return True

    def reposition(self, offset: int) -> None:
        """Move where the next pull starts (the broker corrected an offset).

        Moving back below messages still in flight (the queue lost its tail, say after a
        failover to a slave that lagged) forgets those messages: they will be pulled and
        handled again, and their handlers finishing now counts for nothing.
        """
        if offset < 0:
            raise ValueError(f"a queue offset cannot be negative ({offset})")
        while self._pending:
            last = next(reversed(self._pending))
            if last < offset:
                break
            self._bytes -= self._pending.pop(last)
        self._position = offset
