"""Sparse indexes of one segment: :class:`OffsetIndex` (offset -> position) and :class:`TimeIndex`.

On-disk formats (little-endian, no header, entries back to back, append-only)::

    .index      8 bytes per entry:  relative_offset u32 | position u32
    .timeindex 12 bytes per entry:  timestamp i64       | relative_offset u32

``relative_offset`` is a batch's base offset minus the segment's base offset; ``position`` is
the byte position of that batch in the segment's ``.log``.  Which batches get an entry is decided
by the segment (one rule, used both when appending and when rebuilding), not here.

Invariants a loaded index must satisfy (else :class:`IndexCorruptError`): whole entries only;
offset index entries strictly increasing in both columns; time index entries strictly increasing
in both columns.  The log is always the truth: an index that fails a check is rebuilt from it.

Entries live twice: in memory (``array`` columns, for bisection) and in the file.  New entries are
buffered by :meth:`append` and reach the file on :meth:`write_out` (a plain write: visible to
readers in other processes, durable only after :meth:`sync`).  Single writer: the segment.
"""

from __future__ import annotations

import bisect
import os
import struct
import sys
from array import array

from hpbroker.io.files import open_for_append, pread_full, unlink_if_exists, write_all

__all__ = [
    "OFFSET_ENTRY_BYTES",
    "TIME_ENTRY_BYTES",
    "IndexCorruptError",
    "OffsetIndex",
    "TimeIndex",
    "parse_offset_index",
    "parse_time_index",
]

OFFSET_ENTRY_BYTES = 8  # relative_offset u32 + position u32
TIME_ENTRY_BYTES = 12  # timestamp i64 + relative_offset u32
_TIME_ENTRY = struct.Struct("<qI")
_BIG_ENDIAN_HOST = sys.byteorder == "big"
assert array("I").itemsize == 4, "index columns need a 4-byte unsigned array type"


class IndexCorruptError(Exception):
    """An index file is malformed or disagrees with its log.  Internal to storage: never leaves
    ``hpbroker.io``, the index is rebuilt instead."""


def _strictly_increasing(column: array) -> bool:
    return all(a < b for a, b in zip(column, column[1:], strict=False))


def _check_whole(data: bytes, entry_bytes: int, path: str) -> None:
    if len(data) % entry_bytes:
        raise IndexCorruptError(f"{path}: size {len(data)} is not a multiple of the {entry_bytes}-byte entry")


def parse_offset_index(data: bytes, path: str) -> tuple[array, array]:
    """``(relative_offsets, positions)`` of an offset index file's bytes, checked: whole entries,
    both columns strictly increasing (IndexCorruptError naming ``path`` otherwise)."""
    _check_whole(data, OFFSET_ENTRY_BYTES, path)
    columns = array("I", data)
    if _BIG_ENDIAN_HOST:
        columns.byteswap()
    relative_offsets, positions = columns[0::2], columns[1::2]
    if not (_strictly_increasing(relative_offsets) and _strictly_increasing(positions)):
        raise IndexCorruptError(f"{path}: entries are not strictly increasing")
    return relative_offsets, positions


def parse_time_index(data: bytes, path: str) -> tuple[array, array]:
    """``(timestamps, relative_offsets)`` of a time index file's bytes, checked like
    :func:`parse_offset_index`."""
    _check_whole(data, TIME_ENTRY_BYTES, path)
    timestamps, relative_offsets = array("q"), array("I")
    for timestamp, relative_offset in _TIME_ENTRY.iter_unpack(data):
        timestamps.append(timestamp)
        relative_offsets.append(relative_offset)
    if not (_strictly_increasing(timestamps) and _strictly_increasing(relative_offsets)):
        raise IndexCorruptError(f"{path}: entries are not strictly increasing")
    return timestamps, relative_offsets


