"""One segment of a partition log: a ``.log`` file plus its ``.index`` and ``.timeindex``.

Files: ``<base_offset:020d>.log``, ``.index``, ``.timeindex`` (formats in ``hpbroker.io.logfile``
and ``hpbroker.io.index``).  The first batch of a segment has ``base_offset``; offsets inside a
segment are contiguous.

The indexing rule, the only one (appending and rebuilding both go through
:meth:`Segment._index_batches`, so a rebuilt index is byte-for-byte the index built while
appending): a batch gets an offset index entry when it is the segment's first batch, or when it
starts at least ``index_interval_bytes`` after the position of the previous entry.  Whenever an
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
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from hpbroker import _core
from hpbroker.errors import CorruptRecordError, HPBrokerError
from hpbroker.io.config import LogConfig
from hpbroker.io.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, segment_file_name
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
        self.damage: str | None = None  # why the .log itself is damaged (found by a rebuild)
        self.damage_position = -1  # where its valid prefix ends, when damaged
        self._index_interval = config.index_interval_bytes
        self._name = log_name
        path = os.path.join(directory, segment_file_name(base_offset, ""))
        self.log = LogFile(path + LOG_SUFFIX, create=create)
        try:
            self.offset_index = OffsetIndex(path + INDEX_SUFFIX)
            self.time_index = TimeIndex(path + TIME_INDEX_SUFFIX)
        except BaseException:
            self.close()
            raise
        if create:
            self.offset_index.rewrite_if_changed()
            self.time_index.rewrite_if_changed()

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
                       max_timestamps: Sequence[int], first: int = 0) -> None:
        """Apply the indexing rule to batches ``first..`` (positions are ``bias`` + ``positions[i]``),
        in file order, right after the batches already indexed.  Costs O(entries), not O(batches)."""
        oi, ti = self.offset_index, self.time_index
        i, n = first, len(positions)
        while i < n:
            if len(oi):
                j = bisect.bisect_left(positions, oi.positions[-1] + self._index_interval - bias, i)
            else:
                j = i
                self.first_batch_timestamp = max_timestamps[i]
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

    def recover(self) -> int:
        """Rebuild both indexes by scanning the whole ``.log`` (length, CRC, offsets contiguous
        from ``base_offset``) and truncate it at the first bad byte; returns the bytes cut.  For
        opening only: :meth:`rebuild_indexes` repairs a segment in use."""
        self._clear_indexes()
        outcome = self.log.scan(0, self.base_offset, self._index_scanned)
        cut = os.fstat(self.log.fd).st_size - outcome.valid_end
        self.next_offset = outcome.next_offset
        if cut:
            logger.warning("[%s] truncating %s at position %d, cutting %d bytes: %s",
                           self._name, self.path, outcome.valid_end, cut, outcome.stop_reason)
            self.log.truncate_to(outcome.valid_end)
        self.log.size = outcome.valid_end
        # What was read may have been page cache only (after a crash): sync it before trusting it.
        self.log.mark_unsynced()
        self.offset_index.mark_unsynced()
        self.time_index.mark_unsynced()
        self._rewrite_indexes()
        return cut

    def recover_keeping_damage(self, next_base_offset: int) -> bool:
        """Rebuild both indexes of a *closed* segment by scanning its ``.log``, never changing it.

        For an old segment whose indexes failed their check at open: its batches were fsynced
        long ago, so damage inside is rot, not a torn write, and cutting it would also throw
        away every later segment.  When the scan stops early, the indexes cover the valid
        prefix, :attr:`damage` says where the rot starts, and the segment still ends at
        ``next_base_offset`` (where the next segment begins): reads below the damage work, reads
        that reach it raise CorruptRecordError.  Returns True when the segment is intact.
        """
        self._clear_indexes()
        size = os.fstat(self.log.fd).st_size
        outcome = self.log.scan(0, self.base_offset, self._index_scanned, end=size)
        self.log.size = size
        self._rewrite_indexes()
        if outcome.valid_end == size and outcome.next_offset == next_base_offset:
            self.next_offset = outcome.next_offset
            return True
        self.next_offset = next_base_offset
        self.damage_position = outcome.valid_end
        reason = outcome.stop_reason or f"offsets end at {outcome.next_offset}"
        self.damage = (f"{self.path}: {reason} (valid up to offset {outcome.next_offset} of "
                       f"{next_base_offset}, position {outcome.valid_end} of {size})")
        return False

    def rebuild_indexes(self) -> None:
        """Rebuild both indexes from the ``.log`` while the segment is in use (an index was found
        to disagree with it), reading only its first ``size_in_bytes``: what follows may be a
        flush in flight that the owner has not applied.  Changes no byte of the ``.log``.

        When those bytes are not exactly valid batches up to ``next_offset``, the log itself is
        damaged: the indexes stay as they were, :attr:`damage` says where, and
        CorruptRecordError (naming the file and position) is raised.
        """
        saved = (self.offset_index.snapshot(), self.time_index.snapshot(), self.max_timestamp,
                 self.first_batch_timestamp)
        self._clear_indexes()
        outcome = self.log.scan(0, self.base_offset, self._index_scanned, end=self.log.size)
        if outcome.valid_end != self.log.size or outcome.next_offset != self.next_offset:
            self.offset_index.restore(saved[0])
            self.time_index.restore(saved[1])
            self.max_timestamp, self.first_batch_timestamp = saved[2], saved[3]
            reason = outcome.stop_reason or f"batch at position {outcome.valid_end}: offsets end early"
            self.damage_position = outcome.valid_end
            self.damage = (f"{self.path}: {reason} (valid up to offset {outcome.next_offset} of "
                           f"{self.next_offset}, position {outcome.valid_end} of {self.log.size})")
            raise CorruptRecordError(self.damage)
        self._rewrite_indexes()

    def _clear_indexes(self) -> None:
        self.offset_index.clear()
        self.time_index.clear()
        self.max_timestamp = self.first_batch_timestamp = -1

    def _rewrite_indexes(self) -> None:
        rewritten = self.offset_index.rewrite_if_changed()
        rewritten = self.time_index.rewrite_if_changed() or rewritten
        if rewritten:
            logger.info("[%s] rebuilt the indexes of %s", self._name, self.path)

    def _index_scanned(self, chunk_position: int, result: _core.ScanResult) -> None:
        self._index_batches(chunk_position, result.positions, result.base_offsets, result.max_timestamps)

    # --- reading -----------------------------------------------------------------------------

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

    def read(self, offset: int, max_bytes: int) -> FileSlice:
        """Whole batches from the one containing ``offset`` (which must be in
        ``[base_offset, next_offset)``): the first batch always, more while within ``max_bytes``.
        In a damaged segment only the valid prefix is served; CorruptRecordError past it."""
        entry = self.offset_index.floor(offset - self.base_offset)
        if entry < 0:
            raise IndexCorruptError(f"{self.offset_index.path}: no entry at or below offset {offset}")
        readable = self.log.size if self.damage_position < 0 else self.damage_position
        for start, header in self._checked_headers(entry, readable):
            if header.next_offset > offset:
                end, next_offset = self._slice_end(start, header, start + max_bytes)
                if end > readable:  # a damaged segment: only its valid prefix
                    end, next_offset = readable, self._next_offset_at(start, readable)
                if end <= start:
                    break
                return FileSlice(self.log.fd, start, end - start, header.base_offset, self.path, next_offset)
        if self.damage is not None:
            raise CorruptRecordError(f"offset {offset} lies past the damage: {self.damage}")
        raise IndexCorruptError(f"{self.path}: no batch holds offset {offset} below {self.next_offset}")

    def _slice_end(self, start: int, first: _core.BatchHeader, limit: int) -> tuple[int, int]:
        """The end of the last whole batch at or before ``limit``, but at least the first one's
        (the batch at ``start``), and the offset after that batch."""
        if limit >= self.log.size:
            return self.log.size, self.next_offset
        end, next_offset = start + first.size, first.next_offset
        if end >= limit:
            return end, next_offset
        entry = self.offset_index.floor_by_position(limit)
        if self.offset_index.positions[entry] > end:  # batches up to that entry fit: jump there
            end = self.offset_index.positions[entry]
            next_offset = self.base_offset + self.offset_index.relative_offsets[entry]
            headers = self._checked_headers(entry, self.log.size)
        else:
            headers = self.log.headers(end, self.log.size)
        for position, header in headers:
            if position + header.size > limit:
                break
            end, next_offset = position + header.size, header.next_offset
        return end, next_offset

    def _next_offset_at(self, start: int, end: int) -> int:
        """The offset after the batch that ends at ``end``, walking from the batch at ``start``."""
        next_offset = -1
        for _position, header in self.log.headers(start, end):
            next_offset = header.next_offset
        return next_offset

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The first offset in this segment whose record timestamp is >= ``timestamp_ms``."""
        if self.max_timestamp < timestamp_ms:
            return None
        entry = self.time_index.last_below(timestamp_ms)
        offset_entry = 0 if entry < 0 else self.offset_index.find(self.time_index.relative_offsets[entry])
        if offset_entry < 0:
            raise IndexCorruptError(f"{self.time_index.path}: entry {entry} has no offset index entry")
        for position, header in self._checked_headers(offset_entry, self.log.size):
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

    def retention_time_ms(self) -> int:
        """The time retention ages this segment by: its largest record timestamp, or, when it
        has none (``max_timestamp`` -1), the modification time of its ``.log`` (Kafka's rule),
        never -1, which would make any segment look ancient."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return os.fstat(self.log.fd).st_mtime_ns // 1_000_000

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
