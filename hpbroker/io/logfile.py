"""One ``.log`` file of record batches: read, walk headers, scan and truncate (appends go through its
descriptor, see ``Segment.write``).

On-disk format: whole batches back to back, exactly as ``hpbroker._core`` lays them out (its
module docstring; base offsets stamped by the log), nothing before, between or after them.  A
file that ends inside a batch, or holds bytes that do not parse as the next batch, is handled by
recovery (``hpbroker.io.segment``, ``hpbroker.io.loader``): it scans with :meth:`LogFile.scan`,
truncates a torn tail and contains any other damage as a damaged range.

Invariant: ``size`` is the number of bytes this process has written and recovery has validated;
readers never look past it.  Single writer: the owning segment.  Any method may raise
``OSError``; :class:`~hpbroker.errors.CorruptRecordError` comes from header walks over bytes
that are not batches, its message naming the file and the position in it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hpbroker import _core
from hpbroker.errors import CorruptRecordError
from hpbroker.io.files import open_for_append, pread_full, unlink_if_exists

__all__ = ["SCAN_CHUNK_BYTES", "FileSlice", "LogFile", "ScanOutcome", "at_position", "core_detail"]

# Recovery reads the log this much at a time.  A batch larger than this is first checked a chunk
# at a time (offset, CRC) and read whole only if it passes: memory stays below the larger of this
# and the largest valid batch, whatever a damaged length field says.  Scans accept batches up to
# _core's 2 GiB limit, not max_message_bytes: a batch written while the limit was higher is not
# corrupt because the limit was lowered since.
SCAN_CHUNK_BYTES = 8 << 20
# Header walks read this much at a time: one read covers the batches of an index interval.
_HEADER_WINDOW_BYTES = 16 << 10


_CORE_POSITION_PREFIX = "batch at position "  # how _core's messages start


def core_detail(message: str) -> str:
    """A ``_core`` message about a batch without its ``batch at position N (...): `` start, which
    names a position in the buffer ``_core`` was given (a chunk, a window), not in the file."""
    return message.partition(": ")[2] if message.startswith(_CORE_POSITION_PREFIX) else message


def at_position(message: str, position: int) -> str:
    """A ``_core`` message about a batch, naming ``position``, where the batch is in the file."""
    return f"{_CORE_POSITION_PREFIX}{position}: {core_detail(message)}"


@dataclass(frozen=True, slots=True)
class FileSlice:
    """Whole batches of one segment file, ready for ``os.sendfile(sock, fd, position, length)``.

    ``first_offset`` is the base offset of the first batch in the slice (which may be below the
    offset asked for: a slice starts with the batch containing it), ``next_offset`` the offset
    after its last batch, so it holds ``next_offset - first_offset`` records.  ``length`` 0 means
    nothing to read yet; both offsets are then the offset asked for.  The descriptor belongs to the
    log: do not close it.  It stays valid until the log is closed, or ``file_delete_delay_ms``
    after its segment was deleted by retention.
    """

    fd: int
    position: int
    length: int
    first_offset: int
    path: str
    next_offset: int


@dataclass(frozen=True, slots=True)
class ScanOutcome:
    """Where a scan stopped: ``valid_end`` is the position just after the last valid batch,
    ``next_offset`` the offset the next batch must start at, ``stop_reason`` why bytes after
    ``valid_end`` are not valid batches (None when the scan reached the end of the file)."""

    valid_end: int
    next_offset: int
    stop_reason: str | None


class LogFile:
    """The ``.log`` file of one segment (see the module docstring)."""

    def __init__(self, path: str, *, create: bool) -> None:
        """Open an existing file, or (``create``) make a new one, refusing to reuse an old one."""
        self.path = path
        self.fd = open_for_append(path, create=create, exclusive=create)
        self.size = os.fstat(self.fd).st_size
        self._unsynced = False

    def grew(self, written: int) -> None:
        """The segment appended ``written`` bytes through :attr:`fd` (``Segment.write``: an
        O_APPEND descriptor, one ``writev``, possibly on a flusher thread)."""
        self.size += written
        self._unsynced = True

    def mark_synced(self) -> None:
        """Everything written so far was fdatasync'd through :attr:`fd` by the one who wrote it."""
        self._unsynced = False

    def read(self, position: int, length: int) -> bytes:
        """Bytes ``[position, position + length)``, cut at ``size``."""
        length = max(0, min(length, self.size - position))
        return pread_full(self.fd, length, position) if length else b""

    def header_at(self, position: int) -> _core.BatchHeader:
        """The header of the batch at ``position`` (CorruptRecordError if none parses there)."""
        return _core.read_header(self.read(position, _core.HEADER_SIZE))

    def headers(self, start: int, end: int) -> Iterator[tuple[int, _core.BatchHeader]]:
        """``(position, header)`` of each batch from ``start`` (a batch boundary) up to ``end``.

        Reads a window at a time, so walking the small batches of an index interval costs one
        ``pread``; a jump past the window re-reads at the next header, just the header when the
        batch jumped over was larger than a window (large batches tend to follow each other).
        CorruptRecordError (naming this file and the position) when the bytes at a position are
        not a batch header, or the batch would run past ``end``.
        """
        window, window_position = b"", start
        position, want = start, _HEADER_WINDOW_BYTES
        while position < end:
            relative = position - window_position
            if relative + _core.HEADER_SIZE > len(window) and window_position + len(window) < end:
                window = pread_full(self.fd, min(want, end - position), position)
                window_position, relative = position, 0
            try:
                header = _core.read_header(window, relative)
            except CorruptRecordError as e:
                raise CorruptRecordError(f"{self.path}: {at_position(e.message, position)}") from None
            if position + header.size > end:
                raise CorruptRecordError(f"{self.path}: {_CORE_POSITION_PREFIX}{position}: its {header.size} "
                                         f"bytes run past the end of the batches at {end}")
            yield position, header
            position += header.size
            want = _core.HEADER_SIZE if header.size > _HEADER_WINDOW_BYTES else _HEADER_WINDOW_BYTES

    def scan(
        self,
        start: int,
        expected_offset: int,
        on_batches: Callable[[int, _core.ScanResult], None],
        *,
        end: int | None = None,
        chunk_bytes: int = SCAN_CHUNK_BYTES,
    ) -> ScanOutcome:
        """Validate the batches from ``start`` to ``end`` (framing, CRC, offsets contiguous from
        ``expected_offset``), in chunks; ``on_batches(chunk_position, result)`` receives each
        chunk's valid batches (their positions relative to ``chunk_position``).  ``end`` None:
        the end of the file as it is on disk, not just ``size`` (recovery).  Never raises for
        bad data."""
        file_size = os.fstat(self.fd).st_size if end is None else end
        position, next_offset, want = start, expected_offset, chunk_bytes
        while position < file_size:
            chunk = pread_full(self.fd, min(want, file_size - position), position)
            result = _core.scan_batches(chunk, 0, expected_offset=next_offset)
            if result.batch_count:
                on_batches(position, result)
                position += result.valid_bytes
                next_offset = result.next_offset
            want = chunk_bytes
            if result.error is None:
                continue
            if not result.incomplete:
                return ScanOutcome(position, next_offset, at_position(result.error, position))
            if position + (len(chunk) - result.valid_bytes) >= file_size:
                return ScanOutcome(position, next_offset, f"{_CORE_POSITION_PREFIX}{position}: the file ends "
                                   f"inside a batch ({file_size - position} bytes left)")
            if result.batch_count == 0 and len(chunk) < _core.HEADER_SIZE:
                want = _core.HEADER_SIZE
            elif result.batch_count == 0:  # one batch larger than a chunk: read it whole, if it is one
                header = _core.read_header(chunk)
                problem = self._large_batch_problem(position, header, next_offset, file_size, chunk_bytes)
                if problem is not None:
                    return ScanOutcome(position, next_offset, problem)
                want = header.size
        return ScanOutcome(position, next_offset, None)

    def _large_batch_problem(self, position: int, header: _core.BatchHeader, expected_offset: int,
                             end: int, chunk_bytes: int) -> str | None:
        """Why the batch at ``position``, larger than a chunk, cannot be valid; None if it may be.

        Checked a chunk at a time (its offset, that it fits before ``end``, its CRC), so a length
        field that damage made huge never costs more memory than a chunk: only a batch whose CRC
        matches, one the log once accepted whole, is then read whole.
        """
        here = f"{_CORE_POSITION_PREFIX}{position}"
        if position + header.size > end:  # the order of _core's checks: framing, CRC, offset
            return f"{here}: the file ends inside a batch ({end - position} bytes left of {header.size})"
        crc, at, batch_end = 0, position + _core.CRC_START, position + header.size
        while at < batch_end:
            piece = pread_full(self.fd, min(chunk_bytes, batch_end - at), at)
            if not piece:
                return f"{here}: the file ends inside a batch ({at - position} bytes of {header.size})"
            crc = _core.crc32c(piece, crc)
            at += len(piece)
        if crc != header.crc:
            return f"{here}: CRC mismatch: stored 0x{header.crc:08x}, computed 0x{crc:08x}"
        if header.base_offset != expected_offset:
            return f"{here}: base offset {header.base_offset}, expected {expected_offset}"
        return None

    def truncate_to(self, position: int) -> None:
        """Cut the file to ``position`` bytes, durably (fdatasync)."""
        os.ftruncate(self.fd, position)
        os.fdatasync(self.fd)
        self.size = position
        self._unsynced = False

    def sync(self) -> int | None:
        """fdatasync, if anything was written since the last one: the nanoseconds it took, or
        None when there was nothing to sync."""
        if not self._unsynced:
            return None
        started = time.perf_counter_ns()
        os.fdatasync(self.fd)
        self._unsynced = False
        return time.perf_counter_ns() - started

    def mark_unsynced(self) -> None:
        """Recovery does not know whether the page cache it read was ever flushed to disk."""
        self._unsynced = True

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def unlink(self) -> None:
        unlink_if_exists(self.path)
