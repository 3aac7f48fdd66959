"""Re-reading a partition log's idempotent batches to rebuild its producer state.

When the producer state (hpbroker.io.producer_state) has no valid snapshot at the log end, the
batches after its snapshot (or, without one, after the producers that have surely expired) are
replayed from the log: only their headers are read (fixed header and producer identity block),
a window of the file at a time, and yielded in offset order, so the state joins them into runs
exactly as the appends did (a batch following its producer's newest run in sequence and offset
extends it).  The log is read through the same path a consumer uses, given as
a ``read(offset, max_bytes) -> FileSlice`` callback, so damaged ranges are stepped over as a
consumer steps over them (their batches are lost to the state too) and no index is trusted over
the log.

Single caller: the partition log's owner, at open and when writes resume.  Raises OSError.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from hpbroker import _core
from hpbroker.errors import CorruptRecordError, DamagedRangeError
from hpbroker.io.files import pread_full
from hpbroker.io.logfile import FileSlice
from hpbroker.io.segment import Segment

__all__ = ["ReplayedBatch", "replay_batches", "slice_headers", "unexpired_offset"]

logger = logging.getLogger(__name__)

# The log is read this much at a time (one slice of whole batches of one segment).
_REPLAY_READ_BYTES = 4 << 20
# Headers are walked a window at a time; past a batch larger than a window, one header's worth
# at most is read (the fixed header, the producer identity block, the longest name).
_REPLAY_WINDOW_BYTES = 64 << 10
_MAX_HEADER_BYTES = 512


@dataclass(frozen=True, slots=True)
class ReplayedBatch:
    """What replaying needs of one stored idempotent batch: its identity, sequence and offsets,
    and ``timestamp``, no earlier than its append (its ``.log``'s modification time: the log no
    longer knows when exactly it was appended, and a later time only keeps the producer longer)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    base_offset: int
    last_offset: int
    timestamp: int


def unexpired_offset(segments: Sequence[Segment], cutoff_ms: int, end: int) -> int:
    """Where replaying must start without a snapshot: the base offset of the first segment whose
    ``.log`` was written to at or after ``cutoff_ms`` (every producer that appended only to the
    ones before it has expired); ``end`` when none was."""
    for segment in segments:
        if os.fstat(segment.log.fd).st_mtime_ns // 1_000_000 >= cutoff_ms:
            return segment.base_offset
    return end


def replay_batches(read: Callable[[int, int], FileSlice], start: int, end: int, segment_bases: Sequence[int],
                   log_name: str = "") -> Iterator[ReplayedBatch]:
    """The idempotent batches from ``start`` to ``end`` (the high watermark), read with ``read``
    (the log's read path: DamagedRangeError for an offset in a damaged range, CorruptRecordError
    for bytes it cannot frame).  A damaged range is stepped over; a range that cannot be read at
    all even after the segment has found its damage (a second try) is skipped to the next of
    ``segment_bases`` (ascending), logged."""
    offset, retried = start, -1
    while offset < end:
        try:
            file_slice = read(offset, _REPLAY_READ_BYTES)
        except DamagedRangeError as e:
            offset = max(e.next_offset, offset + 1)
            continue
        except CorruptRecordError as e:
            if retried != offset:  # damage met just now: the segment knows its range, read again
                retried = offset
                continue
            i = bisect.bisect_right(segment_bases, offset)
            offset = segment_bases[i] if i < len(segment_bases) else end
            logger.error("[%s] producer state: batches below offset %d skipped: %s", log_name, offset, e)
            continue
        if not file_slice.length:
            return
        mtime_ms = os.fstat(file_slice.fd).st_mtime_ns // 1_000_000
        try:
            for header in slice_headers(file_slice.fd, file_slice.position, file_slice.length):
                if header.idempotent and header.base_offset >= offset:
                    yield ReplayedBatch(header.producer_id, header.producer_epoch, header.base_sequence,
                                        header.base_offset, header.last_offset, mtime_ms)
        except CorruptRecordError as e:
            logger.error("[%s] producer state: a batch header in [%d, %d) does not parse: %s", log_name,
                         file_slice.first_offset, file_slice.next_offset, e)
        offset = file_slice.next_offset


def slice_headers(fd: int, position: int, length: int) -> Iterator[_core.BatchHeader]:
    """The headers of the whole batches in ``[position, position + length)`` of the file ``fd``
    (a slice the log's read path handed out: its framing was walked already).  Raises
    CorruptRecordError when the bytes at a batch boundary are not a header, OSError."""
    end = position + length
    window, window_at, want = b"", position, _REPLAY_WINDOW_BYTES
    while position < end:
        relative = position - window_at
        if relative + _MAX_HEADER_BYTES > len(window) and window_at + len(window) < end:
            window = pread_full(fd, min(want, end - position), position)
            window_at, relative = position, 0
        header = _core.read_header(window, relative)
        yield header
        position += header.size
        want = _MAX_HEADER_BYTES if header.size > _REPLAY_WINDOW_BYTES else _REPLAY_WINDOW_BYTES
