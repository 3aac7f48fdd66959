"""The producer state of one partition: what deduplicates idempotent producers at the single writer.

Kafka's ``ProducerStateManager``, adapted.  Per producer id the partition remembers the newest
producer epoch it stored, the time of its last append, and its newest :data:`MAX_RUNS_PER_PRODUCER`
*runs*.  A run ``(first_sequence, last_sequence, first_offset, last_offset)`` covers batches of
that producer and epoch stored one right after the other, consecutive sequences at consecutive
offsets: ``last_sequence - first_sequence == last_offset - first_offset``, and the record of
sequence ``s`` lies at offset ``first_offset + (s - first_sequence)``.  A batch of the same epoch
that starts at the newest run's ``last_sequence + 1`` *and* at its ``last_offset + 1`` extends
that run; any other starts a new run (the oldest beyond MAX_RUNS_PER_PRODUCER is forgotten).  So
a producer alone on a partition keeps one run however many requests it sends, and one whose
requests alternate with other producers' gets a run per request.  The batches of one request are
given consecutive offsets, so a request's batches of one producer always lie in one run; a state
rebuilt from the log merges the batch headers the same way, in offset order, so it can only hold
fewer, longer runs, each request still inside one.

The log updates the state as it gives offsets to a batch (pending batches included: a retry
arriving while the first copy waits for its flush is caught), and checks every batch that
carries a producer identity (``attributes`` bit 3, docs/FORMAT.md) *before* any offset of the
request is given:

- no state for the id: any ``base_sequence`` is accepted if the id was issued
  (``producer_id_issued(pid)``, None: every id is), else UnknownProducerIdError (22);
- an epoch older than the stored one: ProducerFencedError (21); a newer one must start at
  sequence 0 (else OutOfOrderSequenceError, 20) and replaces the entry;
- the same epoch: ``base_sequence`` one after the newest run's ``last_sequence`` is new (the
  common case, the first test made); a batch whose sequences ``first..last`` lie inside one
  remembered run is a *duplicate*, answered with the offsets the run maps them to (not appended
  again: sequences are unique per producer id and epoch on a partition, so this is exact);
  anything else (a gap, sequences older than the runs remembered, a range crossing a run's end)
  is OutOfOrderSequenceError;
- a request is all or nothing: every idempotent batch of it a duplicate, at offsets one right
  after the other, and no other batch, or none; a mix is OutOfOrderSequenceError, with one
  exception, the *stored prefix*: a resend of a request that a crash cut after its first whole
  batches (kill -9 or power loss during the flush's ``writev``; recovery cuts only the torn
  batch).  It is accepted when every batch of the request carries the same producer id and
  epoch, their sequences follow one another, its first k batches are the tail of that
  producer's newest run (starting inside it, ending exactly at its ``last_sequence``), that run
  ends exactly at the log end (nothing was appended after it, by anyone, the pending batches
  included), and the remaining batches continue the sequence from there.  Only the remaining
  batches are appended, right after the prefix (extending the run), so the request's records
  are contiguous, and the request is answered from the prefix's first offset (not a duplicate:
  part of it is new).  Any other mix stays OutOfOrderSequenceError.  An error appends nothing
  of the request.

Snapshots (Kafka's ``.snapshot``): ``<base offset, 20 digits>.snapshot`` beside the segments holds
the state with every batch below that offset applied.  Layout (little-endian, docs/FORMAT.md)::

    u16 version (0) | u32 CRC32C of every byte after it | u32 entry count
    entry count x { i64 producer_id | i32 producer_epoch | i64 last_timestamp | u8 run_count (1..5)
                    run_count x { i64 first_sequence | i64 last_sequence |
                                  i64 first_offset | i64 last_offset } }

Entries are sorted by producer id, runs oldest first.  Decoding merges runs that follow one
another in sequence and offset (as the log would have), so a snapshot holding a run per batch
reads as the state the log would have built.  A snapshot is written (``.tmp``, fsync, rename, fsync of the
directory) by the log at each roll, at the new segment's base offset, and by a clean close at
the log end; the newest :data:`SNAPSHOTS_KEPT` are kept, those below the log start (retention)
and above the log end (truncation) are deleted.  One that does not parse is logged and removed.
Loading takes the newest valid snapshot at or below the log end and replays the batch headers
from its offset to the log end (:meth:`ProducerStateManager.load`, with the log's batches read
by hpbroker.io.producer_replay), then drops the producers wholly below the log start (a
snapshot older than a retention pass still holds them).

``last_timestamp`` is the broker's clock at the append (ms since the epoch); a state rebuilt from
the log takes the modification time of the ``.log`` holding the batch instead (no earlier than
the append, so a rebuild never expires a producer sooner than the append itself would have; the
clock at the rebuild if that is earlier).  Producers with no append for
``producer_id_expiration_ms`` are dropped by the retention pass (:meth:`expire`).

Single writer: only the log's owner calls this, on its thread.  File operations raise OSError.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

from hpbroker import _core
from hpbroker.errors import OutOfOrderSequenceError, ProducerFencedError, UnknownProducerIdError
from hpbroker.io.files import (
    fsync_dir,
    parse_segment_file_name,
    replace_atomically,
    segment_file_name,
    unlink_if_exists,
)

if TYPE_CHECKING:
    from hpbroker.io.producer_replay import ReplayedBatch

__all__ = [
    "ISSUED_CEILING_FILE_NAME",
    "MAX_RUNS_PER_PRODUCER",
    "SNAPSHOTS_KEPT",
    "SNAPSHOT_SUFFIX",
    "IssuedProducerIds",
    "ProducerEntry",
    "ProducerRun",
    "ProducerStateManager",
    "ProducerStateTable",
    "SnapshotCorruptError",
    "StoredPrefix",
    "decode_snapshot",
    "encode_snapshot",
    "read_issued_ceiling",
    "write_issued_ceiling",
]

logger = logging.getLogger(__name__)

MAX_RUNS_PER_PRODUCER = 5  # runs remembered per producer id (Kafka remembers 5 batches)
SNAPSHOTS_KEPT = 2  # newest snapshot files kept per partition
SNAPSHOT_SUFFIX = ".snapshot"  # <base offset, 20 digits>.snapshot: the producer state below that offset
SNAPSHOT_VERSION = 0  # the u16 that starts a snapshot
ISSUED_CEILING_FILE_NAME = "producer-ids-issued"  # in the broker's data_dir, written by the arbiter
ISSUED_CEILING_VERSION = "0"  # line 1 of that file

_HEAD = struct.Struct("<HII")  # version, crc32c, entry count
_CRC_START = 6  # the CRC covers every byte from here (the entry count on)
_ENTRY = struct.Struct("<qiqB")  # producer_id, producer_epoch, last_timestamp, run_count
_RUN = struct.Struct("<qqqq")  # first_sequence, last_sequence, first_offset, last_offset

# (first_sequence, last_sequence, first_offset, last_offset): a run of batches stored one right
# after the other (module docstring), or the stored copy of a range of sequences
ProducerRun = tuple[int, int, int, int]


class StoredPrefix(NamedTuple):
    """The first ``batch_count`` batches of a request are stored already, at offsets
    ``first_offset..last_offset`` ending at the log end: append only the batches after them
    (the stored prefix rule of the module docstring)."""

    batch_count: int
    first_offset: int
    last_offset: int


class SnapshotCorruptError(ValueError):
    """A snapshot file's bytes do not parse as a snapshot (never reaches a client: the state is
    then rebuilt from the log)."""


class ProducerEntry:
    """One producer id's state at this partition: its newest ``epoch``, ``last_timestamp`` (ms)
    and its newest runs of that epoch, oldest first (1 to MAX_RUNS_PER_PRODUCER, offsets
    ascending; module docstring)."""

    __slots__ = ("producer_id", "epoch", "last_timestamp", "runs")

    def __init__(self, producer_id: int, epoch: int, last_timestamp: int,
                 runs: list[ProducerRun] | None = None) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.last_timestamp = last_timestamp
        self.runs: list[ProducerRun] = runs if runs is not None else []

    def __repr__(self) -> str:
        return (f"ProducerEntry(producer_id={self.producer_id}, epoch={self.epoch}, "
                f"last_timestamp={self.last_timestamp}, runs={self.runs})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProducerEntry) and (
            (self.producer_id, self.epoch, self.last_timestamp, self.runs)
            == (other.producer_id, other.epoch, other.last_timestamp, other.runs))

    @property
    def last_sequence(self) -> int:
        return self.runs[-1][1]

    @property
    def last_offset(self) -> int:
        return self.runs[-1][3]

    def find(self, first_sequence: int, last_sequence: int) -> ProducerRun | None:
        """``(first_sequence, last_sequence, first_offset, last_offset)`` of the stored records
        of these sequences when they lie inside one remembered run, or None.  Newest run first:
        a retry is most likely of what was sent last."""
        runs = self.runs
        for k in range(len(runs) - 1, -1, -1):
            run_first, run_last, run_offset, _ = runs[k]
            if run_first <= first_sequence and last_sequence <= run_last:
                shift = run_offset - run_first
                return (first_sequence, last_sequence, first_sequence + shift, last_sequence + shift)
        return None


class ProducerStateTable:
    """Every producer id's :class:`ProducerEntry` at one partition, with the checks and updates of
    the module docstring.  ``last_offset`` is the largest ``last_offset`` of a batch applied (-1
    when none): what the state may know beyond a given log end."""

    __slots__ = ("entries", "last_offset")

    def __init__(self) -> None:
        self.entries: dict[int, ProducerEntry] = {}
        self.last_offset = -1

    def __len__(self) -> int:
        return len(self.entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProducerStateTable) and self.entries == other.entries

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self.entries.get(producer_id)

    def check(self, producer_ids: Sequence[int], producer_epochs: Sequence[int],
              base_sequences: Sequence[int], last_offset_deltas: Sequence[int],
              issued: Callable[[int], bool] | None = None, log_name: str = "",
              log_end_offset: int | None = None) -> ProducerRun | StoredPrefix | None:
        """Check one request's batches (one element per batch in each sequence; producer id -1:
        a batch without identity) against the state, changing nothing.  Per batch, never per
        record.

        Returns None when every batch is new (append them, then :meth:`update` each idempotent
        one), or, when every batch is an idempotent duplicate stored one right after the other,
        ``(first_sequence, last_sequence, first_offset, last_offset)`` spanning the stored copies
        (the first's firsts, the last's lasts), or a :class:`StoredPrefix` when the request
        resends a stored prefix of itself and continues it (module docstring; only with
        ``log_end_offset``, the log's end, pending batches included: None never takes that
        rule).  Raises OutOfOrderSequenceError, ProducerFencedError or UnknownProducerIdError
        (module docstring); later batches of the request see the earlier ones as stored."""
        entries = self.entries
        if len(producer_ids) == 1:  # the common case, first: one batch following its newest run
            entry = entries.get(producer_ids[0])
            if (entry is not None and producer_epochs[0] == entry.epoch
                    and base_sequences[0] == entry.runs[-1][1] + 1):
                return None
        seen: dict[int, tuple[int, int]] | None = None  # producer id -> (epoch, last_sequence) of new batches
        new = 0
        first: ProducerRun | None = None
        last: ProducerRun | None = None
        apart: tuple[ProducerRun, ProducerRun] | None = None  # two stored copies not one after the other
        for i in range(len(producer_ids)):
            pid = producer_ids[i]
            if pid >= 0:
                epoch, first_seq = producer_epochs[i], base_sequences[i]
                last_seq = first_seq + last_offset_deltas[i]
                earlier = seen.get(pid) if seen is not None else None
                if earlier is not None:  # follows a new batch of the same request
                    if epoch != earlier[0] or first_seq != earlier[1] + 1:
                        raise OutOfOrderSequenceError(
                            f"{_where(log_name, i, pid, epoch, first_seq, last_seq)}: does not follow the "
                            f"request's earlier batch of epoch {earlier[0]} ending at sequence {earlier[1]}")
                else:
                    where = (log_name, i, pid, epoch, first_seq, last_seq)
                    stored = _check_batch(entries.get(pid), issued, where)
                    if stored is not None:
                        if last is None:
                            first = stored
                        elif stored[2] != last[3] + 1 and apart is None:
                            apart = (last, stored)
                        last = stored
                        continue
                if seen is None:
                    seen = {}
                seen[pid] = (epoch, last_seq)
            new += 1
        if first is None:
            return None
        assert last is not None
        prefix = f"[{log_name}] " if log_name else ""
        if new:
            stored_prefix = _stored_prefix(entries.get(producer_ids[0]), producer_ids, producer_epochs,
                                           base_sequences, last_offset_deltas, log_end_offset)
            if type(stored_prefix) is StoredPrefix:
                return stored_prefix
            raise OutOfOrderSequenceError(
                f"{prefix}the request mixes batches already stored (offsets {first[2]}..{last[3]}) with "
                f"{new} new ones, and is no resend of a stored prefix ({stored_prefix}): nothing appended")
        if apart is not None:
            raise OutOfOrderSequenceError(
                f"{prefix}every batch of the request is stored already, but not one right after the other "
                f"(offsets {apart[0][2]}..{apart[0][3]}, then {apart[1][2]}..{apart[1][3]}): no request "
                "sent them so; nothing appended")
        return (first[0], last[1], first[2], last[3])

    def update(self, producer_id: int, epoch: int, first_sequence: int, last_sequence: int, first_offset: int,
               last_offset: int, timestamp: int) -> None:
        """Apply one stored batch: a new epoch (or a different one, met when replaying the log)
        restarts the entry; a batch following the newest run in sequence and offset extends it,
        any other starts a run (the oldest goes beyond MAX_RUNS_PER_PRODUCER)."""
        entry = self.entries.get(producer_id)
        if entry is None:
            self.entries[producer_id] = ProducerEntry(
                producer_id, epoch, timestamp, [(first_sequence, last_sequence, first_offset, last_offset)])
        elif entry.epoch != epoch:
            entry.epoch, entry.runs = epoch, [(first_sequence, last_sequence, first_offset, last_offset)]
        else:
            runs = entry.runs
            newest = runs[-1]
            if first_sequence == newest[1] + 1 and first_offset == newest[3] + 1:
                runs[-1] = (newest[0], last_sequence, newest[2], last_offset)
            else:
                runs.append((first_sequence, last_sequence, first_offset, last_offset))
                if len(runs) > MAX_RUNS_PER_PRODUCER:
                    del runs[0]
        if entry is not None and timestamp > entry.last_timestamp:
            entry.last_timestamp = timestamp
        if last_offset > self.last_offset:
            self.last_offset = last_offset

    def expire(self, before_ms: int) -> list[int]:
        """Drop producers whose last append is older than ``before_ms``; their ids."""
        gone = [pid for pid, entry in self.entries.items() if entry.last_timestamp < before_ms]
        for pid in gone:
            del self.entries[pid]
        return gone

    def drop_below(self, log_start_offset: int) -> list[int]:
        """Drop producers whose newest run ends below ``log_start_offset`` (retention deleted
        every batch they are remembered by); their ids."""
        gone = [pid for pid, entry in self.entries.items() if entry.last_offset < log_start_offset]
        for pid in gone:
            del self.entries[pid]
        return gone


def _check_batch(entry: ProducerEntry | None, issued: Callable[[int], bool] | None,
                 where: tuple[str, int, int, int, int, int]) -> ProducerRun | None:
    """One batch, the first of its producer in the request, against that producer's ``entry``:
    the stored copy it duplicates (its sequences and the offsets a run maps them to), or None
    when it is new; raises errors 20-22.  ``where``: ``(log_name, batch index, producer id,
    epoch, first_sequence, last_sequence)``."""
    _log_name, _i, pid, epoch, first_seq, last_seq = where
    if entry is not None and epoch == entry.epoch:
        if first_seq == entry.runs[-1][1] + 1:  # the common case, first: the newest run's next
            return None
        stored = entry.find(first_seq, last_seq)  # not the next one: stored, or a gap
        if stored is None:
            raise OutOfOrderSequenceError(
                f"{_where(*where)}: expected sequence {entry.last_sequence + 1} (the runs remembered hold "
                f"sequences {_ranges(entry)})")
        return stored
    if entry is None:
        if issued is not None and not issued(pid):
            raise UnknownProducerIdError(
                f"{_where(*where)}: this producer id was never issued; get one with InitProducerId")
        return None
    if epoch < entry.epoch:
        raise ProducerFencedError(
            f"{_where(*where)}: epoch {epoch} is older than epoch {entry.epoch} stored for this producer id")
    if first_seq != 0:
        raise OutOfOrderSequenceError(
            f"{_where(*where)}: a new epoch (stored: {entry.epoch}) must start at sequence 0")
    return None


def _stored_prefix(entry: ProducerEntry | None, producer_ids: Sequence[int], producer_epochs: Sequence[int],
                   base_sequences: Sequence[int], last_offset_deltas: Sequence[int],
                   log_end_offset: int | None) -> StoredPrefix | str:
    """A request that mixes stored and new batches, against the stored prefix rule (module
    docstring): the :class:`StoredPrefix`, or why the rule does not apply.  ``entry``: the state
    of the request's first batch's producer.  Only called for a mix, so cost does not matter."""
    if log_end_offset is None:
        return "no log end given"
    if entry is None:
        return "its first batch's producer has no state"
    pid, epoch = entry.producer_id, entry.epoch
    n = len(producer_ids)
    for i in range(n):
        if producer_ids[i] != pid or producer_epochs[i] != epoch:
            return f"not every batch is of producer id {pid}, epoch {epoch}"
    run_first, run_last, run_offset, run_last_offset = entry.runs[-1]
    start = base_sequences[0]
    if not run_first <= start <= run_last:
        return (f"its first batch (sequence {start}) does not lie in the producer's newest run "
                f"(sequences {run_first}..{run_last})")
    k = next((i for i in range(n) if base_sequences[i] == run_last + 1), None)
    if k is None or base_sequences[k - 1] + last_offset_deltas[k - 1] != run_last:
        end = run_last if k is None else base_sequences[k - 1] + last_offset_deltas[k - 1]
        return (f"its stored batches (sequences {start}..{end}) are not the tail of the producer's newest "
                f"run (sequences {run_first}..{run_last})")
    for i in range(1, n):
        expected = base_sequences[i - 1] + last_offset_deltas[i - 1] + 1
        if base_sequences[i] != expected:
            return f"its batch {i} starts at sequence {base_sequences[i]}, not {expected}"
    if run_last_offset != log_end_offset - 1:
        return (f"the producer's newest run ends at offset {run_last_offset}, not at the log end "
                f"{log_end_offset}")
    return StoredPrefix(k, run_offset + (start - run_first), run_last_offset)


def _where(log_name: str, i: int, pid: int, epoch: int, first_seq: int, last_seq: int) -> str:
    prefix = f"[{log_name}] " if log_name else ""
    return (f"{prefix}batch {i} of the request (producer id {pid}, epoch {epoch}, sequences "
            f"{first_seq}..{last_seq})")


def _ranges(entry: ProducerEntry) -> str:
    return ", ".join(f"{r[0]}..{r[1]}" for r in entry.runs)


# --- snapshots --------------------------------------------------------------------------------


def encode_snapshot(table: ProducerStateTable) -> bytes:
    """The snapshot bytes of ``table`` (layout in the module docstring)."""
    parts = [struct.pack("<I", len(table.entries))]
    for pid in sorted(table.entries):
        entry = table.entries[pid]
        parts.append(_ENTRY.pack(pid, entry.epoch, entry.last_timestamp, len(entry.runs)))
        parts.extend(_RUN.pack(*run) for run in entry.runs)
    body = b"".join(parts)
    return struct.pack("<HI", SNAPSHOT_VERSION, _core.crc32c(body)) + body


def decode_snapshot(data: bytes, snapshot_offset: int | None = None) -> ProducerStateTable:
    """The table in ``data``; SnapshotCorruptError (saying why) when it is not a valid snapshot.
    ``snapshot_offset``: the offset the file is named by, which every run must lie below.  Runs
    that follow one another in sequence and offset are merged (module docstring)."""
    if len(data) < _HEAD.size:
        raise SnapshotCorruptError(f"{len(data)} bytes, shorter than the {_HEAD.size}-byte head")
    version, crc, count = _HEAD.unpack_from(data)
    if version != SNAPSHOT_VERSION:
        raise SnapshotCorruptError(f"version {version}, expected {SNAPSHOT_VERSION}")
    computed = _core.crc32c(memoryview(data)[_CRC_START:])
    if crc != computed:
        raise SnapshotCorruptError(f"CRC mismatch: stored 0x{crc:08x}, computed 0x{computed:08x}")
    table = ProducerStateTable()
    position = _HEAD.size
    for _ in range(count):
        if position + _ENTRY.size > len(data):
            raise SnapshotCorruptError(f"entry at position {position} cut off by the end at {len(data)}")
        pid, epoch, timestamp, run_count = _ENTRY.unpack_from(data, position)
        position += _ENTRY.size
        if pid < 0 or epoch < 0 or not 1 <= run_count <= MAX_RUNS_PER_PRODUCER or pid in table.entries:
            raise SnapshotCorruptError(f"entry at position {position - _ENTRY.size}: producer id {pid}, "
                                       f"epoch {epoch}, {run_count} runs (repeated or impossible)")
        if position + run_count * _RUN.size > len(data):
            raise SnapshotCorruptError(f"the runs of producer id {pid} are cut off by the end at {len(data)}")
        runs = [_RUN.unpack_from(data, position + k * _RUN.size) for k in range(run_count)]
        position += run_count * _RUN.size
        _check_runs(pid, runs, snapshot_offset)
        table.entries[pid] = ProducerEntry(pid, epoch, timestamp, _merged(runs))
        table.last_offset = max(table.last_offset, runs[-1][3])
    if position != len(data):
        raise SnapshotCorruptError(f"{len(data) - position} bytes after the last of {count} entries")
    return table


def _check_runs(pid: int, runs: list[ProducerRun], snapshot_offset: int | None) -> None:
    previous_end = -1
    for first_seq, last_seq, first_offset, last_offset in runs:
        if (not 0 <= first_seq <= last_seq or not 0 <= first_offset <= last_offset
                or last_seq - first_seq != last_offset - first_offset or first_offset <= previous_end
                or (snapshot_offset is not None and last_offset >= snapshot_offset)):
            raise SnapshotCorruptError(
                f"producer id {pid}: impossible run (sequences {first_seq}..{last_seq}, offsets "
                f"{first_offset}..{last_offset}, snapshot at {snapshot_offset})")
        previous_end = last_offset


def _merged(runs: list[ProducerRun]) -> list[ProducerRun]:
    """``runs`` (checked) with each one that follows the one before it in sequence and offset
    joined to it, as :meth:`ProducerStateTable.update` joins batches."""
    merged = [runs[0]]
    for run in runs[1:]:
        newest = merged[-1]
        if run[0] == newest[1] + 1 and run[2] == newest[3] + 1:
            merged[-1] = (newest[0], run[1], newest[2], run[3])
        else:
            merged.append(run)
    return merged


def snapshot_file_name(offset: int) -> str:
    return segment_file_name(offset, SNAPSHOT_SUFFIX)


def list_snapshots(directory: str) -> list[int]:
    """The offsets of the snapshot files in ``directory``, ascending."""
    offsets = []
    for name in os.listdir(directory):
        parsed = parse_segment_file_name(name)
        if parsed is not None and parsed[1] == SNAPSHOT_SUFFIX:
            offsets.append(parsed[0])
    return sorted(offsets)


def write_snapshot(directory: str, offset: int, table: ProducerStateTable) -> str:
    """Write ``table`` as the snapshot at ``offset``, durably (``.tmp``, fsync, rename, fsync of
    the directory); its path."""
    path = os.path.join(directory, snapshot_file_name(offset))
    replace_atomically(path, encode_snapshot(table))
    return path


# --- the issued ceiling -------------------------------------------------------------------------


def write_issued_ceiling(data_dir: str, ceiling: int) -> None:
    """Replace ``<data_dir>/producer-ids-issued`` with ``0\n<ceiling>\n`` atomically (tmp +
    rename) but not durably: the arbiter rewrites it from its durable id block at start
    (hpbroker.coord.producer_ids, the one writer).  Raises OSError."""
    if ceiling < 0:
        raise ValueError(f"issued ceiling {ceiling} is negative")
    replace_atomically(os.path.join(data_dir, ISSUED_CEILING_FILE_NAME),
                       f"{ISSUED_CEILING_VERSION}\n{ceiling}\n".encode("ascii"), durable=False)


def read_issued_ceiling(data_dir: str) -> int:
    """One more than the highest producer id the broker has handed out, from
    ``<data_dir>/producer-ids-issued`` (ASCII: line 1 the format version ``0``, line 2 the
    ceiling, each ending with a newline; written by :func:`write_issued_ceiling` before the
    arbiter answers an InitProducerId).  0 when the file is missing (no id issued yet).
    ValueError when it does not parse, OSError when it cannot be read."""
    path = os.path.join(data_dir, ISSUED_CEILING_FILE_NAME)
    try:
        with open(path, "rb") as f:
            raw = f.read(256)
    except FileNotFoundError:
        return 0
    lines = raw.decode("ascii", "replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != 2 or lines[0] != ISSUED_CEILING_VERSION or not (lines[1].isascii()
                                                                    and lines[1].isdigit()):
        raise ValueError(f"{path} does not hold version {ISSUED_CEILING_VERSION} and a ceiling: {raw[:64]!r}")
    return int(lines[1])


class IssuedProducerIds:
    """``producer_id_issued`` for the logs of one broker: whether a producer id was handed out.
    An id below the ceiling last read is; otherwise the file is read again (only then: a miss
    means a producer the partitions have no state for), and an id at or above the new ceiling
    was never issued.  A file that cannot be read keeps the ceiling read before (logged)."""

    def __init__(self, data_dir: str) -> None:
        self._data_dir = data_dir
        self.ceiling = 0
        self.reads = 0

    def __call__(self, producer_id: int) -> bool:
        if producer_id < self.ceiling:
            return True
        self.reads += 1
        try:
            self.ceiling = max(self.ceiling, read_issued_ceiling(self._data_dir))
        except (OSError, ValueError) as e:
            logger.warning("cannot read the issued producer ids from %s: %s", self._data_dir, e)
        return producer_id < self.ceiling


# --- the manager --------------------------------------------------------------------------------


class ProducerStateManager:
    """The producer state of the partition log in ``directory``: the :class:`ProducerStateTable`
    the log checks and updates, and its snapshot files (module docstring).  Owned by the log."""

    def __init__(self, directory: str, *, name: str = "",
                 producer_id_issued: Callable[[int], bool] | None = None) -> None:
        self.directory = directory
        self.name = name
        self.producer_id_issued = producer_id_issued
        self.table = ProducerStateTable()
        self.loaded_from: int | None = None  # the snapshot offset the last load started from

    def check(self, scan: _core.ScanResult, log_end_offset: int) -> ProducerRun | StoredPrefix | None:
        """:meth:`ProducerStateTable.check` of a validated request, for a log ending at
        ``log_end_offset`` (pending batches included)."""
        return self.table.check(scan.producer_ids, scan.producer_epochs, scan.base_sequences,
                                scan.last_offset_deltas, self.producer_id_issued, self.name, log_end_offset)

    def load(self, log_start_offset: int, log_end_offset: int, *, now_ms: int, expiration_ms: int,
             unexpired_offset: int, replay: Callable[[int], Iterator[ReplayedBatch]]) -> None:
        """Rebuild the state of a log holding ``[log_start_offset, log_end_offset)``: delete the
        snapshots outside that range (a snapshot at either end stays), take the newest one that
        parses (removing those that do not), then apply every batch ``replay(start)`` yields from
        its offset on (without one: from ``unexpired_offset``, the first segment whose records
        may not have expired), in offset order, joined into runs as at append, and drop the
        producers wholly below ``log_start_offset`` and those expired at ``now_ms``.  Raises
        OSError."""
        self.table = ProducerStateTable()
        self.loaded_from = None
        snapshots = list_snapshots(self.directory)
        beyond = False
        for offset in snapshots:
            if offset < log_start_offset or offset > log_end_offset:
                self._delete(offset, "outside the log's offsets "
                             f"[{log_start_offset}, {log_end_offset}]")
                beyond = beyond or offset > log_end_offset
        if beyond:  # durably: back after a power loss, it would describe offsets given again since
            fsync_dir(self.directory)
        start = max(unexpired_offset, log_start_offset)
        for offset in reversed([o for o in snapshots if log_start_offset <= o <= log_end_offset]):
            path = os.path.join(self.directory, snapshot_file_name(offset))
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:  # unreadable (EIO, permissions): an older one, or the log, serves
                logger.warning("[%s] cannot read the producer snapshot %s (%s): rebuilding the state "
                               "without it", self.name, path, e)
                continue
            try:
                self.table = decode_snapshot(data, offset)
            except SnapshotCorruptError as e:
                logger.warning("[%s] removing the producer snapshot %s: %s", self.name, path, e)
                unlink_if_exists(path)
                continue
            self.loaded_from = start = offset
            break
        replayed = 0
        for batch in replay(start):
            timestamp = min(batch.timestamp, now_ms)
            self.table.update(batch.producer_id, batch.producer_epoch, batch.base_sequence,
                              batch.base_sequence + batch.last_offset - batch.base_offset, batch.base_offset,
                              batch.last_offset, timestamp)
            replayed += 1
        # A snapshot written before retention moved the log start still holds the producers it
        # dropped: their stored batches are gone, so a retry of them is no duplicate.
        dropped = self.table.drop_below(log_start_offset)
        expired = self.table.expire(now_ms - expiration_ms)
        logger.info("[%s] producer state: %d producer ids, from %s and %d batches replayed from offset %d "
                    "(%d below the log start, %d expired)", self.name, len(self.table),
                    "no snapshot" if self.loaded_from is None else f"the snapshot at {self.loaded_from}",
                    replayed, start, len(dropped), len(expired))

    def take_snapshot(self, offset: int) -> bool:
        """Write the state as the snapshot at ``offset`` (every batch below it applied, none at
        or above it), keep the newest SNAPSHOTS_KEPT.  Best effort: a failure is logged (the next
        open replays more of the log) and False returned."""
        try:
            write_snapshot(self.directory, offset, self.table)
            for old in list_snapshots(self.directory)[:-SNAPSHOTS_KEPT]:
                self._delete(old, "older than the newest two")
        except OSError as e:
            logger.warning("[%s] the producer snapshot at offset %d was not written: %s", self.name, offset,
                           e)
            return False
        return True

    def truncate_head(self, log_start_offset: int) -> None:
        """Retention moved the log start: drop the producers wholly below it and the snapshots
        below it.  Raises OSError."""
        gone = self.table.drop_below(log_start_offset)
        if gone:
            logger.info("[%s] dropped %d producer ids whose runs all end below the log start %d",
                        self.name, len(gone), log_start_offset)
        for offset in list_snapshots(self.directory):
            if offset < log_start_offset:
                self._delete(offset, f"below the log start {log_start_offset}")

    def clear(self) -> None:
        """The log was emptied and starts again elsewhere: forget every producer and delete every
        snapshot (not fsynced here: the log fsyncs its directory).  Raises OSError."""
        if self.table:
            logger.info("[%s] forgot %d producer ids: the log was emptied", self.name, len(self.table))
        self.table = ProducerStateTable()
        self.loaded_from = None
        for offset in list_snapshots(self.directory):
            self._delete(offset, "the log was emptied")

    def expire(self, now_ms: int, expiration_ms: int) -> None:
        gone = self.table.expire(now_ms - expiration_ms)
        if gone:
            logger.info("[%s] expired %d producer ids with no append for %d ms", self.name, len(gone),
                        expiration_ms)

    def _delete(self, offset: int, why: str) -> None:
        path = os.path.join(self.directory, snapshot_file_name(offset))
        if unlink_if_exists(path):
            logger.info("[%s] removed the producer snapshot %s: %s", self.name, path, why)
