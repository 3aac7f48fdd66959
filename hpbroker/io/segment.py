"""One segment of a partition log: a ``.log`` file plus its ``.index`` and ``.timeindex``.

Files: ``<base_offset:020d>.log``, ``.index``, ``.timeindex`` (formats in ``hpbroker.io.logfile``
and ``hpbroker.io.index``).  The first batch of a segment has ``base_offset``; offsets inside a
segment are contiguous, except across a *damaged range* (``hpbroker.io.damage``): bytes that
failed their checks between valid batches, or at the end of a segment that reached the disk.
Damaged ranges are found by a full scan (recovery at open, or a rebuild when an index disagrees
with the log), kept in :attr:`Segment.damaged` and never cut; reads serve the valid batches
around them and raise DamagedRangeError for offsets inside them.

The indexing rule, the only one (appending and rebuilding both go through
:meth:`Segment._index_batches`, so a rebuilt index is byte-for-byte the index built while
appending): a batch gets an offset index entry when it is the segment's first batch, or when it
starts at least ``index_interval_bytes`` after the position of the previous entry, or when it is the
first valid batch after a damaged range (so that a lookup never walks across damage).  Whenever an
offset index entry is added, a time index entry ``(largest timestamp of the segment up to and
including this batch, relative offset)`` is added too if that timestamp is larger than the last
time index entry's.  Hence a non-empty segment's indexes both start at relative offset 0, and
every time index entry's offset has an offset index entry.

Invariants: ``next_offset``, ``max_timestamp`` and the in-memory index entries describe exactly
the first ``size_in_bytes`` bytes of the ``.log``.  Single writer: the partition log that owns the
segment; any method may raise ``OSError``, which the partition log handles.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from hpbroker import _core
from hpbroker.errors import CorruptRecordError, DamagedRangeError, HPBrokerError
from hpbroker.io.config import LogConfig
from hpbroker.io.damage import DamagedRange, find_next_batch
from hpbroker.io.files import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    pread_full,
    segment_file_name,
    unlink_if_exists,
)
from hpbroker.io.index import IndexCorruptError, OffsetIndex, TimeIndex
from hpbroker.io.logfile import FileSlice, LogFile, core_detail

__all__ = ["PendingBatch", "Segment"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class PendingBatch:
    """An appended batch waiting for the next flush: ``head`` is its first ``STAMP_BYTES`` bytes,
    stamped with the offset the log assigned, ``body`` a view of the rest in the producer's buffer
    (held, not copied, until the flush)."""

    base_offset: int
    next_offset: int
    max_timestamp: int
    size: int
    head: bytearray
    body: memoryview


@dataclass(frozen=True, slots=True)
class _DamagedTail:
    """Bad bytes from ``position`` to the end of a scan, where offset ``expected_offset`` was due."""

    position: int
    expected_offset: int
    reason: str


# No valid batch of the last segment can have a base offset this large (a bound for resyncing).
_NO_UPPER_OFFSET = 2**63 - 1

# The prefix a flush writes from a stamped copy: base_offset, batch_length and leader_epoch, the
# fields stamp_batch writes (outside the CRC); the rest of the batch goes out from the producer's buffer.
STAMP_BYTES = _core.LEADER_EPOCH_POSITION + 4


class Segment:
    """A ``.log`` file and its two indexes (see the module docstring)."""

    def __init__(self, directory: str, base_offset: int, config: LogConfig, *, create: bool, now_ms: int,
                 log_name: str = "") -> None:
        """Open the segment's files (``create``: make them, refusing an existing ``.log``).  The
        indexes start empty in memory: call :meth:`load` or :meth:`recover` next, or nothing
        for a created segment."""
        self.base_offset = base_offset
        self.created_ms = now_ms
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.first_batch_timestamp = -1
        self.damaged: list[DamagedRange] = []  # by position; found by recovery or a rebuild
        self.sealed = False  # ends in damaged bytes: the log appends to a new segment instead
        self._index_interval = config.index_interval_bytes
        self._name = log_name
        path = os.path.join(directory, segment_file_name(base_offset, ""))
        self.log = LogFile(path + LOG_SUFFIX, create=create)
        try:
            self.offset_index = OffsetIndex(path + INDEX_SUFFIX)
            self.time_index = TimeIndex(path + TIME_INDEX_SUFFIX)
            if create:
                self.offset_index.rewrite_if_changed()
                self.time_index.rewrite_if_changed()
        except BaseException:
            self.close()
            if create:  # a segment half made (a full disk): no file of it may block the next try
                for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                    unlink_if_exists(path + suffix)
            raise

    def __repr__(self) -> str:
        return (f"Segment(base_offset={self.base_offset}, next_offset={self.next_offset}, "
                f"size_in_bytes={self.size_in_bytes}, max_timestamp={self.max_timestamp})")

    @property
    def path(self) -> str:
        return self.log.path

    @property
    def size_in_bytes(self) -> int:
        return self.log.size

    # --- the indexing rule -------------------------------------------------------------------

    def _index_batches(self, bias: int, positions: Sequence[int], base_offsets: Sequence[int],
                       max_timestamps: Sequence[int], first: int = 0, *, force_first: bool = False) -> None:
        """Apply the indexing rule to batches ``first..`` (positions are ``bias`` + ``positions[i]``),
        in file order, right after the batches already indexed.  ``force_first``: batch ``first``
        follows a damaged range and gets an entry whatever the interval.  Costs O(entries), not
        O(batches)."""
        oi, ti = self.offset_index, self.time_index
        i, n = first, len(positions)
        while i < n:
            if len(oi) and not force_first:
                j = bisect.bisect_left(positions, oi.positions[-1] + self._index_interval - bias, i)
            else:
                j = i
                if not len(oi):
                    self.first_batch_timestamp = max_timestamps[i]
            force_first = False
            if j >= n:
                break
            self.max_timestamp = max(self.max_timestamp, max(max_timestamps[i : j + 1]))
            relative_offset = base_offsets[j] - self.base_offset
            oi.append(relative_offset, positions[j] + bias)
            if not len(ti) or self.max_timestamp > ti.timestamps[-1]:
                ti.append(self.max_timestamp, relative_offset)
            i = j + 1
        if i < n:
            self.max_timestamp = max(self.max_timestamp, max(max_timestamps[i:n]))

    # --- writing -----------------------------------------------------------------------------

    # Appending is two halves, so that a flusher thread can do the I/O (and the fdatasync between
    # them) while the owner goes on: a write job of buffers(), then commit() on the owner's thread.

    @staticmethod
    def buffers(batches: Sequence[PendingBatch]) -> list[bytearray | memoryview]:
        """What a flush writes for ``batches``, in order: each one's stamped head, then its body."""
        buffers: list[bytearray | memoryview] = []
        for batch in batches:
            buffers.append(batch.head)
            buffers.append(batch.body)
        return buffers

    def commit(self, batches: Sequence[PendingBatch], written: int) -> None:
        """On the owner's thread once the write job of :meth:`buffers` is done: the ``.log`` grew
        by ``written`` bytes holding ``batches``; index them in memory (index files are written
        by :meth:`write_index_entries`)."""
        position = self.log.size
        positions = []
        for batch in batches:
            positions.append(position)
            position += batch.size
        if position - self.log.size != written:
            raise OSError(f"{self.path}: wrote {written} bytes for batches of {position - self.log.size}")
        self.log.grew(written)
        base_offsets = [batch.base_offset for batch in batches]
        self._index_batches(0, positions, base_offsets, [batch.max_timestamp for batch in batches])
        self.next_offset = batches[-1].next_offset

    def write_index_entries(self) -> None:
        """Write new index entries to their files (visible to other processes; not fsynced)."""
        self.offset_index.write_out()
        self.time_index.write_out()

    def release_index_files(self) -> None:
        """Close the descriptors of both index files once synced, for a segment that takes no
        more appends: its entries live in memory, so a closed segment holds one descriptor (its
        ``.log``, for sendfile) instead of three; an index file is opened again only if it must
        be rewritten."""
        self.offset_index.release()
        self.time_index.release()

    def sync(self) -> int | None:
        """fdatasync the ``.log`` and both indexes (each only if it changed); the nanoseconds the
        ``.log``'s fdatasync took, None when it had nothing to sync."""
        log_sync_ns = self.log.sync()
        self.offset_index.sync()
        self.time_index.sync()
        return log_sync_ns

    # --- opening: trust the indexes, or rebuild them from the log -----------------------------

    def load(self) -> None:
        """Take the index files as they are, after checking them against the log.

        Checks: whole, strictly increasing entries; a non-empty log's indexes start at offset 0,
        position 0; every time index entry has an offset index entry; the batch at the last
        entry's position has the entry's offset; no batch from the one the last *time* index
        entry names up to the last offset index entry has a larger timestamp than that entry
        (else the time index lost entries at its end, and ``max_timestamp`` would be too low:
        their headers are walked, records not read); and the batches after the last offset
        index entry scan cleanly to the end of the file (which also yields ``next_offset``).
        IndexCorruptError otherwise: the caller then falls back to :meth:`recover`.  Reads index
        files, batch headers and the tail, not the whole log (unless its batches are small and
        its largest timestamp was reached early: then their headers fill the whole file).
        """
        oi, ti = self.offset_index, self.time_index
        oi.load()
        ti.load()
        size = self.log.size
        if size == 0:
            if len(oi) or len(ti):
                raise IndexCorruptError(f"{oi.path}: entries for an empty log")
            return
        self._check_loaded_entries(size)
        self._check_time_index_end()
        last_position, last_offset = oi.positions[-1], self.base_offset + oi.relative_offsets[-1]
        self.max_timestamp = ti.timestamps[-1]

        def index_tail(chunk_position: int, result: _core.ScanResult) -> None:
            # The tail starts with the last indexed batch: already counted, skip it.
            first = 1 if chunk_position == last_position else 0
            self._index_batches(chunk_position, result.positions, result.base_offsets, result.max_timestamps,
                                first)

        outcome = self.log.scan(last_position, last_offset, index_tail)
        if outcome.stop_reason is not None or outcome.valid_end != size:
            raise IndexCorruptError(f"{self.path}: after the last index entry: {outcome.stop_reason}")
        self.next_offset = outcome.next_offset
        self.write_index_entries()  # entries the tail was missing, if any

    def _check_time_index_end(self) -> None:
        """IndexCorruptError unless the batches from the last time index entry's to the last
        offset index entry's (both included) have no timestamp above the last time index entry's."""
        oi, ti = self.offset_index, self.time_index
        last_time, last_position = ti.timestamps[-1], oi.positions[-1]
        start = position = oi.positions[oi.find(ti.relative_offsets[-1])]
        try:
            for position, header in self.log.headers(start, self.log.size):
                if header.max_timestamp > last_time:
                    raise IndexCorruptError(
                        f"{ti.path}: ends at timestamp {last_time}, but the batch at position {position} "
                        f"of {self.path}, before the last offset index entry, has {header.max_timestamp}: "
                        f"entries are missing at its end"
                    )
                if position >= last_position:
                    break
        except HPBrokerError as e:
            raise IndexCorruptError(f"{self.path}: walking the headers the time index covers: {e}") from e
        if position != last_position:
            raise IndexCorruptError(f"{oi.path}: its last entry, position {last_position}, is not a batch")

    def _check_loaded_entries(self, size: int) -> None:
        """The checks of :meth:`load` that read at most two batch headers."""
        oi, ti = self.offset_index, self.time_index
        if not len(oi) or oi.relative_offsets[0] != 0 or oi.positions[0] != 0:
            raise IndexCorruptError(f"{oi.path}: does not start with relative offset 0 at position 0")
        if not len(ti) or ti.relative_offsets[0] != 0 or any(oi.find(r) < 0 for r in ti.relative_offsets):
            raise IndexCorruptError(f"{ti.path}: its offsets are not offset index entries")
        last_position, last_offset = oi.positions[-1], self.base_offset + oi.relative_offsets[-1]
        if last_position >= size:
            raise IndexCorruptError(f"{oi.path}: last entry at position {last_position} of a {size}-byte log")
        try:
            first_header = self.log.header_at(0)
            last_header = self.log.header_at(last_position)
        except HPBrokerError as e:
            raise IndexCorruptError(f"{oi.path}: no batch header at an indexed position: {e}") from e
        if first_header.base_offset != self.base_offset or last_header.base_offset != last_offset:
            raise IndexCorruptError(
                f"{oi.path}: last entry says offset {last_offset} at position {last_position}, "
                f"the batch there has base offset {last_header.base_offset}"
            )
        self.first_batch_timestamp = first_header.max_timestamp

    # --- recovery: scanning a whole ``.log``, containing damage --------------------------------

    def recover(self, recovery_point: int) -> int:
        """Rebuild both indexes of the *last* segment from a scan of its whole ``.log`` (length,
        CRC, offsets), at open; returns the bytes cut.  :meth:`rebuild_indexes` repairs a segment
        in use.

        Damage followed by a valid batch is contained (:attr:`damaged`), whatever its offsets.
        Damage that runs to the end of the file is a torn tail when it starts at or past
        ``recovery_point`` (below it every batch had reached the disk): it is cut.  Below the
        recovery point it is corruption of records that were on disk: the bytes stay, offsets up
        to ``recovery_point`` are a damaged range, the segment ends there and is :attr:`sealed`
        (the log appends to a new segment, never after the damaged bytes).
        """
        self._clear_indexes()
        size = os.fstat(self.log.fd).st_size
        tail = self._scan_containing_damage(size, _NO_UPPER_OFFSET)
        cut = 0
        if tail is not None and tail.expected_offset >= recovery_point:
            cut = size - tail.position
            logger.warning("[%s] truncating %s at position %d, cutting %d bytes of a torn tail past the "
                           "recovery point %d: %s", self._name, self.path, tail.position, cut, recovery_point,
                           tail.reason)
            self.log.truncate_to(tail.position)
            size = tail.position
        elif tail is not None:
            self._add_damage(tail.position, size, tail.expected_offset, recovery_point, tail.reason)
            self.next_offset = recovery_point
            self.sealed = True
        self.log.size = size
        # What was read may have been page cache only (after a crash): sync it before trusting it.
        self.log.mark_unsynced()
        self.offset_index.mark_unsynced()
        self.time_index.mark_unsynced()
        self._rewrite_indexes()
        return cut

    def recover_closed(self, next_base_offset: int) -> None:
        """Rebuild both indexes of a segment that is *not* the last one from a scan of its whole
        ``.log``, never changing it.

        It was fsynced when the next segment began, so nothing in it is a torn write: damage is
        contained (:attr:`damaged`), never cut, and damage running to the end of the file makes
        the offsets up to ``next_base_offset`` a damaged range.  A segment that ends cleanly
        short of ``next_base_offset`` keeps its end (the loader reports the gap).
        """
        self._clear_indexes()
        size = os.fstat(self.log.fd).st_size
        tail = self._scan_containing_damage(size, next_base_offset)
        if tail is not None:
            self._add_damage(tail.position, size, tail.expected_offset, next_base_offset, tail.reason)
            self.next_offset = next_base_offset
        self.log.size = size
        self._rewrite_indexes()

    def rebuild_indexes(self) -> list[DamagedRange]:
        """Rebuild both indexes from the ``.log`` while the segment is in use (an index was found
        to disagree with it), reading only its first ``size_in_bytes``: what follows may be a
        flush in flight that the owner has not applied.  Changes no byte of the ``.log`` and
        keeps ``next_offset``; damage found is contained (:attr:`damaged`, returned): bytes up to
        the end that are not valid batches make the offsets up to ``next_offset`` a damaged range.
        """
        next_offset = self.next_offset
        self._clear_indexes()
        tail = self._scan_containing_damage(self.log.size, next_offset)
        if tail is not None:
            self._add_damage(tail.position, self.log.size, tail.expected_offset, next_offset, tail.reason)
        elif self.next_offset < next_offset:
            self._add_damage(self.log.size, self.log.size, self.next_offset, next_offset,
                             f"the batches end at offset {self.next_offset}")
        self.next_offset = next_offset
        self._rewrite_indexes()
        return self.damaged

    def _scan_containing_damage(self, end: int, upper_offset: int) -> _DamagedTail | None:
        """Scan ``[0, end)`` of the ``.log``, indexing its valid batches; each run of bad bytes
        followed by a valid batch (base offset below ``upper_offset``) becomes a damaged range.
        Sets ``next_offset`` to the offset after the last valid batch; returns the bad bytes that
        last to ``end``, if any."""
        self.damaged = []
        position, expected = 0, self.base_offset
        forced = [False]  # the first batch after damage gets an index entry

        def index(chunk_position: int, result: _core.ScanResult) -> None:
            self._index_batches(chunk_position, result.positions, result.base_offsets, result.max_timestamps,
                                force_first=forced[0])
            forced[0] = False

        while True:
            outcome = self.log.scan(position, expected, index, end=end)
            self.next_offset = outcome.next_offset
            if outcome.stop_reason is None:
                return None
            found = find_next_batch(self._pread, outcome.valid_end, end, outcome.next_offset, upper_offset)
            if found is None:
                return _DamagedTail(outcome.valid_end, outcome.next_offset, outcome.stop_reason)
            position, header = found
            self._add_damage(outcome.valid_end, position, outcome.next_offset, header.base_offset,
                             outcome.stop_reason)
            expected, forced[0] = header.base_offset, True

    def _pread(self, position: int, length: int) -> bytes:
        return pread_full(self.log.fd, length, position)

    def _add_damage(self, first_position: int, end_position: int, first_offset: int, next_offset: int,
                    reason: str) -> None:
        damaged = DamagedRange(self.path, first_position, end_position, first_offset, next_offset, reason)
        self.damaged.append(damaged)
        logger.error("[%s] damaged range: %s; %d offsets cannot be read, the valid batches around it are "
                     "kept", self._name, damaged.describe(), damaged.record_count)

    def _clear_indexes(self) -> None:
        self.offset_index.clear()
        self.time_index.clear()
        self.max_timestamp = self.first_batch_timestamp = -1

    def _rewrite_indexes(self) -> None:
        """Write rebuilt indexes to their files.  On a full disk (``ENOSPC``, ``EDQUOT``) both
        files are emptied instead, which needs no space: the entries in memory serve this
        process, and the next open, finding files that disagree with the log, rebuilds them.  So
        a log whose indexes must be rebuilt still opens, for reads, on a full disk."""
        try:
            rewritten = self.offset_index.rewrite_if_changed()
            rewritten = self.time_index.rewrite_if_changed() or rewritten
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            self.offset_index.empty_file()
            self.time_index.empty_file()
            logger.warning("[%s] the rebuilt indexes of %s are kept in memory only: %s (rebuilt again at "
                           "the next open)", self._name, self.path, e)
            return
        if rewritten:
            logger.info("[%s] rebuilt the indexes of %s", self._name, self.path)

    # --- reading -----------------------------------------------------------------------------

    def damaged_range_at(self, offset: int) -> DamagedRange | None:
        """The damaged range holding ``offset``, if any."""
        for damaged in self.damaged:
            if damaged.first_offset <= offset < damaged.next_offset:
                return damaged
        return None

    def _run_end(self, position: int) -> tuple[int, int]:
        """Where the run of valid batches holding ``position`` ends: the position of the next
        damaged range (or the end of the batches) and the offset expected there."""
        for damaged in self.damaged:
            if damaged.first_position >= position:
                return damaged.first_position, damaged.first_offset
        return self.log.size, self.next_offset

    def _checked_headers(self, entry: int, end: int):
        """Walk headers from offset index entry ``entry`` up to position ``end``, first checking
        that the batch there has the entry's offset (IndexCorruptError if not)."""
        oi = self.offset_index
        position, expected = oi.positions[entry], self.base_offset + oi.relative_offsets[entry]
        try:
            for found, header in self.log.headers(position, end):
                if found == position and header.base_offset != expected:
                    raise IndexCorruptError(
                        f"{oi.path}: entry {entry} says offset {expected} at position {position}, "
                        f"the batch there has base offset {header.base_offset}"
                    )
                yield found, header
        except HPBrokerError as e:
            raise IndexCorruptError(f"{self.path}: no batch header where the index leads: {e}") from e

    def _headers_from(self, entry: int):
        """The headers of every valid batch from offset index entry ``entry`` on, stepping over
        damaged ranges."""
        position = self.offset_index.positions[entry]
        stop, _ = self._run_end(position)
        yield from self._checked_headers(entry, stop)
        for damaged in self.damaged:
            if damaged.first_position < stop or damaged.end_position >= self.log.size:
                continue
            stop, _ = self._run_end(damaged.end_position)
            try:
                yield from self.log.headers(damaged.end_position, stop)
            except HPBrokerError as e:
                raise IndexCorruptError(f"{self.path}: no batch header after a damaged range: {e}") from e

    def read(self, offset: int, max_bytes: int) -> FileSlice:
        """Whole batches from the one containing ``offset`` (which must be in
        ``[base_offset, next_offset)``): the first batch always, more while within ``max_bytes``,
        never past a damaged range.  DamagedRangeError when ``offset`` lies in one."""
        damaged = self.damaged_range_at(offset)
        if damaged is not None:
            raise DamagedRangeError(f"offset {offset} lies in a damaged range: {damaged.describe()}",
                                    damaged.first_offset, damaged.next_offset)
        entry = self.offset_index.floor(offset - self.base_offset)
        if entry < 0:
            raise IndexCorruptError(f"{self.offset_index.path}: no entry at or below offset {offset}")
        stop, stop_offset = self._run_end(self.offset_index.positions[entry])
        for start, header in self._checked_headers(entry, stop):
            if header.next_offset > offset:
                end, next_offset = self._slice_end(start, header, start + max_bytes, stop, stop_offset)
                return FileSlice(self.log.fd, start, end - start, header.base_offset, self.path, next_offset)
        raise IndexCorruptError(f"{self.path}: no batch holds offset {offset} below {self.next_offset}")

    def _slice_end(self, start: int, first: _core.BatchHeader, limit: int, stop: int,
                   stop_offset: int) -> tuple[int, int]:
        """The end of the last whole batch at or before ``limit``, but at least the first one's
        (the batch at ``start``), and the offset after that batch; never past ``stop``, the end
        of the run of valid batches, where the offset is ``stop_offset``."""
        if limit >= stop:
            return stop, stop_offset
        end, next_offset = start + first.size, first.next_offset
        if end >= limit:
            return end, next_offset
        entry = self.offset_index.floor_by_position(limit)
        if self.offset_index.positions[entry] > end:  # batches up to that entry fit: jump there
            end = self.offset_index.positions[entry]
            next_offset = self.base_offset + self.offset_index.relative_offsets[entry]
            headers = self._checked_headers(entry, stop)
        else:
            headers = self.log.headers(end, stop)
        try:
            for position, header in headers:
                if position + header.size > limit:
                    break
                end, next_offset = position + header.size, header.next_offset
        except IndexCorruptError:
            raise
        except HPBrokerError as e:  # damage the indexes do not know of: the caller rebuilds them
            raise IndexCorruptError(f"{self.path}: no batch header where the batches go on: {e}") from e
        return end, next_offset

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The first offset in this segment whose record timestamp is >= ``timestamp_ms``
        (damaged ranges, whose timestamps are unknown, are stepped over)."""
        if self.max_timestamp < timestamp_ms:
            return None
        entry = self.time_index.last_below(timestamp_ms)
        offset_entry = 0 if entry < 0 else self.offset_index.find(self.time_index.relative_offsets[entry])
        if offset_entry < 0:
            raise IndexCorruptError(f"{self.time_index.path}: entry {entry} has no offset index entry")
        for position, header in self._headers_from(offset_entry):
            if header.max_timestamp >= timestamp_ms:
                try:
                    records = _core.decode_records(self.log.read(position, header.size))
                except CorruptRecordError as e:
                    raise CorruptRecordError(
                        f"{self.path}: batch at position {position} (offset {header.base_offset}): "
                        f"{core_detail(e.message)}"
                    ) from None
                for record in records:
                    if record.timestamp >= timestamp_ms:
                        return record.offset
        return None

    def retention_time_ms(self, timestamp_after_max_ms: int) -> int:
        """The time retention ages this segment by: its largest record timestamp, or, when it
        has none (``max_timestamp`` -1), the modification time of its ``.log`` (Kafka's rule),
        never -1, which would make any segment look ancient.  A largest timestamp more than
        ``timestamp_after_max_ms`` past that modification time cannot have been accepted when it
        was written (it came in before the bound was set, or lowered): the modification time is
        used instead, so a record stamped in the far future cannot keep its segment, and every
        later one, forever."""
        written_ms = -1
        if self.max_timestamp >= 0:
            written_ms = os.fstat(self.log.fd).st_mtime_ns // 1_000_000
            if self.max_timestamp - written_ms <= timestamp_after_max_ms:
                return self.max_timestamp
        return written_ms if written_ms >= 0 else os.fstat(self.log.fd).st_mtime_ns // 1_000_000

    # --- the end -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the three descriptors (no flush, no sync); all of them even if one fails, whose
        OSError is raised afterwards."""
        error = None
        for part in ("log", "offset_index", "time_index"):
            try:
                if hasattr(self, part):
                    getattr(self, part).close()
            except OSError as e:
                error = error or e
        if error is not None:
            raise error

    def delete_files(self) -> None:
        """Unlink the three files; open descriptors keep working until :meth:`close`."""
        self.log.unlink()
        self.offset_index.unlink()
        self.time_index.unlink()
