"""Opening a partition directory: clean it, load or recover its segments, in offset order.

The rule (Kafka's): the recovery point says every batch below it reached the disk with its
indexes.  Segments wholly below the segment that holds the recovery point are *trusted*: their
indexes are loaded and checked against the log (:meth:`Segment.load`), and rebuilt by a full
scan if the check fails.  From the segment holding the recovery point on, every segment is
*recovered*: scanned batch by batch (length, CRC, offsets contiguous), its indexes rebuilt, its
``.log`` truncated at the first bad byte.  Once a segment is truncated, or a segment does not
start where its predecessor ends, every later segment is deleted: offsets in a log are
contiguous, and nothing after a hole can be trusted to follow it.  A trusted segment is never
truncated: damage found in one (rot in fsynced data, not a torn write) is recorded, its bytes
and every later segment stay, and reads that reach the damage fail with CorruptRecordError.

Clean shutdown (Kafka's ``.kafka_cleanshutdown``, per partition directory here): when the open
found a ``clean-shutdown`` marker (``hpbroker.io.checkpoint``) holding the same offset as the
checkpoint, the log was closed with everything fsynced and that offset is its end.  Then every
segment is trusted, the active one included, so a clean reopen reads index files and the tails
of the logs, not whole segments; the last segment must also end exactly at that offset, else it
is recovered.  Without such a marker (a crash, a close that failed, a marker or checkpoint
missing, malformed or disagreeing) the rule above applies.  The open removes the marker, durably,
before this runs, so a crash of the reopened log is never taken for a clean shutdown.  A
segment created here (a directory without any) has its directory entry fsynced at once.

Directory debris removed first: ``*.tmp`` and ``*.deleted`` files, and ``.index``/``.timeindex``
files whose ``.log`` is gone.  Files that are not ours are left alone.  Called once per open by
:class:`~hpbroker.io.log.PartitionLog`, once it holds the directory's lock and has taken the
marker, before anything else touches the directory.
"""

from __future__ import annotations

import bisect
import logging
import os

from hpbroker.io.config import LogConfig
from hpbroker.io.files import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    TMP_SUFFIX,
    fsync_dir,
    parse_segment_file_name,
    segment_file_name,
    unlink_if_exists,
)
from hpbroker.io.index import IndexCorruptError
from hpbroker.io.segment import Segment

__all__ = ["load_segments"]

logger = logging.getLogger(__name__)


def load_segments(directory: str, config: LogConfig, recovery_point: int, *, now_ms: int,
                  log_name: str, clean_shutdown: bool = False) -> list[Segment]:
    """The segments of ``directory``, loaded or recovered (see the module docstring); a new
    empty segment at offset 0 if there are none.  ``clean_shutdown``: the log was closed cleanly
    and ``recovery_point`` is its end.  Raises OSError; closes what it opened then."""
    bases = _clean_directory(directory, log_name)
    if not bases:
        segment = Segment(directory, 0, config, create=True, now_ms=now_ms, log_name=log_name)
        try:
            fsync_dir(directory)  # its records must not vanish with its directory entry
        except BaseException:
            segment.close()
            raise
        return [segment]
    holding = len(bases) if clean_shutdown else max(0, bisect.bisect_right(bases, recovery_point) - 1)
    segments: list[Segment] = []
    try:
        for i, base in enumerate(bases):
            segment = Segment(directory, base, config, create=False, now_ms=now_ms, log_name=log_name)
            segments.append(segment)
            last = i == len(bases) - 1
            ends_at = recovery_point if clean_shutdown and last else None
            next_base = None if last else bases[i + 1]
            cut = _open_segment(segment, trusted=i < holding, ends_at=ends_at, next_base=next_base,
                                log_name=log_name)
            if i and base != segments[-2].next_offset:
                logger.warning("[%s] segment %s starts at offset %d but its predecessor ends at %d",
                               log_name, segment.path, base, segments[-2].next_offset)
                segments.pop().close()
                _delete_segment_files(directory, bases[i:], log_name)
                break
            if cut:
                _delete_segment_files(directory, bases[i + 1 :], log_name)
                break
    except BaseException:
        for segment in segments:
            segment.close()
        raise
    return segments


def _open_segment(segment: Segment, *, trusted: bool, ends_at: int | None, next_base: int | None,
                  log_name: str) -> int:
    """Load a trusted segment (which must end at ``ends_at`` unless None), falling back to a
    rebuild of its indexes; recover the others.  Bytes cut.

    A trusted segment that is not the last one is never cut: what is wrong in it is rot in
    fsynced, acknowledged data, and cutting it would delete every later segment too.  It keeps
    its bytes, and reads that reach the damage fail (``Segment.recover_keeping_damage``).
    """
    if trusted:
        try:
            segment.load()
            if ends_at is None or segment.next_offset == ends_at:
                return 0
            logger.warning("[%s] %s ends at offset %d, but the log was closed at %d: recovering it",
                           log_name, segment.path, segment.next_offset, ends_at)
        except IndexCorruptError as e:
            logger.warning("[%s] index check failed, rebuilding from the log: %s", log_name, e)
            if next_base is not None:
                if not segment.recover_keeping_damage(next_base):
                    logger.error("[%s] acknowledged data is damaged and stays unreadable: %s", log_name,
                                 segment.damage)
                return 0
    return segment.recover()


def _clean_directory(directory: str, log_name: str) -> list[int]:
    """Remove debris; the base offsets of the ``.log`` files, ascending."""
    logs: set[int] = set()
    indexes: list[tuple[int, str]] = []
    for name in os.listdir(directory):
        if name.endswith((TMP_SUFFIX, DELETED_SUFFIX)):
            logger.info("[%s] removing leftover %s", log_name, name)
            unlink_if_exists(os.path.join(directory, name))
            continue
        parsed = parse_segment_file_name(name)
        if parsed is None:
            continue
        base, suffix = parsed
        if suffix == LOG_SUFFIX:
            logs.add(base)
        elif suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            indexes.append((base, name))
    for base, name in indexes:
        if base not in logs:
            logger.warning("[%s] removing %s: its log file is missing", log_name, name)
            unlink_if_exists(os.path.join(directory, name))
    return sorted(logs)


def _delete_segment_files(directory: str, bases: list[int], log_name: str) -> None:
    """Unlink the segments at ``bases``, durably: were they to reappear after a power loss, new
    appends at the same offsets would collide with them."""
    for base in bases:
        logger.warning("[%s] deleting segment %s: it follows a truncated or discontinuous segment",
                       log_name, segment_file_name(base, LOG_SUFFIX))
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            unlink_if_exists(os.path.join(directory, segment_file_name(base, suffix)))
    if bases:
        fsync_dir(directory)
