"""Cutting a partition log back: what a follower's log needs beyond appending (Kafka's
``LocalLog.truncateTo`` and ``truncateFullyAndStartAt``).

- :func:`truncate_to`: the log ends at a lower offset, whole batches only (a follower found, through
  the leader's epoch end offsets, that its log diverges from the leader's there, KIP-101/320).
- :func:`truncate_fully_and_start_at`: every segment goes and the log starts again, empty, at any
  offset (a follower whose fetch offset fell out of the leader's log, below its start).

Both first complete what is pending and in flight (flushed and fsynced, as ``flush()`` does, so
a flush job the owner still holds completes as a no-op), then cut it with the rest.  Both keep
the log's invariants in every state a crash can leave, as the docstrings say step by step:
the recovery-point checkpoint never lies above the log's end, and every segment on disk is a
whole one, so the next open (hpbroker.io.loader) finds a shorter log, never a damaged one.

These are the log's own internals, called only by the :class:`~hpbroker.io.log.PartitionLog`
methods of the same name, which refuse a closed, offline or writes-failed log and turn an
``OSError`` into the *writes failed* state (module docstring of hpbroker.io.log); from the first
file deleted by :func:`truncate_fully_and_start_at` on, a disk error takes the log offline
instead (what is in memory no longer matches the directory: reopen it, and recovery finds the
shorter log the crash rules below describe).  Single writer, the log's owner, like the log.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING

from hpbroker.io.files import fsync_dir
from hpbroker.io.index import IndexCorruptError
from hpbroker.io.loader import LoadedSegments, reload_last_segment
from hpbroker.io.segment import Segment

if TYPE_CHECKING:
    from hpbroker.io.log import PartitionLog

__all__ = ["truncate_fully_and_start_at", "truncate_to"]

logger = logging.getLogger(__name__)


def truncate_to(log: PartitionLog, offset: int) -> int:
    """``PartitionLog.truncate_to`` once its checks passed (its docstring says what holds,
    crash safety included); returns the new log end.  Raises OSError."""
    log._flush_pending(fsync=True)
    if offset >= log._log_end_offset:
        # Nothing to cut, but an epoch begun at the log end holds no record (a leader that
        # appended nothing in it): it goes, as in Kafka's truncateTo, or a follower would keep
        # fetching with it as its last epoch and be told to truncate here forever.
        log._leader_epochs.truncate_from_end(log._log_end_offset)
        return log._log_end_offset
    i = bisect.bisect_right(log._bases, offset) - 1
    segment, later = log._segments[i], log._segments[i + 1:]
    position, new_end = _batch_boundary(log, segment, offset)
    recovery_point = min(log._recovery_point, new_end)
    log._checkpoint.write(recovery_point)  # first: the log end never moves below the checkpoint
    for doomed in reversed(later):
        doomed.delete_files()
    segment.log.truncate_to(position)
    fsync_dir(log._directory)
    now = log._clock()
    loaded = _reopen_truncated(log, segment, position, new_end, now)
    for new in loaded.segments:
        new.sync()
    for new in loaded.segments[:-1]:
        new.release_index_files()
    log._doom([segment, *later])
    log._segments = log._segments[:i] + loaded.segments
    log._gaps = [gap for gap in log._gaps if gap.next_offset <= new_end] + loaded.gaps
    log._bases = [s.base_offset for s in log._segments]
    log._list_damaged_segments()
    active = log._segments[-1]
    log._log_end_offset, log._recovery_point = active.next_offset, recovery_point
    log._active_first_timestamp = active.first_batch_timestamp
    log._load_producer_state(now)  # removes the snapshots above the new end
    log._leader_epochs.truncate_from_end(log._log_end_offset)
    logger.warning("[%s] truncated to offset %d (asked %d): %d segments deleted", log._name,
                   log._log_end_offset, offset, len(later))
    return log._log_end_offset


def _reopen_truncated(log: PartitionLog, segment: Segment, position: int, new_end: int,
                      now_ms: int) -> LoadedSegments:
    """The segment whose ``.log`` was just cut to ``position`` (ending at ``new_end``), opened
    again as the log's last one.

    Kafka's ``LogSegment.truncateTo``, not a recovery: the bytes kept were checked when they
    were appended (or when the log was opened) and are unchanged, so the index entries below
    the cut are taken over from ``segment`` in memory (a time index entry stays only with the
    offset index entry it names, and its timestamp covers only batches up to that one, so
    ``max_timestamp`` stays exact), written to the index files, and checked by
    :meth:`Segment.load` like any trusted segment at open: the batch headers they name, and a
    scan of the few batches after the last entry.  The cost is the index files, not a scan of
    the whole segment (hundreds of ms for a large active segment: many followers truncating at
    once would stall their worker for seconds).  A segment holding a damaged range or sealed,
    or whose indexes fail the check, is recovered in full from the disk instead
    (:func:`~hpbroker.io.loader.reload_last_segment`)."""
    if not segment.damaged and not segment.sealed:
        new = Segment(log._directory, segment.base_offset, log._config, create=False, now_ms=now_ms,
                      log_name=log._name)
        try:
            old_oi, old_ti = segment.offset_index, segment.time_index
            keep = bisect.bisect_left(old_oi.positions, position)
            new.offset_index.relative_offsets = old_oi.relative_offsets[:keep]
            new.offset_index.positions = old_oi.positions[:keep]
            last = old_oi.relative_offsets[keep - 1] if keep else -1
            kept_times = bisect.bisect_right(old_ti.relative_offsets, last)
            new.time_index.timestamps = old_ti.timestamps[:kept_times]
            new.time_index.relative_offsets = old_ti.relative_offsets[:kept_times]
            new.offset_index.rewrite_if_changed()
            new.time_index.rewrite_if_changed()
            new.load()
            if new.next_offset == new_end:
                return LoadedSegments([new], [])
            why = f"it ends at offset {new.next_offset}, not {new_end}"
        except IndexCorruptError as e:
            why = str(e)
        except BaseException:
            new.close()
            raise
        new.close()
        logger.warning("[%s] %s truncated: its indexes do not hold (%s); recovering it in full", log._name,
                       segment.path, why)
    return reload_last_segment(log._directory, log._config, segment.base_offset, new_end, now_ms=now_ms,
                               log_name=log._name)


def _batch_boundary(log: PartitionLog, segment: Segment, offset: int) -> tuple[int, int]:
    """``(position, base_offset)`` in ``segment`` of the batch holding ``offset`` (of a damaged
    range holding it: where the range starts), or its end when ``offset`` lies past it."""
    if offset >= segment.next_offset:
        return segment.size_in_bytes, segment.next_offset
    damaged = segment.damaged_range_at(offset)
    if damaged is not None:
        return damaged.first_position, damaged.first_offset
    found = log._using_index(segment, lambda: segment.read(offset, 1))
    return found.position, found.first_offset


def truncate_fully_and_start_at(log: PartitionLog, offset: int) -> None:
    """``PartitionLog.truncate_fully_and_start_at`` once its checks passed (its docstring says
    what holds).

    The steps, and what a crash after each leaves for the next open:

    1. Complete what is pending and in flight (flushed, fsynced).  The old log, whole.
    2. Lower the checkpoint to ``offset`` if it lies above it.  The old log, whole.
    3. Forget the producer state, every snapshot deleted, durably.  The old log, whole: the
       open rebuilds the producer state from its batches.
    4. Delete the segments oldest first, fsyncing the directory after each: a crash leaves the
       newest ones, a log as retention leaves it (its leader epochs are trimmed to it by the
       open, as after retention).
    5. Forget the leader epochs (the file written empty), then write the checkpoint at
       ``offset``.  No segment: the open starts the log, empty, at the checkpoint, so at
       ``offset`` once it is written.
    6. Create the new active segment at ``offset``, fsync the directory.  The new log.

    A follower that restarts in any of these states finds a log that is either whole, a
    suffix of the old one or empty, fetches from its end and is told again that the offset
    is out of the leader's range, or that its log diverges, and truncates again."""
    log._flush_pending(fsync=True)
    old = log._segments
    if offset < log._recovery_point:
        log._checkpoint.write(offset)  # the log end never moves below the checkpoint
        log._recovery_point = offset
    try:
        log._producers.clear()
        fsync_dir(log._directory)  # before any segment goes: a snapshot never outlives its batches
        for segment in old:
            segment.delete_files()
            fsync_dir(log._directory)  # oldest first, durably: a crash leaves a suffix
        log._leader_epochs.clear()
        log._checkpoint.write(offset)
        now = log._clock()
        new = Segment(log._directory, offset, log._config, create=True, now_ms=now, log_name=log._name)
        try:
            fsync_dir(log._directory)
        except BaseException:
            new.close()
            raise
    except OSError as e:
        raise log._go_offline("truncate_fully_and_start_at", e) from e
    log._doom(old)
    log._segments, log._bases, log._gaps = [new], [offset], []
    log._log_end_offset = log._recovery_point = offset
    log._active_first_timestamp = -1
    log._list_damaged_segments()
    logger.warning("[%s] emptied (offsets [%d, %d) dropped, %d segments deleted): the log starts again at "
                   "offset %d", log._name, old[0].base_offset, old[-1].next_offset, len(old), offset)