class _IndexFile:
    """The file half of an index: a descriptor, entries not yet written, and a dirty flag."""

    entry_bytes = 0
    _columns: tuple[str, ...] = ()  # the names of the in-memory columns

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = open_for_append(path, create=True)
        self._unwritten = bytearray()
        self._unsynced = False

    def _read_file(self) -> bytes:
        return pread_full(self._descriptor(), os.fstat(self._descriptor()).st_size, 0)

    def to_bytes(self) -> bytes:  # pragma: no cover - overridden
        raise NotImplementedError

    def snapshot(self) -> tuple:
        """The in-memory entries, to :meth:`restore` after a rebuild that failed (``clear``
        replaces the columns rather than emptying them, so the snapshot needs no copy)."""
        return tuple(getattr(self, name) for name in self._columns) + (bytes(self._unwritten),)

    def restore(self, snapshot: tuple) -> None:
        for name, column in zip(self._columns, snapshot, strict=False):
            setattr(self, name, column)
        self._unwritten = bytearray(snapshot[-1])

    def write_out(self) -> None:
        """Append the buffered entries to the file (no fsync)."""
        if self._unwritten:
            write_all(self._descriptor(), self._unwritten)
            self._unwritten.clear()
            self._unsynced = True

    def rewrite_if_changed(self) -> bool:
        """Make the file hold exactly the in-memory entries; True if it had to be rewritten."""
        wanted = self.to_bytes()
        self._unwritten.clear()
        if pread_full(self._descriptor(), os.fstat(self._descriptor()).st_size + 1, 0) == wanted:
            return False
        os.ftruncate(self._descriptor(), 0)
        write_all(self._descriptor(), wanted)
        self._unsynced = True
        return True

    def empty_file(self) -> None:
        """Truncate the file to nothing (it takes no space to do so), keeping the entries in
        memory: a file that no longer holds them all is rebuilt from the log when next loaded."""
        os.ftruncate(self._descriptor(), 0)
        self._unwritten.clear()
        self._unsynced = True

    def mark_unsynced(self) -> None:
        """The file may hold bytes that never reached the disk (read back after a crash)."""
        self._unsynced = True

    def sync(self) -> None:
        """Write out and fdatasync, if anything changed since the last sync."""
        self.write_out()
        if self._unsynced:
            os.fdatasync(self._descriptor())
            self._unsynced = False

    def _descriptor(self) -> int:
        """The file's descriptor, opened again if :meth:`release` closed it."""
        if self._fd < 0:
            self._fd = open_for_append(self.path, create=True)
        return self._fd

    def release(self) -> None:
        """Close the descriptor of a file that is written out and synced (a closed segment's:
        its entries live in memory, and it is only written again if it must be rebuilt, when it
        is opened again).  Keeps it open while anything is unwritten or unsynced."""
        if self._fd >= 0 and not self._unwritten and not self._unsynced:
            self.close()

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def unlink(self) -> None:
        unlink_if_exists(self.path)


class OffsetIndex(_IndexFile):
    """relative offset -> position of the batch with that base offset (see the module docstring)."""

    entry_bytes = OFFSET_ENTRY_BYTES
    _columns = ("relative_offsets", "positions")

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.relative_offsets = array("I")
        self.positions = array("I")

    def __len__(self) -> int:
        return len(self.positions)

    def load(self) -> None:
        """Read the file into memory, checking its invariants; IndexCorruptError if they fail."""
        self.relative_offsets, self.positions = parse_offset_index(self._read_file(), self.path)
        self._unwritten.clear()

    def clear(self) -> None:
        """Forget every entry in memory (the file is made to match by :meth:`rewrite_if_changed`)."""
        self.relative_offsets = array("I")
        self.positions = array("I")
        self._unwritten.clear()

    def append(self, relative_offset: int, position: int) -> None:
        self.relative_offsets.append(relative_offset)
        self.positions.append(position)
        self._unwritten += relative_offset.to_bytes(4, "little") + position.to_bytes(4, "little")

    def floor(self, relative_offset: int) -> int:
        """Index of the last entry whose relative offset is <= ``relative_offset``; -1 if none."""
        return bisect.bisect_right(self.relative_offsets, relative_offset) - 1

    def floor_by_position(self, position: int) -> int:
        """Index of the last entry whose position is <= ``position``; -1 if none."""
        return bisect.bisect_right(self.positions, position) - 1

    def find(self, relative_offset: int) -> int:
        """Index of the entry for exactly ``relative_offset``; -1 if there is none."""
        i = self.floor(relative_offset)
        return i if i >= 0 and self.relative_offsets[i] == relative_offset else -1

    def to_bytes(self) -> bytes:
        columns = array("I", bytes(OFFSET_ENTRY_BYTES * len(self.positions)))
        columns[0::2] = self.relative_offsets
        columns[1::2] = self.positions
        if _BIG_ENDIAN_HOST:
            columns.byteswap()
        return columns.tobytes()


class TimeIndex(_IndexFile):
    """largest timestamp so far -> relative base offset of the batch where it was reached."""

    entry_bytes = TIME_ENTRY_BYTES
    _columns = ("timestamps", "relative_offsets")

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.timestamps = array("q")
        self.relative_offsets = array("I")

    def __len__(self) -> int:
        return len(self.timestamps)

    def load(self) -> None:
        """Read the file into memory, checking its invariants; IndexCorruptError if they fail."""
        self.timestamps, self.relative_offsets = parse_time_index(self._read_file(), self.path)
        self._unwritten.clear()

    def clear(self) -> None:
        """Forget every entry in memory (the file is made to match by :meth:`rewrite_if_changed`)."""
        self.timestamps = array("q")
        self.relative_offsets = array("I")
        self._unwritten.clear()

    def append(self, timestamp: int, relative_offset: int) -> None:
        self.timestamps.append(timestamp)
        self.relative_offsets.append(relative_offset)
        self._unwritten += _TIME_ENTRY.pack(timestamp, relative_offset)

    def last_below(self, timestamp: int) -> int:
        """Index of the last entry whose timestamp is < ``timestamp``; -1 if none."""
        return bisect.bisect_left(self.timestamps, timestamp) - 1

    def to_bytes(self) -> bytes:
        entries = zip(self.timestamps, self.relative_offsets, strict=True)
        return b"".join(_TIME_ENTRY.pack(timestamp, offset) for timestamp, offset in entries)
