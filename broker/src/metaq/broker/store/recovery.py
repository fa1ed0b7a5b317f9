"""Start-up recovery: decide what on disk to trust and repair the rest from the commitlog.

After a clean shutdown the files are trusted. After a crash (the abort marker is still
there) the commitlog is the truth: records are validated from the checkpoint's segment
on and a torn tail is cut; consume queues lose entries past the cut and are re-dispatched
from the checkpoint. Without a checkpoint, or when consume-queue files went missing, every
queue and the index are rebuilt from the whole commitlog.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass

from metaq.broker.store.checkpoint import Checkpoint
from metaq.broker.store.commitlog import CommitLog
from metaq.broker.store.consume_queue import QueueTable
from metaq.broker.store.dispatch import Dispatcher
from metaq.broker.store.index import MessageIndex

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    crashed: bool
    full_rebuild: bool
    commitlog_end: int
    tail_reason: str
    redispatched_records: int
    seconds: float


def recover(
    commitlog: CommitLog,
    queues: QueueTable,
    index: MessageIndex,
    dispatcher: Dispatcher,
    checkpoint: Checkpoint | None,
    crashed: bool,
    *,
    keep_damaged: bool = False,
) -> RecoveryReport:
    began = time.monotonic()
    queues_complete = queues.load()
    index.load()
    fresh = checkpoint is None and not commitlog.segments.segments
    if fresh:
        tail = None
        crashed = False
    elif checkpoint is None:
        log.warning("no valid checkpoint: validating the whole commitlog and rebuilding queues")
        # With nothing known durable, damage with intact records after it is corruption.
        tail = commitlog.recover(commitlog.min_offset, durable=2**63 - 1, keep_damaged=keep_damaged)
        crashed = True
    elif crashed:
        start = min(checkpoint.commitlog_durable, checkpoint.dispatched)
        tail = commitlog.recover(
            start, durable=checkpoint.commitlog_durable, keep_damaged=keep_damaged
        )
    else:
        commitlog.set_end(checkpoint.commitlog_durable)
        tail = None
    end = commitlog.write_offset
    for queue in queues.queues.values():
        queue.truncate_to_commitlog(end)
        # Retention moved the queue's minimum within its first file; the file does not say.
        queue.delete_before_commitlog(commitlog.min_offset)

    full = (checkpoint is None and not fresh) or not queues_complete
    redispatch_from = commitlog.min_offset
    if not full and checkpoint is not None:
        found = -1 if checkpoint.dispatched > end else queues.entries_below(checkpoint.dispatched)
        if found < 0:
            full = True  # the cut went below what the queues were built from
        elif found != checkpoint.queue_entries:
            log.warning(
                "consume queues hold %d entries below offset %d where the checkpoint "
                "recorded %d: queue files are missing; rebuilding them from the commitlog",
                found,
                checkpoint.dispatched,
                checkpoint.queue_entries,
            )
            full = True
        else:
            redispatch_from = checkpoint.dispatched
            if crashed:
                reindex_from = index.drop_since_checkpoint(checkpoint.dispatched)
                if reindex_from is not None:
                    # Re-putting queue entries below the checkpoint rewrites equal bytes.
                    redispatch_from = reindex_from
    if full:
        _reset_queues_and_index(queues, index)
    else:
        # Entries past the restart point are rebuilt anyway; cutting them first (holes
        # punched, nothing read) spares reading cold queue pages only to overwrite them.
        for queue in queues.queues.values():
            queue.truncate_to_commitlog(redispatch_from)
    dispatcher.dispatched = redispatch_from
    redispatched = dispatcher.catch_up()
    commitlog.queue_offsets = queues.next_offsets()
    report = RecoveryReport(
        crashed=crashed,
        full_rebuild=full,
        commitlog_end=end,
        tail_reason=tail.reason if tail else ("new store" if fresh else "clean shutdown"),
        redispatched_records=redispatched,
        seconds=time.monotonic() - began,
    )
    log.info("recovery: %s", report)
    return report


def _reset_queues_and_index(queues: QueueTable, index: MessageIndex) -> None:
    queues.close()
    shutil.rmtree(queues.root, ignore_errors=True)
    queues.root.mkdir(parents=True)
    index.close()
    shutil.rmtree(index.directory, ignore_errors=True)
    index.load()
