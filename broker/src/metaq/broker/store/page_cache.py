"""How much of the commitlog stays in the page cache: the newest part, within a budget.

Appends need a fresh page cache page every 4 KiB. Left alone, the cache grows until the
kernel has to reclaim, and where free memory is expensive to touch (a VM whose host
takes back free guest pages, where faulting one in again costs a good part of a core at
the appends' rates: the figures are in docs/benchmarks.md) each new page costs far more
than the append itself.
Handing back pages of the log that readers have left behind lets the kernel give them
straight out again for the next appends. Pages are released only below what is both
flushed (so releasing never writes anything back) and dispatched (the dispatcher reads
the log right behind the appends), and ``keep_bytes`` behind that, where tailing
consumers and replicas read. A reader further back faults pages in from disk, as it
would after the kernel evicted them.
"""

from __future__ import annotations

import logging
from typing import Final

from metaq.broker.store.segment import SegmentQueue

log = logging.getLogger(__name__)

# Linux 5.4+; Python 3.11's mmap module does not name it. Unlike MADV_DONTNEED it drops
# the pages from the page cache, not only from this mapping.
MADV_PAGEOUT: Final = 21
# One madvise per step: each holds the GIL for as long as the kernel takes over it, so a
# step stays small enough not to hold up the loop. Steps are
# aligned to their size: the page cache keeps a file in folios of up to 2 MiB, and the
# kernel skips a folio the range only partly covers (unaligned 4 MiB steps released half).
STEP_BYTES: Final = 4 * 1024 * 1024


class PageCacheWindow:
    """Releases the log's pages that lie more than ``keep_bytes`` behind a safe end.

    ``keep_bytes`` of 0 releases nothing: the kernel alone decides what stays cached.
    Called from one thread at a time (the flusher, under its lock).
    """

    def __init__(self, segments: SegmentQueue, keep_bytes: int) -> None:
        self._segments = segments
        self.keep_bytes = keep_bytes
        self.released = 0
        """Log offset below which pages have been handed back (a multiple of the step)."""
        self.released_bytes = 0
        self._enabled = keep_bytes > 0

    def start_at(self, offset: int) -> None:
        """Begin releasing from ``offset`` (pages below it are left as they are)."""
        self.released = offset - offset % STEP_BYTES

    def cut(self, offset: int) -> None:
        """The log was truncated at ``offset``: what comes after is new again."""
        self.start_at(min(self.released, offset))

    def release_below(self, safe_end: int) -> int:
        """Release pages below ``safe_end - keep_bytes``; return the bytes released."""
        if not self._enabled:
            return 0
        target = safe_end - self.keep_bytes
        target -= target % STEP_BYTES
        done = 0
        while self.released < target:
            segment = self._segments.find(self.released)
            if segment is None:
                # Before the first file (retention), or past the log's files: skip ahead.
                first = self._segments.min_offset
                self.released = first if self.released < first < target else target
                continue
            at = self.released - segment.start
            length = min(STEP_BYTES - at % STEP_BYTES, segment.size - at, target - self.released)
            try:
                mapping = segment.mapping
                if mapping is None:
                    raise ValueError("unmapped")
                mapping.madvise(MADV_PAGEOUT, at, length)
            except ValueError:
                pass  # retention unmapped the file meanwhile: nothing left to release
            except OSError as exc:
                self._enabled = False
                log.warning(
                    "cannot release commitlog pages from the page cache (%s): this kernel "
                    "lacks MADV_PAGEOUT (Linux 5.4+); store.commitlog_cache_bytes is ignored",
                    exc,
                )
                return done
            self.released += length
            done += length
        self.released_bytes += done
        return done
