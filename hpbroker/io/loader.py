"""Opening a partition directory: clean it, load or recover its segments, in offset order.

The rule: the recovery point says every batch below it reached the disk with its indexes.
Segments wholly below the segment that holds the recovery point are *trusted*: their indexes
are loaded and checked against the log (:meth:`Segment.load`), and rebuilt by a full scan if
the check fails.  From the segment holding the recovery point on, every segment is *recovered*:
scanned batch by batch (length, CRC, offsets contiguous), its indexes rebuilt.

Kafka truncates at the first bad byte, since a replica can restore the rest; a lone broker must
not, so only a *torn tail* is cut: bad bytes that run to the end of the **last** segment and
start at or past the recovery point (what a crash in the middle of a write leaves).  Everything
else is corruption of records that reached the disk, and is contained: the damaged bytes stay,
every valid batch after them stays readable (the scan resynchronises on the next valid batch,
``hpbroker.io.damage``), and the damaged offsets become a *damaged range*, logged as an ERROR
naming the file, positions and offsets.  In particular a segment that is not the last one was
fsynced when its successor began, so it is never cut; a segment missing from the middle of the
log is a *gap* (a damaged range without bytes), and no later segment is deleted.  The log end
never moves below the recovery point: when the last segment ends before it, or ends in damage
below it, appends go to a new segment starting at the recovery point, so no offset that was
acknowledged and reached the disk is ever handed out again.  Segments the ``damaged-segments``
file lists (``hpbroker.io.checkpoint``) are never trusted: their damaged ranges, which an index
rebuilt around them would hide from the cheap check, are found again by a full scan.

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
import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

from hpbroker.io.config import LogConfig
from hpbroker.io.damage import DamagedRange
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

__all__ = ["LoadedSegments", "load_segments", "reload_last_segment"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadedSegments:
    """What :func:`load_segments` found: the ``segments`` in offset order (the last one takes
    appends) and the ``gaps`` between them, offsets no segment holds, as damaged ranges."""

    segments: list[Segment]
    gaps: list[DamagedRange]


def load_segments(directory: str, config: LogConfig, recovery_point: int, *, now_ms: int,
                  log_name: str, clean_shutdown: bool = False,
                  damaged_bases: frozenset[int] | set[int] = frozenset()) -> LoadedSegments:
    """The segments of ``directory``, loaded or recovered (see the module docstring); a new
    empty segment if there are none.  ``clean_shutdown``: the log was closed cleanly and
    ``recovery_point`` is its end.  ``damaged_bases``: segments known to hold damaged ranges
    (``hpbroker.io.checkpoint.DamagedSegments``), never trusted: scanned in full, so their ranges
    are found again.  Raises OSError; closes what it opened then."""
    bases = _clean_directory(directory, log_name)
    segments: list[Segment] = []
    gaps: list[DamagedRange] = []
    with _closed_on_error(segments):
        if not bases and recovery_point > 0:
            logger.error("[%s] every segment is missing, but offsets below the recovery point %d were on "
                         "disk: the log starts again at %d", log_name, recovery_point, recovery_point)
        holding = len(bases) if clean_shutdown else max(0, bisect.bisect_right(bases, recovery_point) - 1)
        for i, base in enumerate(bases):
            segment = Segment(directory, base, config, create=False, now_ms=now_ms, log_name=log_name)
            segments.append(segment)
            last = i == len(bases) - 1
            _open_segment(segment, trusted=i < holding and base not in damaged_bases,
                          recovery_point=recovery_point,
                          next_base=None if last else bases[i + 1], clean_end=clean_shutdown and last,
                          log_name=log_name)
            if i:
                _check_continuity(segments[-2], segment, gaps, log_name)
        _end_at_or_past(directory, config, segments, gaps, recovery_point, now_ms=now_ms, log_name=log_name)
    return LoadedSegments(segments, gaps)


def reload_last_segment(directory: str, config: LogConfig, base_offset: int, recovery_point: int, *,
                        now_ms: int, log_name: str) -> LoadedSegments:
    """The last segment, at ``base_offset``, opened again and recovered in full from the disk
    as an open would (a torn tail past ``recovery_point`` cut, damage below it contained), and
    a new segment at ``recovery_point`` after it when it ends below it or in damage.  For a log
    that resumes writes after a failed one: its closed segments are unchanged and stay as they
    are.  The ``segments`` returned are the replacement for the last one; ``gaps``, what lies
    between them.  Raises OSError; closes what it opened then."""
    segments: list[Segment] = []
    gaps: list[DamagedRange] = []
    with _closed_on_error(segments):
        segment = Segment(directory, base_offset, config, create=False, now_ms=now_ms, log_name=log_name)
        segments.append(segment)
        segment.recover(recovery_point)
        _end_at_or_past(directory, config, segments, gaps, recovery_point, now_ms=now_ms, log_name=log_name)
    return LoadedSegments(segments, gaps)


@contextlib.contextmanager
def _closed_on_error(segments: list[Segment]) -> Iterator[None]:
    """Close every segment opened so far (``segments``, filled inside the block) when the block
    raises, then let the error go on: a failed load leaves no descriptor open."""
    try:
        yield
    except BaseException:
        for segment in segments:
            segment.close()
        raise


def _end_at_or_past(directory: str, config: LogConfig, segments: list[Segment], gaps: list[DamagedRange],
                    recovery_point: int, *, now_ms: int, log_name: str) -> None:
    """Append a new segment at ``recovery_point`` when there is none, or the last one is sealed
    or ends below it (reporting the offsets below it it lacks as a gap): the log end never moves
    below the recovery point."""
    last_end = segments[-1].next_offset if segments else 0
    if segments and not segments[-1].sealed and last_end >= recovery_point:
        return
    if segments and last_end < recovery_point:
        gaps.append(_gap(directory, last_end, recovery_point,
                         f"the log ends at offset {last_end}, below the recovery point "
                         f"{recovery_point}: records that were on disk are missing", log_name))
    segments.append(Segment(directory, max(last_end, recovery_point), config, create=True, now_ms=now_ms,
                            log_name=log_name))
    fsync_dir(directory)  # its records must not vanish with its directory entry


def _open_segment(segment: Segment, *, trusted: bool, recovery_point: int, next_base: int | None,
                  clean_end: bool, log_name: str) -> None:
    """Load a trusted segment (the last one of a clean shutdown must also end at
    ``recovery_point``), falling back to a full scan; scan the others in full.  A segment that
    is not the last one is never cut (``Segment.recover_closed``); the last one loses only a
    torn tail past ``recovery_point`` (``Segment.recover``)."""
    if trusted:
        try:
            segment.load()
            if not clean_end or segment.next_offset == recovery_point:
                return
            logger.warning("[%s] %s ends at offset %d, but the log was closed at %d: recovering it",
                           log_name, segment.path, segment.next_offset, recovery_point)
        except IndexCorruptError as e:
            logger.warning("[%s] index check failed, rebuilding from the log: %s", log_name, e)
    if next_base is not None:
        segment.recover_closed(next_base)
    else:
        segment.recover(recovery_point)


def _check_continuity(previous: Segment, segment: Segment, gaps: list[DamagedRange], log_name: str) -> None:
    """Report offsets between two segments that neither holds (a gap: a segment file is missing),
    or that both do (an overlap: the later segment serves them)."""
    if segment.base_offset > previous.next_offset:
        gaps.append(_gap(os.path.dirname(segment.path), previous.next_offset, segment.base_offset,
                         f"{os.path.basename(segment.path)} starts at offset {segment.base_offset} but its "
                         f"predecessor ends at {previous.next_offset}: a segment is missing", log_name))
    elif segment.base_offset < previous.next_offset:
        logger.error("[%s] %s starts at offset %d but its predecessor %s ends at %d: offsets [%d, %d) "
                     "are served from the later segment", log_name, segment.path, segment.base_offset,
                     previous.path, previous.next_offset, segment.base_offset, previous.next_offset)


def _gap(directory: str, first_offset: int, next_offset: int, reason: str, log_name: str) -> DamagedRange:
    gap = DamagedRange(os.path.join(directory, segment_file_name(first_offset, LOG_SUFFIX)), -1, -1,
                       first_offset, next_offset, reason)
    logger.error("[%s] damaged range: %s; %d offsets cannot be read, the segments after it are kept",
                 log_name, gap.describe(), gap.record_count)
    return gap


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
