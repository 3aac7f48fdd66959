"""Offline verification of partition directories: every byte of every segment, index and state
file checked against the formats, reading only (``hpbroker check``, ``hpbroker dump-log``).

Where recovery (``hpbroker.io.loader``) repairs what it can when a log is opened, this module
only reports, and reports everything, so that an operator can tell what the next open would cut
or rebuild, or where acknowledged data rotted:

- **batches** (:func:`walk_batches`): framing, CRC and every record (a deep scan, as appends are
  validated), each batch's base offset following its predecessor's last offset from the segment's
  base offset.  After a batch that fails but whose length field still frames it, the walk goes on
  at the next batch, so one flipped bit hides nothing after it; it stops only where no batch can
  be framed (a truncated or garbled tail);
- **segments**: each starts where the previous one ends (offsets contiguous across the log);
- **offset index**: whole, strictly increasing entries; a non-empty log's first entry at offset 0,
  position 0; every entry at the position of a batch whose base offset is the entry's;
- **time index**: whole, strictly increasing entries; each at an offset of the offset index, its
  timestamp the largest record timestamp of the segment up to that batch (the indexing rule of
  ``hpbroker.io.segment``);
- **state files**: the recovery-point checkpoint well formed and not past the log end; a
  clean-shutdown marker, if any, well formed and equal to the checkpoint and the log end.

Nothing here writes: files are opened read-only, and a partition whose ``.lock`` is held (a
running broker has the log open) is reported, not read.  Problems name the file, the byte
position in it and the offset concerned.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from hpbroker import _core
from hpbroker.errors import CorruptRecordError
from hpbroker.io.checkpoint import CHECKPOINT_VERSION
from hpbroker.io.files import (
    CHECKPOINT_FILE_NAME,
    CLEAN_SHUTDOWN_FILE_NAME,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOCK_FILE_NAME,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    TMP_SUFFIX,
    parse_segment_file_name,
    segment_file_name,
)
from hpbroker.io.index import (
    OFFSET_ENTRY_BYTES,
    TIME_ENTRY_BYTES,
    IndexCorruptError,
    parse_offset_index,
    parse_time_index,
)
from hpbroker.io.logfile import core_detail

__all__ = [
    "PartitionReport",
    "Problem",
    "SegmentBatch",
    "check_partition",
    "lock_holder",
    "walk_batches",
]

_MAX_STATE_FILE_BYTES = 64  # the checkpoint and the marker are two short lines


@dataclass(frozen=True, slots=True)
class Problem:
    """Something wrong in ``file`` (a name within the partition directory), at byte ``position``
    of it and about ``offset`` (-1: not applicable)."""

    file: str
    position: int
    offset: int
    message: str

    def __str__(self) -> str:
        where = [f"position {self.position}"] if self.position >= 0 else []
        where += [f"offset {self.offset}"] if self.offset >= 0 else []
        return f"{self.file}{' ' + ', '.join(where) if where else ''}: {self.message}"


@dataclass(slots=True)
class PartitionReport:
    """What :func:`check_partition` found in one partition directory."""

    name: str
    segments: int = 0
    batches: int = 0
    size_in_bytes: int = 0
    log_start_offset: int = -1
    log_end_offset: int = -1
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # unusual but harmless, e.g. debris

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True, slots=True)
class SegmentBatch:
    """One batch met by :func:`walk_batches`: where it is, the offsets and largest timestamp its
    header gives (-1 when it cannot be framed), and ``error``, None for a valid batch."""

    position: int
    size: int
    base_offset: int
    next_offset: int
    max_timestamp: int
    error: str | None = None


def walk_batches(data: bytes | mmap.mmap | memoryview, expected_offset: int = -1) -> Iterator[SegmentBatch]:
    """Every batch of a segment's bytes, valid or not (module docstring).  ``expected_offset``:
    the segment's base offset, or -1 not to check offsets.  A final entry with ``size`` -1 marks
    bytes where no batch can be framed; nothing follows it."""
    position, size = 0, len(data)
    while position < size:
        scan = _core.scan_batches(data, position, expected_offset=expected_offset, deep=True)
        for i in range(scan.batch_count):
            base = scan.base_offsets[i]
            yield SegmentBatch(scan.positions[i], scan.sizes[i], base, base + scan.last_offset_deltas[i] + 1,
                               scan.max_timestamps[i])
        if scan.error is None:
            return
        position += scan.valid_bytes
        error = core_detail(scan.error)
        try:
            header = _core.read_header(data, position)
        except CorruptRecordError:
            header = None
        if header is None or header.size <= 0 or position + header.size > size:
            yield SegmentBatch(position, -1, scan.next_offset, -1, -1, error)
            return
        yield SegmentBatch(position, header.size, header.base_offset, header.next_offset,
                           header.max_timestamp, error)
        position += header.size
        if expected_offset >= 0:
            expected_offset = header.next_offset


def lock_holder(directory: str) -> tuple[int, str | None]:
    """Take ``directory``'s ``.lock`` (the one a broker or an open log holds) without creating or
    writing it: ``(fd, None)`` when taken (close the fd to release it; -1 when there is no lock
    file), ``(-1, holder pid)`` when another process holds it."""
    path = os.path.join(directory, LOCK_FILE_NAME)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return -1, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        return -1, holder
    return fd, None


def check_partition(directory: str, *, name: str | None = None, ignore_lock: bool = False) -> PartitionReport:
    """Verify one partition directory, reading only (module docstring)."""
    report = PartitionReport(name or os.path.basename(os.path.normpath(directory)))
    fd, holder = lock_holder(directory) if not ignore_lock else (-1, None)
    if holder is not None:
        report.problems.append(Problem(LOCK_FILE_NAME, -1, -1, f"the log is open in process {holder}: "
                                                               f"not checked (stop the broker first)"))
        return report
    try:
        bases = _segment_bases(directory, report)
        expected = -1
        for base in bases:
            if expected >= 0 and base != expected:
                how = "a gap" if base > expected else "an overlap"
                report.problems.append(Problem(segment_file_name(base, LOG_SUFFIX), -1, base,
                                               f"{how}: the previous segment ends at offset {expected}"))
            expected = _check_segment(directory, base, report)
        if bases:
            report.log_start_offset, report.log_end_offset = bases[0], expected
        else:
            report.notes.append("no segments (the next open creates an empty one)")
        _check_state_files(directory, report)
    finally:
        if fd >= 0:
            os.close(fd)
    return report


def _segment_bases(directory: str, report: PartitionReport) -> list[int]:
    logs, indexes = set(), []
    for entry in sorted(os.listdir(directory)):
        if entry.endswith((TMP_SUFFIX, DELETED_SUFFIX)):
            report.notes.append(f"leftover {entry} (removed at the next open)")
            continue
        parsed = parse_segment_file_name(entry)
        if parsed is None:
            continue
        if parsed[1] == LOG_SUFFIX:
            logs.add(parsed[0])
        elif parsed[1] in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            indexes.append(parsed)
    for base, suffix in indexes:
        if base not in logs:
            report.notes.append(f"{segment_file_name(base, suffix)} has no .log (removed at the next open)")
    return sorted(logs)


def _check_segment(directory: str, base: int, report: PartitionReport) -> int:
    """Check one segment's ``.log`` and indexes; returns the offset after its last batch (what
    the next segment must start at)."""
    log_name = segment_file_name(base, LOG_SUFFIX)
    report.segments += 1
    batches: dict[int, SegmentBatch] = {}  # by position: the batches that can be framed
    max_so_far: dict[int, int] = {}  # base offset -> largest timestamp up to that batch
    next_offset, largest = base, -1
    with open(os.path.join(directory, log_name), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        report.size_in_bytes += size
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        try:
            for batch in walk_batches(data, base):
                if batch.error is not None:
                    report.problems.append(Problem(log_name, batch.position, batch.base_offset, batch.error))
                if batch.size < 0:
                    break
                report.batches += 1
                largest = max(largest, batch.max_timestamp)
                batches[batch.position] = batch
                max_so_far[batch.base_offset] = largest
                next_offset = batch.next_offset
        finally:
            if isinstance(data, mmap.mmap):
                data.close()
    indexed = _check_offset_index(directory, base, batches, report)
    _check_time_index(directory, base, indexed, max_so_far, report)
    return next_offset


def _read_index(directory: str, base: int, suffix: str, report: PartitionReport) -> bytes | None:
    name = segment_file_name(base, suffix)
    try:
        with open(os.path.join(directory, name), "rb") as f:
            return f.read()
    except FileNotFoundError:
        report.problems.append(Problem(name, -1, -1, "missing (rebuilt from the log at the next open)"))
        return None


def _check_offset_index(directory: str, base: int, batches: dict[int, SegmentBatch],
                        report: PartitionReport) -> set[int]:
    """Problems of the ``.index``; returns the relative offsets it holds."""
    name = segment_file_name(base, INDEX_SUFFIX)
    data = _read_index(directory, base, INDEX_SUFFIX, report)
    if data is None:
        return set()
    try:
        relative_offsets, positions = parse_offset_index(data, name)
    except IndexCorruptError as e:
        report.problems.append(Problem(name, -1, -1, str(e).partition(": ")[2]))
        return set()
    if batches and (not positions or positions[0] != 0 or relative_offsets[0] != 0):
        report.problems.append(Problem(name, 0, base, "does not start with offset 0 at position 0"))
    for i, (relative, position) in enumerate(zip(relative_offsets, positions, strict=True)):
        batch = batches.get(position)
        if batch is None:
            message = f"entry {i} points at position {position} of the .log, where no batch starts"
        elif batch.base_offset != base + relative:
            message = (f"entry {i} says offset {base + relative} at position {position} of the .log, "
                       f"the batch there has base offset {batch.base_offset}")
        else:
            continue
        report.problems.append(Problem(name, i * OFFSET_ENTRY_BYTES, base + relative, message))
    return set(relative_offsets)


def _check_time_index(directory: str, base: int, indexed: set[int], max_so_far: dict[int, int],
                      report: PartitionReport) -> None:
    name = segment_file_name(base, TIME_INDEX_SUFFIX)
    data = _read_index(directory, base, TIME_INDEX_SUFFIX, report)
    if data is None:
        return
    try:
        timestamps, relative_offsets = parse_time_index(data, name)
    except IndexCorruptError as e:
        report.problems.append(Problem(name, -1, -1, str(e).partition(": ")[2]))
        return
    for i, (timestamp, relative) in enumerate(zip(timestamps, relative_offsets, strict=True)):
        offset = base + relative
        if relative not in indexed:
            message = f"entry {i} names offset {offset}, which has no offset index entry"
        elif max_so_far.get(offset, timestamp) != timestamp:
            message = (f"entry {i} says timestamp {timestamp} at offset {offset}, the largest timestamp "
                       f"of the segment up to that batch is {max_so_far[offset]}")
        else:
            continue
        report.problems.append(Problem(name, i * TIME_ENTRY_BYTES, offset, message))


def _read_state_file(directory: str, file_name: str, report: PartitionReport) -> int | None:
    """The offset a checkpoint-format file holds; None when absent; -1 (a problem recorded) when
    malformed."""
    try:
        with open(os.path.join(directory, file_name), "rb") as f:
            content = f.read(_MAX_STATE_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    lines = content.split(b"\n")
    if len(content) > _MAX_STATE_FILE_BYTES or len(lines) != 3 or lines[2] \
            or lines[0] != str(CHECKPOINT_VERSION).encode() or not lines[1].isdigit():
        report.problems.append(Problem(file_name, 0, -1, f"malformed: {content[:_MAX_STATE_FILE_BYTES]!r}"))
        return -1
    return int(lines[1])


def _check_state_files(directory: str, report: PartitionReport) -> None:
    checkpoint = _read_state_file(directory, CHECKPOINT_FILE_NAME, report)
    end = report.log_end_offset
    if checkpoint is None:
        report.notes.append("no recovery-point checkpoint (the next open scans every segment)")
    elif checkpoint >= 0 and end >= 0 and checkpoint > end:
        report.problems.append(Problem(CHECKPOINT_FILE_NAME, -1, checkpoint,
                                       f"the recovery point is past the log end offset {end}: records "
                                       f"that were on disk are missing"))
    marker = _read_state_file(directory, CLEAN_SHUTDOWN_FILE_NAME, report)
    if marker is None:
        report.notes.append("not closed cleanly (no clean-shutdown marker): the next open recovers "
                            "from the checkpoint")
    elif marker >= 0 and (marker != checkpoint or marker != end):
        report.problems.append(Problem(CLEAN_SHUTDOWN_FILE_NAME, -1, marker,
                                       f"says the log was closed at offset {marker}, but the checkpoint "
                                       f"says {checkpoint} and the log ends at {end}"))
