"""Damaged ranges of a log, and finding the next valid batch after damage (resynchronising).

A *damaged range* is a run of offsets that a partition cannot serve: bytes inside a segment that
fail their checks (framing, CRC, offsets) with valid batches around them, or a segment file
missing from the middle of the log (a *gap*, no bytes at all).  Containment, not truncation, is
the rule for data that reached the disk (the recovery point, ``hpbroker.io.loader``): the
damaged range is marked and reported, every valid batch after it stays readable, and a read that
reaches it fails with :class:`~hpbroker.errors.DamagedRangeError` naming the offset where
reading can go on.

Resynchronising: after damage at ``position``, :func:`find_next_batch` looks for the first
position where a whole batch parses and passes its CRC and whose base offset lies in the range
the damage can have covered.  Candidates are filtered a chunk at a time with numpy over every
byte position (``magic`` at byte 20 equal to ``_core.MAGIC``, the reserved byte 23 zero, attribute
bits 4-7 zero, the little-endian i64 base offset at byte 0 in range, the batch inside the data),
so a scan costs a few vector passes per chunk; only the rare candidate that passes is CRC-checked
by ``_core``.  A batch whose CRC matches at a position and offset that fit is taken to be one the
log wrote: random bytes pass all of those checks with a probability far below 2^-60.

The batch at the damaged position itself, when its header still frames it (a flipped payload
byte), is skipped whole first: its successor is tried before any position inside it, so that a
record value which happens to hold batch bytes is not mistaken for the log's own batch.

Pure functions over a ``read(position, length) -> bytes`` callable: no files are opened here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hpbroker import _core
from hpbroker.errors import HPBrokerError

__all__ = ["RESYNC_CHUNK_BYTES", "DamagedRange", "find_next_batch"]

# find_next_batch reads this much at a time (plus one header's worth of overlap).
RESYNC_CHUNK_BYTES = 8 << 20
_MAGIC_POSITION = 20  # the batch header's magic byte (hpbroker._core's layout)
_ATTRIBUTES_POSITION = 21  # attributes: bits 0-2 the codec, bit 3 idempotent, bits 4-7 zero
_RESERVED_POSITION = 23  # reserved: zero
_LENGTH_POSITION = 8  # batch_length i32: bytes after this field
_UNUSED_ATTRIBUTE_BITS = 0xF0

Reader = Callable[[int, int], bytes]


@dataclass(frozen=True, slots=True)
class DamagedRange:
    """Offsets ``[first_offset, next_offset)`` that cannot be read, and why.

    ``file`` is the segment file holding the damaged bytes ``[first_position, end_position)``;
    for a gap (a missing segment) ``file`` names the directory's missing segment and both
    positions are -1.  ``next_offset`` may equal ``first_offset``: bytes that held no offset
    (garbage between two valid batches) are still a damaged range, so reads stop before them.
    """

    file: str
    first_position: int
    end_position: int
    first_offset: int
    next_offset: int
    reason: str

    @property
    def record_count(self) -> int:
        return self.next_offset - self.first_offset

    def describe(self) -> str:
        """``<file>: offsets [a, b) at positions [p, q): <reason>`` (no positions for a gap)."""
        where = ""
        if self.first_position >= 0:
            where = f" at positions [{self.first_position}, {self.end_position})"
        return f"{self.file}: offsets [{self.first_offset}, {self.next_offset}){where}: {self.reason}"


def find_next_batch(read: Reader, position: int, end: int, min_offset: int,
                    max_offset: int) -> tuple[int, _core.BatchHeader] | None:
    """The first valid batch after damage at ``position`` and before ``end`` whose base offset is
    in ``[min_offset, max_offset)``: ``(its position, its header)``, or None when there is none.

    Tries the position right after the damaged batch first when its header frames it (module
    docstring), then every position from ``position + 1`` on.
    """
    framed = _framed_size(read, position, end)
    if framed is not None:
        found = _valid_batch_at(read, position + framed, end, min_offset, max_offset)
        if found is not None:
            return position + framed, found
    start = position + 1
    while start + _core.HEADER_SIZE <= end:
        # Chunks overlap by a header, less one byte: each position is a candidate exactly once.
        chunk = read(start, min(RESYNC_CHUNK_BYTES + _core.HEADER_SIZE, end - start))
        if len(chunk) < _core.HEADER_SIZE:
            return None
        for candidate in _candidates(chunk, start, end, min_offset, max_offset):
            found = _valid_batch_at(read, start + candidate, end, min_offset, max_offset)
            if found is not None:
                return start + candidate, found
        start += len(chunk) - _core.HEADER_SIZE + 1
    return None


def _framed_size(read: Reader, position: int, end: int) -> int | None:
    """The size the header at ``position`` gives its batch, when that header parses and the batch
    fits before ``end``; None otherwise."""
    try:
        header = _core.read_header(read(position, _core.HEADER_SIZE))
    except (HPBrokerError, ValueError):
        return None
    if header.size < _core.HEADER_SIZE or position + header.size > end:
        return None
    return header.size


def _valid_batch_at(read: Reader, position: int, end: int, min_offset: int,
                    max_offset: int) -> _core.BatchHeader | None:
    """The header of the valid batch (framing and CRC) at ``position``, if one is there with a
    base offset in range and it ends by ``end``."""
    if position + _core.HEADER_SIZE > end:
        return None
    try:
        header = _core.read_header(read(position, _core.HEADER_SIZE))
    except (HPBrokerError, ValueError):
        return None
    if not min_offset <= header.base_offset < max_offset or position + header.size > end:
        return None
    scan = _core.scan_batches(read(position, header.size), 0)
    return header if scan.batch_count == 1 and scan.error is None else None


def _candidates(chunk: bytes, start: int, end: int, min_offset: int, max_offset: int) -> list[int]:
    """Positions in ``chunk`` (read at ``start``) where a batch header could begin (module
    docstring), ascending."""
    count = len(chunk) - _core.HEADER_SIZE + 1
    if count <= 0:
        return []
    data = np.frombuffer(chunk, dtype=np.uint8)
    mask = data[_MAGIC_POSITION : _MAGIC_POSITION + count] == _core.MAGIC
    mask &= data[_RESERVED_POSITION : _RESERVED_POSITION + count] == 0
    mask &= (data[_ATTRIBUTES_POSITION : _ATTRIBUTES_POSITION + count] & _UNUSED_ATTRIBUTE_BITS) == 0
    if not mask.any():
        return []
    positions = np.flatnonzero(mask)
    base_offsets = _unaligned(chunk, positions, np.dtype("<i8"))
    lengths = _unaligned(chunk, positions + _LENGTH_POSITION, np.dtype("<i4")).astype(np.int64)
    fits = ((base_offsets >= min_offset) & (base_offsets < max_offset)
            & (lengths >= _core.HEADER_SIZE - _core.LOG_OVERHEAD)
            & (start + positions + _core.LOG_OVERHEAD + lengths <= end))
    return positions[fits].tolist()


def _unaligned(chunk: bytes, positions: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The ``dtype`` integers stored at ``positions`` of ``chunk`` (any alignment)."""
    data = np.frombuffer(chunk, dtype=np.uint8)
    width = dtype.itemsize
    gathered = data[positions[:, None] + np.arange(width)]
    return np.ascontiguousarray(gathered).view(dtype).reshape(-1)
