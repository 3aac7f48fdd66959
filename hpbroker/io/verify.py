"""Offline verification of partition directories: every byte of every segment, index and state
file checked against the formats, reading only (``hpbroker check``, ``hpbroker dump-log``).

Where recovery (``hpbroker.io.loader``) repairs what it can when a log is opened, this module
only reports, and reports everything, so that an operator can tell what the next open would cut
or rebuild, or where acknowledged data rotted:

- **batches** (:func:`walk_batches`): framing, CRC and every record (a deep scan, as appends are
  validated), each batch's base offset following its predecessor's last offset from the segment's
  base offset.  After a batch that fails but whose length field still frames it, the walk goes on
  at the next batch, expecting the offset after the failed batch's span from where it should
  have started, so one flipped bit hides nothing after it and makes nothing after it look wrong;
  where no batch can be framed (garbled bytes, a length field hit), it resynchronises as recovery
  does (``hpbroker.io.damage``: the next position holding a whole batch whose CRC matches and
  whose offset can follow) and goes on from there; only bytes after which no valid batch follows
  end the walk (a truncated or garbled tail);
- **segments**: each starts where the previous one ends (offsets contiguous across the log);
- **offset index**: whole, strictly increasing entries; a non-empty log's first entry at offset 0,
  position 0; every entry at the position of a batch whose base offset is the entry's;
- **time index**: whole, strictly increasing entries; each at an offset of the offset index, its
  timestamp the largest record timestamp of the segment up to that batch (the indexing rule of
  ``hpbroker.io.segment``; after a batch whose bytes fail, whose timestamps are unknown, only
  "at least");
- **state files**: the recovery-point checkpoint well formed and not past the log end; a
  clean-shutdown marker, if any, well formed and equal to the checkpoint and the log end;
  each producer state snapshot (``hpbroker.io.producer_state``) well formed, its batches below
  its offset.  A snapshot is a cache of what the batch headers say, so a bad one, or one past the
  log end, is a note: the next open removes it and rebuilds the state from the log.

What a crash leaves is not damage, and is reported as a note: without a valid clean-shutdown
marker (none, or one cut short by a crash while closing: ``hpbroker.io.checkpoint``), the last
segment is recovered at the next open, so a **torn tail** there (bad batches up to the end of the
file, none valid after them: half a batch, a zero-filled tail), at or after the recovery point,
is what that open truncates; index entries past the valid end are dropped as it rebuilds the
indexes.  The same bytes after a clean shutdown, or before the recovery point (records that were
on disk), are problems.

Nothing here writes: files are opened read-only, and a partition whose ``.lock`` is held (a
running broker has the log open) is reported, not read.  Problems name the file, the byte
position in it and the offset concerned.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from hpbroker import _core
from hpbroker.errors import CorruptRecordError
from hpbroker.io.checkpoint import CHECKPOINT_VERSION
from hpbroker.io.damage import find_next_batch
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
from hpbroker.io.producer_state import (
    SnapshotCorruptError,
    decode_snapshot,
    list_snapshots,
    snapshot_file_name,
)

__all__ = [
    "PartitionReport",
    "Problem",
    "SegmentBatch",
    "check_partition",
    "lock_holder",
    "walk_batches",
]

_MAX_STATE_FILE_BYTES = 64  # the checkpoint and the marker are two short lines
_NO_UPPER_OFFSET = 2**63 - 1  # resynchronising accepts any base offset from the expected one on


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
    """One batch met by :func:`walk_batches`: where it is, the base offset and largest timestamp
    its header gives (-1 when it cannot be framed), ``next_offset`` where its successor must start,
    and ``error``, None for a valid batch.  For a batch that fails, ``next_offset`` is the offset
    the batch should have started at plus its span (its header's ``last_offset_delta`` + 1), and
    ``intact`` says whether its bytes check out apart from the offset (CRC, records): only then can
    its timestamps be trusted."""

    position: int
    size: int
    base_offset: int
    next_offset: int
    max_timestamp: int
    error: str | None = None
    intact: bool = True


def walk_batches(data: bytes | mmap.mmap | memoryview, expected_offset: int = -1) -> Iterator[SegmentBatch]:
    """Every batch of a segment's bytes, valid or not (module docstring).  ``expected_offset``:
    the segment's base offset, or -1 not to check offsets.  Bytes where no batch can be framed are
    one entry, up to the next valid batch (its ``next_offset`` that batch's base offset); a final
    entry with ``size`` -1 marks such bytes when no valid batch follows them."""
    position, size = 0, len(data)

    def read(at: int, length: int) -> bytes:
        return bytes(data[at : at + length])

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
            found = find_next_batch(read, position, size, max(scan.next_offset, 0), _NO_UPPER_OFFSET)
            if found is None:
                yield SegmentBatch(position, -1, scan.next_offset, -1, -1, error, intact=False)
                return
            at, next_header = found
            yield SegmentBatch(position, at - position, scan.next_offset, next_header.base_offset, -1,
                               f"{error} (resynchronised at position {at}, offset {next_header.base_offset})",
                               intact=False)
            position = at
            if expected_offset >= 0:
                expected_offset = next_header.base_offset
            continue
        alone = _core.scan_batches(data[position : position + header.size], deep=True)
        span = header.next_offset - header.base_offset
        next_offset = scan.next_offset + span if expected_offset >= 0 else header.next_offset
        yield SegmentBatch(position, header.size, header.base_offset, next_offset, header.max_timestamp,
                           error, intact=alone.error is None and alone.batch_count == 1)
        position += header.size
        if expected_offset >= 0:
            expected_offset = next_offset


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
        checkpoint = _read_state_file(directory, CHECKPOINT_FILE_NAME)
        marker = _read_state_file(directory, CLEAN_SHUTDOWN_FILE_NAME)
        clean = marker.offset is not None and marker.offset == checkpoint.offset
        bases = _segment_bases(directory, report)
        expected = -1
        for i, base in enumerate(bases):
            if expected >= 0 and base != expected:
                how = "a gap" if base > expected else "an overlap"
                report.problems.append(Problem(segment_file_name(base, LOG_SUFFIX), -1, base,
                                               f"{how}: the previous segment ends at offset {expected}"))
            # Without a clean shutdown the next open recovers the last segment from the recovery point.
            recovered_from = None if clean or i < len(bases) - 1 else (checkpoint.offset or 0)
            expected = _check_segment(directory, base, report, recovered_from)
        if bases:
            report.log_start_offset, report.log_end_offset = bases[0], expected
        else:
            report.notes.append("no segments (the next open creates an empty one)")
        _check_state_files(report, checkpoint, marker)
        _check_snapshots(directory, report)
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


@dataclass(slots=True)
class _SegmentScan:
    """What the walk over one ``.log`` found, for the index checks."""

    next_offset: int  # the offset after its last batch that can be framed
    starts: dict[int, int] = field(default_factory=dict)  # position -> offset of the batch there
    # offset -> (largest timestamp of the segment up to that batch, exact: no batch before it failed)
    max_so_far: dict[int, tuple[int, bool]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    valid_end: int = -1  # position where a torn tail starts, -1 when there is none
    valid_batches: int = 0  # batches that passed every check
    torn_index_entries: int = 0  # index entries at or after it


def _check_segment(directory: str, base: int, report: PartitionReport, recovered_from: int | None) -> int:
    """Check one segment's ``.log`` and indexes; returns the offset after its last batch (what
    the next segment must start at).  ``recovered_from``: the next open recovers this segment
    from that offset on (it is the last one, not closed cleanly), so a torn tail from there on is
    a note; None: it is not."""
    log_name = segment_file_name(base, LOG_SUFFIX)
    report.segments += 1
    with open(os.path.join(directory, log_name), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        report.size_in_bytes += size
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        try:
            scan = _scan_segment(data, base, log_name)
        finally:
            if isinstance(data, mmap.mmap):
                data.close()
    torn = next((i for i, problem in enumerate(scan.problems) if problem.position >= scan.valid_end), None)
    if scan.valid_end >= 0 and recovered_from is not None and torn is not None \
            and scan.problems[torn].offset >= recovered_from:
        first = scan.problems[torn]
        report.notes.append(f"{log_name}: a torn tail (not closed cleanly): the next open truncates "
                            f"{size - scan.valid_end} bytes at position {scan.valid_end}, offset "
                            f"{first.offset} on ({first.message})")
        del scan.problems[torn:]
        scan.next_offset = first.offset
    else:
        scan.valid_end = -1
    report.problems += scan.problems
    report.batches += scan.valid_batches
    indexed = _check_offset_index(directory, base, scan, report)
    _check_time_index(directory, base, indexed, scan, report)
    if scan.torn_index_entries:
        report.notes.append(f"{segment_file_name(base, INDEX_SUFFIX)} and .timeindex: "
                            f"{scan.torn_index_entries} entries past the valid end (dropped when the next "
                            f"open rebuilds them)")
    return scan.next_offset


def _scan_segment(data: bytes | mmap.mmap, base: int, log_name: str) -> _SegmentScan:
    """Walk the batches; ``valid_end`` is set where a run of bad batches that lasts to the end
    of the file starts (whether that is a torn tail is for the caller to say)."""
    scan = _SegmentScan(base)
    largest, exact = -1, True
    for batch in walk_batches(data, base):
        offset = scan.next_offset  # the batch's, unless its header is wrong
        if batch.error is None:
            scan.valid_end = -1
            scan.valid_batches += 1
        else:
            scan.problems.append(Problem(log_name, batch.position, offset, batch.error))
            if scan.valid_end < 0:
                scan.valid_end = batch.position
        if batch.size < 0:
            break
        if batch.intact:
            largest = max(largest, batch.max_timestamp)
        else:
            exact = False
        scan.starts[batch.position] = offset
        scan.max_so_far[offset] = (largest, exact)
        scan.next_offset = batch.next_offset
    return scan


def _read_index(directory: str, base: int, suffix: str, report: PartitionReport) -> bytes | None:
    name = segment_file_name(base, suffix)
    try:
        with open(os.path.join(directory, name), "rb") as f:
            return f.read()
    except FileNotFoundError:
        report.problems.append(Problem(name, -1, -1, "missing (rebuilt from the log at the next open)"))
        return None


def _check_offset_index(directory: str, base: int, scan: _SegmentScan, report: PartitionReport) -> set[int]:
    """Problems of the ``.index``; returns the relative offsets it holds."""
    name = segment_file_name(base, INDEX_SUFFIX)
    data = _read_index(directory, base, INDEX_SUFFIX, report)
    if data is None:
        return set()
    if scan.valid_end >= 0:
        data = data[: len(data) - len(data) % OFFSET_ENTRY_BYTES]  # a torn last entry
    try:
        relative_offsets, positions = parse_offset_index(data, name)
    except IndexCorruptError as e:
        report.problems.append(Problem(name, -1, -1, str(e).partition(": ")[2]))
        return set()
    if scan.starts and (not positions or positions[0] != 0 or relative_offsets[0] != 0):
        report.problems.append(Problem(name, 0, base, "does not start with offset 0 at position 0"))
    for i, (relative, position) in enumerate(zip(relative_offsets, positions, strict=True)):
        offset = scan.starts.get(position)
        if 0 <= scan.valid_end <= position:
            scan.torn_index_entries += 1
            continue
        if offset is None:
            message = f"entry {i} points at position {position} of the .log, where no batch starts"
        elif offset != base + relative:
            message = (f"entry {i} says offset {base + relative} at position {position} of the .log, "
                       f"the batch there has base offset {offset}")
        else:
            continue
        report.problems.append(Problem(name, i * OFFSET_ENTRY_BYTES, base + relative, message))
    return set(relative_offsets)


def _check_time_index(directory: str, base: int, indexed: set[int], scan: _SegmentScan,
                      report: PartitionReport) -> None:
    name = segment_file_name(base, TIME_INDEX_SUFFIX)
    data = _read_index(directory, base, TIME_INDEX_SUFFIX, report)
    if data is None:
        return
    if scan.valid_end >= 0:
        data = data[: len(data) - len(data) % TIME_ENTRY_BYTES]
    try:
        timestamps, relative_offsets = parse_time_index(data, name)
    except IndexCorruptError as e:
        report.problems.append(Problem(name, -1, -1, str(e).partition(": ")[2]))
        return
    for i, (timestamp, relative) in enumerate(zip(timestamps, relative_offsets, strict=True)):
        offset = base + relative
        largest, exact = scan.max_so_far.get(offset, (timestamp, True))
        if scan.valid_end >= 0 and offset >= scan.next_offset:
            scan.torn_index_entries += 1
            continue
        if relative not in indexed:
            message = f"entry {i} names offset {offset}, which has no offset index entry"
        elif timestamp != largest and (exact or timestamp < largest):
            message = (f"entry {i} says timestamp {timestamp} at offset {offset}, the largest timestamp "
                       f"of the segment up to that batch is {'' if exact else 'at least '}{largest}")
        else:
            continue
        report.problems.append(Problem(name, i * TIME_ENTRY_BYTES, offset, message))


@dataclass(frozen=True, slots=True)
class _StateFile:
    """A checkpoint-format file as read: ``offset`` None when absent or malformed."""

    name: str
    present: bool = False
    content: bytes = b""
    offset: int | None = None

    @property
    def torn(self) -> bool:
        """Malformed as only a crash while writing it leaves it: empty, or cut short."""
        return self.present and self.offset is None and _TORN_STATE_FILE.fullmatch(self.content) is not None


# A prefix of "<version>\n<offset>\n": what a crash while writing a state file may leave.
_TORN_STATE_FILE = re.compile(rb"(%d(\n([0-9]+)?)?)?" % CHECKPOINT_VERSION)


def _read_state_file(directory: str, file_name: str) -> _StateFile:
    try:
        with open(os.path.join(directory, file_name), "rb") as f:
            content = f.read(_MAX_STATE_FILE_BYTES + 1)
    except FileNotFoundError:
        return _StateFile(file_name)
    lines = content.split(b"\n")
    if len(content) > _MAX_STATE_FILE_BYTES or len(lines) != 3 or lines[2] \
            or lines[0] != str(CHECKPOINT_VERSION).encode() or not lines[1].isdigit():
        return _StateFile(file_name, True, content)
    return _StateFile(file_name, True, content, int(lines[1]))


def _check_state_files(report: PartitionReport, checkpoint: _StateFile, marker: _StateFile) -> None:
    end = report.log_end_offset
    if not checkpoint.present:
        report.notes.append("no recovery-point checkpoint (the next open scans every segment)")
    elif checkpoint.offset is None:
        report.problems.append(Problem(checkpoint.name, 0, -1,
                                       f"malformed: {checkpoint.content[:_MAX_STATE_FILE_BYTES]!r}"))
    elif end >= 0 and checkpoint.offset > end:
        report.problems.append(Problem(checkpoint.name, -1, checkpoint.offset,
                                       f"the recovery point is past the log end offset {end}: records "
                                       f"that were on disk are missing"))
    if not marker.present:
        report.notes.append("not closed cleanly (no clean-shutdown marker): the next open recovers "
                            "from the checkpoint")
    elif marker.torn:
        report.notes.append(f"not closed cleanly (the clean-shutdown marker was cut short while closing: "
                            f"{marker.content!r}): the next open ignores it and recovers from the checkpoint")
    elif marker.offset is None:
        report.problems.append(Problem(marker.name, 0, -1,
                                       f"malformed: {marker.content[:_MAX_STATE_FILE_BYTES]!r}"))
    elif marker.offset != checkpoint.offset or marker.offset != end:
        report.problems.append(Problem(marker.name, -1, marker.offset,
                                       f"says the log was closed at offset {marker.offset}, but the "
                                       f"checkpoint says {checkpoint.offset} and the log ends at {end}"))


def _check_snapshots(directory: str, report: PartitionReport) -> None:
    """Notes for producer state snapshots the next open removes (module docstring)."""
    end = report.log_end_offset
    for offset in list_snapshots(directory):
        name = snapshot_file_name(offset)
        if offset < report.log_start_offset:
            report.notes.append(f"{name}: a producer state snapshot below the log start offset "
                                f"{report.log_start_offset}: the next open removes it")
            continue
        try:
            with open(os.path.join(directory, name), "rb") as f:
                decode_snapshot(f.read(), offset)
        except OSError as e:
            report.notes.append(f"{name}: a producer state snapshot that cannot be read ({e}): the next "
                                f"open rebuilds the state without it")
            continue
        except SnapshotCorruptError as e:
            report.notes.append(f"{name}: a producer state snapshot that does not parse ({e}): the next "
                                f"open removes it and rebuilds the state from the log")
            continue
        if end >= 0 and offset > end:
            report.notes.append(f"{name}: a producer state snapshot past the log end offset {end}: the "
                                f"next open removes it")
