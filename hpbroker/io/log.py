"""The log of one partition: :class:`PartitionLog`, its segments, flushing, reading, retention.

Layout: one directory per partition (the caller picks it, e.g. ``<data_dir>/<topic>-<partition>``)
holding the segments, each named by its base offset (``00000000000000000000.log``, ``.index``,
``.timeindex``; formats in ``hpbroker.io.segment``), ``recovery-point-offset-checkpoint`` and,
between a clean close and the next open, ``clean-shutdown`` (both in ``hpbroker.io.checkpoint``),
and ``leader-epoch-checkpoint`` (``hpbroker.io.leader_epochs``).

What a replica needs, and nothing of replication itself (the replica state machine lives above
storage): :meth:`PartitionLog.append_replicated` appends a leader's batches as they are (base
offsets, leader epochs and bytes kept, so a follower's segments hold the leader's very bytes),
:meth:`PartitionLog.begin_leader_epoch` records where a new leader's epoch begins (in the
``leader-epoch-checkpoint`` file before any record of the epoch is written), and
``truncate_to`` / ``truncate_fully_and_start_at`` (hpbroker.io.truncation) cut the log back, to
an offset or to nothing.
The first record of a partition has offset 0; offsets are contiguous from ``log_start_offset``
to ``log_end_offset``.

Life of an append: the buffer is deep-validated, each batch is given the next offsets and goes
into the *pending* list (a producer buffer that is ``bytes`` is not copied; only the 16-byte
prefix holding ``base_offset`` and ``leader_epoch`` is, to be stamped).  A *flush* writes every
pending batch to the active segment with one ``writev`` and, by default, ``fdatasync``\\s it:
group commit.  A flush happens when ``flush_messages`` records are pending, when the oldest
pending append is ``flush_ms`` old (checked on append and by :meth:`PartitionLog.flush_if_due`,
which an event loop calls at :attr:`PartitionLog.flush_deadline_ms`), on a roll, and on close.
Only flushed records are readable: ``high_watermark`` is the end of the flushed data.

Clocks: two, both injectable.  The *wall clock* (ms since the epoch) is what Kafka measures
with: the check of record timestamps (``message_timestamp_after_max_ms``), segment age
(``segment_ms`` where timestamps are missing), retention and producer-id expiry.  The
*monotonic clock* (:func:`monotonic_ms`, never stepped) measures the delays that must not
depend on the date: the ``flush_ms`` deadline and ``file_delete_delay_ms``.  So a step of the
wall clock (NTP, an operator setting the date) never holds back a group commit, and so never
an acknowledgement: records pending when the wall clock steps back an hour are still flushed
``flush_ms`` after their append.

Pipelined group commit: with ``flush_on_append=False`` the owner starts each flush itself
(:meth:`PartitionLog.begin_flush`), runs the returned :class:`FlushJob` on a flusher (a native
:class:`~hpbroker.io._writer.WriterThread`, or any thread), and applies it with
:meth:`PartitionLog.complete_flush` when the job is done.  The job's ``writev`` and ``fdatasync``
run in C without the GIL, so validating and appending the next requests overlaps the disk
write of the previous group.  Any number of jobs may be in flight; they write in the order they
were begun (each waits for its predecessor) and are applied in that order.  Rolls, ``flush()``
and ``close()`` first complete every job in flight: they wait for one a flusher thread is
running, and run one themselves if none has started it (a job runs at most once, see
:class:`FlushJob`).

Durability, exactly:

- A record is *acknowledged* once the flush that wrote it has returned (``high_watermark`` has
  passed it).  Pending records are never acknowledged; a crash of any kind may lose them.
- ``flush_fsync=True`` (default): acknowledged records were fdatasync'd and survive a process
  crash (``kill -9``), an OS crash and a power loss.
- ``flush_fsync=False``: acknowledged records are in the OS page cache.  They survive the
  process being killed (the kernel still writes them out and the next open finds them), but an
  OS crash or power loss may lose any of them that the kernel had not written back; segments
  are still fsynced when rolled, checkpointed and on close.
- After any crash, opening the log re-checks every segment written since the last checkpoint
  (length, CRC and offsets) and cuts only a torn tail: bad bytes at the end of the last segment,
  past the recovery point; with ``flush_fsync=True`` no acknowledged record is in it.  Damage
  anywhere else is contained as a *damaged range* (hpbroker.io.loader, hpbroker.io.damage):
  every valid batch after it stays, and the log end never moves below the recovery point.
  Segments below the checkpoint were fsynced when rolled and are checked cheaply (their indexes
  against batch headers and the end of their log), not re-read in full.
- After a clean close (:meth:`PartitionLog.close` returned: everything flushed and fsynced, the
  checkpoint at the log end, and only then the ``clean-shutdown`` marker written and fsynced),
  the next open checks every segment that cheaply, the active one included.  That open removes
  the marker, durably, before it changes any segment, index or checkpoint file, so a crash
  after it is "any crash" again.
- Index entries are written at each flush without fsync; they are fsynced on roll, checkpoint
  and close, and always rebuilt from the log when they cannot be trusted.

Idempotent producers (hpbroker.io.producer_state): the log keeps, per producer id, its newest
epoch and newest five runs (sequences and offsets of batches stored one right after the other
with consecutive sequences: a producer alone on the partition has one run, however many
requests it sent), updated as batches get their offsets, the pending ones included.  ``append``
checks every batch carrying a producer identity before it gives any offset: a request all of
whose batches are stored already returns the stored copy's offsets with ``AppendInfo.duplicate``
and appends nothing; a resend of a request a crash cut after its first whole batches, whose
stored prefix ends at the log end, appends only the rest, right after the prefix; a gap, an
older epoch, an id never issued or any other mix of stored and new batches raise errors 20-22
and append nothing.  The state is snapshotted
(``<offset>.snapshot``) at each roll and clean close; open loads the newest valid snapshot and
re-reads the batch headers after it through the read path (damaged ranges skipped);
``resume_writes`` rebuilds it the same way, so the batches a write failure dropped leave it;
retention and ``producer_id_expiration_ms`` trim it.

Errors: an ``OSError`` from any disk operation becomes :class:`~hpbroker.errors.StorageError`
(the ``OSError`` as its cause).  Two states follow, depending on what failed:

- *writes failed* (:attr:`PartitionLog.write_failure` is set): an append, flush, roll,
  checkpoint, retention pass or the open's checkpoint failed, typically ``ENOSPC`` (disk full) or
  a failed ``fdatasync``.  What was not acknowledged is dropped at once: the pending records and
  the flushes in flight are never acknowledged (``log_end_offset`` goes back to the high
  watermark, so offsets stay contiguous), and the bytes a failed ``writev`` may have left past
  the high watermark are truncated away.  Appends raise StorageError (its message says "no
  space left on device" for ``ENOSPC``/``EDQUOT``); reads of the flushed, acknowledged records
  go on, and so does retention (which frees space).  The owner calls
  :meth:`PartitionLog.resume_writes` now and then (with backoff): it truncates the active
  segment to the acknowledged size again, drops that segment's cached pages and reloads the log
  through recovery (hpbroker.io.loader) from the recovery point, the last fsynced offset, so
  the tail is re-read from the disk and validated before anything is appended after it.  A
  failed ``fdatasync`` is never retried as if the data were safe (after one, the kernel may have
  dropped the dirty pages, and a second ``fdatasync`` reports success): the records it covered
  are never acknowledged, and the re-read decides what the log holds.
- *offline* (:attr:`PartitionLog.offline`): any other disk operation failed (a read): every
  later call raises StorageError; close it and reopen (recovery repairs what can be repaired).

Damaged data met while reading (flushed bytes that do not parse as the batch the index or the
previous batch says starts there, a batch running past the end of its segment) is not a disk
error: the segment's indexes are rebuilt by a full scan, which contains the damage as a damaged
range, and reads that reach it raise :class:`~hpbroker.errors.DamagedRangeError` naming the
segment file, the positions and offsets, and the offset where reading can go on; records that
fail their CRC when ``offset_for_timestamp`` decodes them raise CorruptRecordError.  The log
stays *online*: appends, and reads that do not reach the damage, go on.  Reading never changes
a ``.log``, and neither does opening, below the recovery point: damage stays until retention
deletes its segment (:attr:`PartitionLog.damaged_ranges` lists what is known).  Reads hand out
slices for sendfile without checking CRCs: consumers check them.

Concurrency: not thread-safe.  One owner (the worker process that owns the partition) makes
every call; other processes may read the files, never write them.  One writer per directory is
enforced: an open log holds an exclusive ``flock`` on the directory's ``.lock`` file, and a second
open, in any process, fails with StorageError until the first is closed or its process dies.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import errno
import functools
import logging
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from hpbroker import _core
from hpbroker.errors import (
    CorruptRecordError,
    DamagedRangeError,
    HPBrokerError,
    InvalidRecordError,
    InvalidTimestampError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
    error_for_code,
)
from hpbroker.io import truncation
from hpbroker.io.checkpoint import CleanShutdownMarker, DamagedSegments, RecoveryPointCheckpoint
from hpbroker.io.config import MAX_SEGMENT_BYTES, LogConfig
from hpbroker.io.damage import DamagedRange
from hpbroker.io.files import fsync_dir, lock_directory, make_directory, pread_full
from hpbroker.io.flush_job import FlushJob
from hpbroker.io.index import IndexCorruptError
from hpbroker.io.leader_epochs import UNDEFINED_EPOCH, LeaderEpochCache
from hpbroker.io.loader import load_segments, reload_last_segment
from hpbroker.io.logfile import FileSlice
from hpbroker.io.producer_replay import replay_batches, unexpired_offset
from hpbroker.io.producer_state import ProducerStateManager, ProducerStateTable, StoredPrefix
from hpbroker.io.segment import STAMP_BYTES, PendingBatch, Segment

__all__ = ["MAX_PENDING_BYTES", "AppendInfo", "FlushJob", "PartitionLog"]

logger = logging.getLogger(__name__)

# Flush early once this much is pending, whatever flush_messages says: bounds the producer
# buffers a log holds on to (flushing sooner is always allowed).
MAX_PENDING_BYTES = 64 << 20
# Index entries hold offsets relative to the segment's base offset as u32.
_MAX_RELATIVE_OFFSET = 2**32 - 1
# A batch's base offset (i64) and leader epoch (i32), little-endian, outside the CRC (docs/FORMAT.md).
_BASE_OFFSET = struct.Struct("<q")
_LEADER_EPOCH = struct.Struct("<i")
_T = TypeVar("_T")
BytesLike = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """What :meth:`PartitionLog.append` assigned: offsets ``first_offset..last_offset`` to
    ``record_count`` records in ``batch_count`` batches (the whole request).  ``duplicate``:
    every batch of the request was stored already (an idempotent producer's retry); nothing was
    appended, and the offsets are those of the stored copy, which may still be pending.
    ``duplicate_records``: how many of the records were stored already and not appended again:
    all of them for a duplicate; for a resend of a request a crash cut after its first whole
    batches (the stored prefix rule, hpbroker.io.producer_state), the prefix's records: the rest
    was appended right after the prefix, ``first_offset`` is the prefix's first and
    ``duplicate`` is False (part of it is new, so answer once ``last_offset`` is flushed);
    else 0."""

    first_offset: int
    last_offset: int
    record_count: int
    batch_count: int
    duplicate: bool = False
    duplicate_records: int = 0


def _held_view(buf: BytesLike, immutable: bool) -> memoryview:
    """A flat byte view of ``buf`` that the log may hold until the flush: ``buf`` itself when
    its bytes cannot change (``bytes``, or declared ``immutable``), else a copy."""
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if not immutable and not _backed_by_bytes(view):
        view = memoryview(view.tobytes())
    return view


def _backed_by_bytes(view: memoryview) -> bool:
    """Whether the memory under ``view`` is a ``bytes`` object, the one exporter whose bytes
    cannot change (views of views are followed down to the object that owns the memory)."""
    owner = view.obj
    while isinstance(owner, memoryview):
        owner = owner.obj
    return type(owner) is bytes


def _default_clock() -> int:
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    """The log's default monotonic clock, in ms (``time.monotonic_ns``): what
    :attr:`PartitionLog.flush_deadline_ms` is measured on, for an event loop's poll timeout."""
    return time.monotonic_ns() // 1_000_000


def _guarded(on_os_error: str) -> Callable[[Callable[..., _T]], Callable[..., _T]]:
    """A decorator that refuses calls on a closed or offline log and hands an ``OSError`` to the
    log's method ``on_os_error`` (``(operation, error) -> StorageError``), raising what it returns."""

    def decorate(method: Callable[..., _T]) -> Callable[..., _T]:
        @functools.wraps(method)
        def guarded(self: PartitionLog, *args: object, **kwargs: object) -> _T:
            self._check_usable()
            try:
                return method(self, *args, **kwargs)
            except OSError as e:
                raise getattr(self, on_os_error)(method.__name__, e) from e

        return guarded

    return decorate


# The one place disk errors are handled: an OSError takes the log offline.
_disk_operation = _guarded("_go_offline")
# The one place write errors are handled: an OSError puts the log in the *writes failed* state
# (module docstring), and reads go on.  Whether a method also refuses to run while writes are
# failed is its own business (PartitionLog._check_writable).
_write_operation = _guarded("_fail_writes")


# Write errors that mean "the filesystem is full": the log waits until it can allocate
# RESUME_MIN_FREE_BYTES before it tries to resume.
_NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
RESUME_MIN_FREE_BYTES = 256 << 10
SPACE_PROBE_NAME = "space-probe.tmp"  # the file that tells whether RESUME_MIN_FREE_BYTES are free


class PartitionLog:
    """An ordered list of segments; the last one, the *active* segment, takes appends.

    Invariants: segments are sorted by base offset, each starts where its predecessor ends, and
    only the active one grows; ``log_start_offset <= high_watermark <= log_end_offset``;
    pending batches all belong to the active segment (a roll flushes first).  Opening runs
    recovery (hpbroker.io.loader) before the constructor returns.
    """

    def __init__(self, directory: str | os.PathLike[str], config: LogConfig | None = None, *,
                 clock: Callable[[], int] | None = None,
                 monotonic_clock: Callable[[], int] | None = None, name: str | None = None,
                 flush_on_append: bool = True,
                 producer_id_issued: Callable[[int], bool] | None = None) -> None:
        """Open (creating it and its missing parents if needed, durably: each new directory's
        parent is fsynced) and recover the log in ``directory``.  ``clock`` returns
        the wall-clock time in ms since the epoch, ``monotonic_clock`` ms on a clock that never
        steps (default :func:`monotonic_ms`); both are for tests (module docstring, *Clocks*,
        says which measures what).  ``name`` prefixes log messages (default:
        the directory's name, e.g. ``orders-3``).  ``flush_on_append=False`` hands flushing to
        the owner: append never writes (except to roll), and the owner runs group commits with
        :meth:`flush_due`, :meth:`begin_flush` and :meth:`complete_flush`.

        :attr:`on_flush`, when the owner sets it, is called with every :class:`FlushJob` the log
        applies successfully (pipelined or synchronous, the ones a roll or close completes
        included), on the owner's thread, after the high watermark moved: for measurements
        (``job.written``, ``job.records``, ``job.write_ns``, ``job.sync_ns``); it must not
        call the log.  :attr:`on_sync`, likewise, is called with the nanoseconds of every other
        fdatasync of a segment's ``.log`` the log issues once open (a roll's, a checkpoint's, a
        close's, a synchronous flush's catching up on what flushes wrote without syncing): with
        the flush jobs that synced, every data sync the log makes.

        ``producer_id_issued(producer_id) -> bool`` tells whether an idempotent producer the
        partition has no state for got its id from the broker (UnknownProducerIdError if not);
        None: every id is taken as issued (hpbroker.io.producer_state)."""
        self._directory = os.fspath(directory)
        self._config = config if config is not None else LogConfig()
        self._clock = clock if clock is not None else _default_clock
        self._monotonic_clock = monotonic_clock if monotonic_clock is not None else monotonic_ms
        self._name = name or os.path.basename(os.path.normpath(self._directory))
        self._offline = self._closed = False
        self._write_failure: StorageError | None = None  # why appends are refused (writes failed)
        self._write_errno: int | None = None  # the errno of the last write failure
        self._segments: list[Segment] = []
        self._bases: list[int] = []  # base offsets of _segments, for bisect
        self._gaps: list[DamagedRange] = []  # offsets between segments that no segment holds
        self._pending: list[PendingBatch] = []
        self._pending_bytes = self._pending_records = 0
        self._pending_since_ms: int | None = None  # monotonic clock ms of the oldest pending append
        self._flush_on_append = flush_on_append
        self._in_flight: collections.deque[FlushJob] = collections.deque()  # oldest first
        self._doomed: list[tuple[int, Segment]] = []  # (close at, monotonic clock ms; deleted segment)
        self._checkpoint = RecoveryPointCheckpoint(self._directory)
        self._clean_shutdown = CleanShutdownMarker(self._directory)
        self._damaged_segments = DamagedSegments(self._directory)
        self._damage_listed: set[int] = set()  # what the damaged-segments file says
        self._lock_fd = -1
        self.on_flush: Callable[[FlushJob], None] | None = None
        self.on_sync: Callable[[int], None] | None = None
        self._producers = ProducerStateManager(self._directory, name=self._name,
                                               producer_id_issued=producer_id_issued)
        self._leader_epochs: LeaderEpochCache | None = None
        try:
            self._open()
        except OSError as e:
            self._release()
            raise StorageError(f"[{self._name}] cannot open the log in {self._directory}: {e}") from e
        except BaseException:
            self._release()  # the directory's lock above all: a later open in this process must work
            raise

    def _open(self) -> None:
        started = time.monotonic()
        make_directory(self._directory)
        self._lock_fd = lock_directory(self._directory)
        checkpointed = self._checkpoint.read()
        closed_at = self._clean_shutdown.take()  # before anything is written
        clean = closed_at is not None and closed_at == checkpointed
        now = self._clock()
        self._damage_listed = self._damaged_segments.read()
        loaded = load_segments(self._directory, self._config, checkpointed or 0, now_ms=now,
                               log_name=self._name, clean_shutdown=clean, damaged_bases=self._damage_listed)
        self._segments, self._gaps = loaded.segments, loaded.gaps
        self._list_damaged_segments()
        self._bases = [segment.base_offset for segment in self._segments]
        for segment in self._segments:
            segment.sync()  # recovered segments may hold what was only in the page cache
        for segment in self._segments[:-1]:
            segment.release_index_files()
        active = self._segments[-1]
        self._log_end_offset = self._recovery_point = active.next_offset
        self._active_first_timestamp = active.first_batch_timestamp  # -1: none yet
        if checkpointed != self._recovery_point:
            try:
                self._checkpoint.write(self._recovery_point)
            except OSError as e:  # a full disk: open for reads, appends wait for resume_writes
                self._fail_writes("open", e)
        self._load_producer_state(now)
        self._leader_epochs = LeaderEpochCache(self._directory, name=self._name)
        self._leader_epochs.truncate_from_end(self._log_end_offset)  # a truncation a crash cut short
        self._leader_epochs.truncate_from_start(self.log_start_offset)
        logger.info("[%s] opened %s: %d segments, offsets [%d, %d), %d bytes, in %.3f s",
                    self._name, self._directory, len(self._segments), self.log_start_offset,
                    self._log_end_offset, self.size_in_bytes, time.monotonic() - started)

    def __repr__(self) -> str:
        if not self._segments:
            return f"PartitionLog({self._directory!r}, not open)"
        return (f"PartitionLog({self._directory!r}, log_start_offset={self.log_start_offset}, "
                f"high_watermark={self.high_watermark}, log_end_offset={self._log_end_offset})")

    def __enter__(self) -> PartitionLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- state ---------------------------------------------------------------------------------

    @property
    def directory(self) -> str:
        return self._directory

    @property
    def name(self) -> str:
        return self._name

    @property
    def config(self) -> LogConfig:
        return self._config

    def reconfigure(self, config: LogConfig) -> None:
        """Replace the settings of the open log.  Each takes effect where it is next read: the
        flush policy and ``max_message_bytes`` at the next append or flush decision (flushes in
        flight keep their fsync choice), ``segment_bytes`` and ``segment_ms`` at the next roll
        decision, retention at the next :meth:`delete_old_segments`, ``index_interval_bytes``
        with the next segment, ``file_delete_delay_ms`` for segments deleted from then on."""
        changed = {f: getattr(config, f) for f in config.__dataclass_fields__
                   if getattr(config, f) != getattr(self._config, f)}
        self._config = config
        if changed:
            logger.info("[%s] settings changed: %s", self._name,
                        ", ".join(f"{k}={v}" for k, v in sorted(changed.items())))

    @property
    def log_start_offset(self) -> int:
        """The first offset still in the log (moves up when retention deletes segments)."""
        return self._segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended record gets (pending records included)."""
        return self._log_end_offset

    @property
    def high_watermark(self) -> int:
        """The end of the flushed, readable records."""
        return self._segments[-1].next_offset

    @property
    def recovery_point(self) -> int:
        """Every record below this offset is fsynced.  The checkpoint file, written on roll,
        :meth:`checkpoint` and close (each time with the indexes of the segments below it fsynced),
        may lag behind; recovery starts from the checkpointed value."""
        return self._recovery_point

    @property
    def size_in_bytes(self) -> int:
        """Bytes of flushed batches in all segments (pending batches not included)."""
        return sum(segment.size_in_bytes for segment in self._segments)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The segments, oldest first; the last is the active one.  Look, do not touch."""
        return tuple(self._segments)

    @property
    def pending_records(self) -> int:
        """Records appended but not yet flushed (so not yet readable), in flight included."""
        return self._pending_records + sum(job.records for job in self._in_flight)

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes + sum(job.size for job in self._in_flight)

    @property
    def flushes_in_flight(self) -> tuple[FlushJob, ...]:
        """The group commits begun and not yet completed, oldest first."""
        return tuple(self._in_flight)

    @property
    def flush_deadline_ms(self) -> int | None:
        """When the pending records must be flushed, in ms on the log's monotonic clock
        (:func:`monotonic_ms` unless one was injected), None if nothing is pending."""
        if self._pending_since_ms is None:
            return None
        return self._pending_since_ms + self._config.flush_ms

    @property
    def offline(self) -> bool:
        return self._offline

    @property
    def write_failure(self) -> StorageError | None:
        """Why appends are refused (the *writes failed* state, module docstring); None when the
        log takes writes.  :meth:`resume_writes` clears it."""
        return self._write_failure

    @property
    def writable(self) -> bool:
        """Open, online, and not in the *writes failed* state: appends are taken."""
        return not (self._closed or self._offline) and self._write_failure is None

    @property
    def closed(self) -> bool:
        return self._closed

    # --- appending and flushing ------------------------------------------------------------

    @_write_operation
    def append(self, buf: BytesLike, *, immutable: bool = False, leader_epoch: int = 0) -> AppendInfo:
        """Append the whole batches in ``buf`` (as a producer sent them); returns the offsets given.

        Raises CorruptRecordError, InvalidRecordError or RecordTooLargeError (the log unchanged)
        when ``buf`` is not one or more valid batches of at most ``max_message_bytes`` each, and
        InvalidTimestampError when one holds a timestamp too far ahead of the clock
        (``message_timestamp_after_max_ms``).  Batches of idempotent producers are checked
        against the producer state first (hpbroker.io.producer_state): OutOfOrderSequenceError,
        ProducerFencedError or UnknownProducerIdError append nothing; a request whose batches
        are all stored already appends nothing either and returns the stored copy's offsets
        with ``duplicate`` set; one whose first batches are stored and end at the log end (the
        stored prefix rule) appends only the batches after them and returns offsets from the
        prefix's first, with ``duplicate_records`` the prefix's records.

        The whole request goes into one segment: whether to roll is decided once, for its total
        size, last offset and largest timestamp (of what is appended: without a stored prefix;
        a request larger than ``segment_bytes`` gets a new segment to itself), so a roll never
        writes its first batches ahead of the rest (a crash or failed flush in between would
        keep only part of it); one that no segment could hold (over MAX_SEGMENT_BYTES, or 2**32
        offsets) is RecordTooLargeError.
        The records are pending until flushed.  A ``bytes`` object, or a view of one, is held, not
        copied, until then; so is any buffer the caller declares ``immutable`` (a received
        ZeroMQ message: libzmq never changes one).  Anything else is copied first (a bytearray,
        an mmap, and also a read-only view of one: read-only says only that the view cannot
        change the bytes, not that nobody can), since a caller changing it before the flush
        would put batches on disk that fail their CRC.

        ``leader_epoch`` is stamped into every batch appended (a leader appends in its epoch);
        the first batch of an epoch newer than the cache's latest records it there
        (:attr:`leader_epochs`); an older epoch is ValueError, nothing appended.
        """
        self._check_writable()
        if leader_epoch < self._leader_epochs.latest_epoch:
            raise ValueError(f"[{self._name}] leader epoch {leader_epoch} is older than the log's latest, "
                             f"{self._leader_epochs.latest_epoch}")
        view = _held_view(buf, immutable)
        scan = _core.validate_batches(view, max_batch_bytes=self._config.max_message_bytes)
        now = self._clock()
        self._check_timestamps(scan, now)
        self._check_fits_a_segment(len(view), scan.record_count)
        idempotent = scan.idempotent_batches != 0
        first_offset = self._log_end_offset
        # What is appended: the batches from skip on (all but a stored prefix, of prefix_records
        # records), request_bytes of them, their largest timestamp max_timestamp.
        skip = prefix_records = 0
        request_bytes, max_timestamp = len(view), scan.max_timestamp
        if idempotent:  # per batch, before any offset is given (hpbroker.io.producer_state)
            stored = self._producers.check(scan, first_offset)
            if stored is not None:
                if type(stored) is not StoredPrefix:
                    return AppendInfo(stored[2], stored[3], scan.record_count, scan.batch_count,
                                      duplicate=True, duplicate_records=scan.record_count)
                # a resend of a request a crash cut: the rest is appended after its stored prefix
                skip, first_offset = stored.batch_count, stored.first_offset
                prefix_records = stored.last_offset - stored.first_offset + 1
                request_bytes -= scan.positions[skip]
                max_timestamp = max(scan.max_timestamps[skip:])
        # One roll decision for the whole request (Kafka's maybeRoll per append), on what is
        # appended: a request never straddles two segments, so a crash or a failed flush keeps all
        # of it or none of it.
        self._make_room(request_bytes, first_offset + scan.record_count - 1, max_timestamp,
                        scan.max_timestamps[skip], now)
        if leader_epoch != self._leader_epochs.latest_epoch:
            self._leader_epochs.assign(leader_epoch, self._log_end_offset)
        self._add_pending(view, scan, skip, now, leader_epoch)
        self._pended()
        if skip:
            logger.info("[%s] a resend of producer id %d's request, %d records stored from offset %d: %d of "
                        "its %d batches appended after them", self._name, scan.producer_ids[0],
                        prefix_records, first_offset, scan.batch_count - skip, scan.batch_count)
            return AppendInfo(first_offset, self._log_end_offset - 1, self._log_end_offset - first_offset,
                              scan.batch_count, duplicate_records=prefix_records)
        return AppendInfo(first_offset, self._log_end_offset - 1, self._log_end_offset - first_offset,
                          scan.batch_count)

    @_write_operation
    def append_replicated(self, buf: BytesLike, *, immutable: bool = False) -> AppendInfo:
        """Append the leader's batches in ``buf`` as they are: a follower's append.

        ``buf`` holds whole batches as the leader's log stores them (a fetch response's records):
        their base offsets and leader epochs are kept and no byte is changed, so the follower's
        segments hold the leader's very bytes.  Checked before anything changes, else nothing is
        appended: the first batch starts at :attr:`log_end_offset` (InvalidRecordError
        "replicated batch at offset X, log ends at Y"); every batch is valid as on ``append``
        (framing, CRC, header, records: CorruptRecordError or InvalidRecordError naming the
        batch's offset) and starts right after its predecessor; no batch's leader epoch is older
        than the one before it, nor than the latest epoch of the records in the log
        (InvalidRecordError; an epoch :meth:`begin_leader_epoch` began at the log end holds no
        record yet: batches of an older epoch replace it, as the newer leader's log decides).
        Not checked: ``max_message_bytes`` and timestamps (the leader took the batches under the
        same topic settings and its own clock; refusing them here would stall the replica for
        good), and idempotent producers' sequences (the leader decided).  A request no segment
        could hold is RecordTooLargeError, as on ``append``.

        The first batch of an epoch newer than those before it records it in the cache at that
        batch's base offset (the file is written before this returns); each idempotent batch updates
        the producer state as on ``append``, so this log deduplicates the producer's retries if
        it becomes the leader.  The roll is decided once for the whole ``buf``, the records are
        pending until flushed, and a buffer is held or copied, exactly as on :meth:`append`.
        An empty ``buf`` appends nothing (``record_count`` 0, ``first_offset`` the log end).
        """
        self._check_writable()
        view = _held_view(buf, immutable)
        first_offset = self._log_end_offset
        if not len(view):
            return AppendInfo(first_offset, first_offset - 1, 0, 0)
        scan = self._scan_replicated(view)
        now = self._clock()
        self._check_fits_a_segment(len(view), scan.record_count)
        new_epochs = self._new_leader_epochs(view, scan)
        self._make_room(len(view), scan.next_offset - 1, scan.max_timestamp, scan.max_timestamps[0], now)
        begun = [entry for entry in self._leader_epochs.entries if entry[1] >= first_offset]
        if begun and new_epochs[:1] != begun:  # an epoch begun here, without a record, that these are not in
            self._leader_epochs.truncate_from_end(first_offset)
        for epoch, start_offset in new_epochs:
            self._leader_epochs.assign(epoch, start_offset)
        self._add_pending(view, scan, 0, now, None)
        self._pended()
        return AppendInfo(first_offset, self._log_end_offset - 1, scan.record_count, scan.batch_count)

    def _scan_replicated(self, view: memoryview) -> _core.ScanResult:
        """Deep-scan a follower's ``view``, its batches contiguous from the log end; raise as
        :meth:`append_replicated` says unless all of it scans clean."""
        expected = self._log_end_offset
        first = (_BASE_OFFSET.unpack_from(view, _core.BASE_OFFSET_POSITION)[0]
                 if len(view) >= _BASE_OFFSET.size else expected)
        if first != expected:
            raise InvalidRecordError(f"[{self._name}] replicated batch at offset {first}, log ends at "
                                     f"{expected}: nothing appended")
        scan = _core.scan_batches(view, expected_offset=expected, deep=True)
        if scan.error is not None:
            raise error_for_code(scan.error_code, f"[{self._name}] replicated batch at offset "
                                 f"{scan.next_offset} (log end {expected}), {scan.error}: nothing appended")
        return scan

    def _new_leader_epochs(self, view: memoryview, scan: _core.ScanResult) -> list[tuple[int, int]]:
        """``(epoch, base_offset)`` of each batch in ``view`` whose leader epoch (header bytes
        12..16, FORMAT.md) is newer than every one before it, the latest epoch of the records
        in the log included; InvalidRecordError for one that is older.  An epoch the cache
        begins at the log end itself (:meth:`begin_leader_epoch`) holds no record: it does not
        count (the newer leader's log decides what follows, as in Kafka)."""
        latest, found = UNDEFINED_EPOCH, []
        for epoch, start_offset in self._leader_epochs.entries:
            if start_offset < self._log_end_offset:
                latest = epoch
        for i in range(scan.batch_count):
            epoch = _LEADER_EPOCH.unpack_from(view, scan.positions[i] + _core.LEADER_EPOCH_POSITION)[0]
            if epoch < latest or epoch < 0:
                raise InvalidRecordError(
                    f"[{self._name}] replicated batch at offset {scan.base_offsets[i]} has leader epoch "
                    f"{epoch}, older than the log's latest, {latest}: nothing appended")
            if epoch > latest:
                found.append((epoch, scan.base_offsets[i]))
                latest = epoch
        return found

    @_write_operation
    def begin_leader_epoch(self, epoch: int, *, durable: bool = True) -> None:
        """Record that leader epoch ``epoch`` begins at :attr:`log_end_offset` (a broker that
        becomes the partition's leader, before its first append in that epoch).  The latest
        epoch again changes nothing; an older one is ValueError.  Refused while writes are failed.

        The ``leader-epoch-checkpoint`` file is written (two fsyncs) before this returns, unless
        ``durable`` is False: then only the entries in memory change, and the file is written
        before the first flush that writes a record (:meth:`_take_pending`), by
        :meth:`flush_leader_epochs`, at :meth:`checkpoint` or :meth:`close`, whichever comes
        first.  A crash before then loses the entry, never a record of its epoch or the older
        entries (hpbroker.io.leader_epochs says why that is safe): so an owner making many
        partitions leader at once (a broker died) need not stop for 2 fsyncs per partition."""
        self._check_writable()
        latest = self._leader_epochs.latest_epoch
        if not isinstance(epoch, int) or epoch < latest:
            raise ValueError(f"[{self._name}] leader epoch {epoch!r} is older than the log's latest, "
                             f"{latest}")
        if epoch > latest:
            self._leader_epochs.assign(epoch, self._log_end_offset, durable=durable)
            logger.info("[%s] leader epoch %d begins at offset %d", self._name, epoch, self._log_end_offset)

    @_write_operation
    def flush_leader_epochs(self) -> bool:
        """Write the ``leader-epoch-checkpoint`` file, durably, if it lags the entries in memory
        (:meth:`begin_leader_epoch` with ``durable=False``); True if it wrote.  Nothing while
        writes are failed (the first flush after :meth:`resume_writes` writes it)."""
        if self._write_failure is not None:
            return False
        return self._leader_epochs.flush()

    def _make_room(self, request_bytes: int, last_offset: int, max_timestamp: int, first_timestamp: int,
                   now_ms: int) -> None:
        """Roll if the request about to be appended (``request_bytes`` ending at ``last_offset``,
        ``max_timestamp`` its largest timestamp, ``first_timestamp`` its first batch's largest)
        must start a new segment: decided once per request (:meth:`_roll_reason`)."""
        reason = self._roll_reason(request_bytes, last_offset, max_timestamp, now_ms)
        if reason is not None:
            self._roll(now_ms, reason)
        if not self._pending and not self._in_flight and self._segments[-1].size_in_bytes == 0:
            self._active_first_timestamp = first_timestamp

    def _pended(self) -> None:
        """Batches were just made pending: start the flush deadline, flush if due."""
        now_ms = self._monotonic_clock()
        if self._pending_since_ms is None:
            self._pending_since_ms = now_ms
        if self._flush_on_append and self._flush_due(now_ms):
            self._flush_pending(fsync=self._config.flush_fsync)

    def _check_fits_a_segment(self, request_bytes: int, record_count: int) -> None:
        """RecordTooLargeError for a request no segment could hold whole (append's docstring)."""
        if request_bytes > MAX_SEGMENT_BYTES or record_count - 1 > _MAX_RELATIVE_OFFSET:
            raise RecordTooLargeError(
                f"[{self._name}] a request of {request_bytes} bytes and {record_count} records cannot "
                f"lie in one segment (at most {MAX_SEGMENT_BYTES} bytes and "
                f"{_MAX_RELATIVE_OFFSET + 1} offsets)")

    def _add_pending(self, view: memoryview, scan: _core.ScanResult, skip: int, now_ms: int,
                     leader_epoch: int | None) -> None:
        """Give the request's batches from ``skip`` on the next offsets and make them pending;
        record each idempotent one in the producer state (after the roll, so the roll's snapshot
        holds only what lies below it).  ``leader_epoch`` None: the batches are replicated and
        carry their offsets and epochs already, their bytes are kept as they are."""
        producers = scan.producer_ids if scan.idempotent_batches else None
        table = self._producers.table
        for i in range(skip, scan.batch_count):
            position, size, max_timestamp = scan.positions[i], scan.sizes[i], scan.max_timestamps[i]
            base_offset = self._log_end_offset
            next_offset = base_offset + scan.last_offset_deltas[i] + 1
            head = bytearray(view[position : position + STAMP_BYTES])
            if leader_epoch is not None:
                _core.stamp_batch(head, 0, base_offset, leader_epoch)
            body = view[position + STAMP_BYTES : position + size]
            self._pending.append(PendingBatch(base_offset, next_offset, max_timestamp, size, head, body))
            self._pending_bytes += size
            self._pending_records += next_offset - base_offset
            self._log_end_offset = next_offset
            if producers is not None and producers[i] >= 0:
                sequence = scan.base_sequences[i]
                table.update(producers[i], scan.producer_epochs[i], sequence,
                             sequence + scan.last_offset_deltas[i], base_offset, next_offset - 1, now_ms)

    def _check_timestamps(self, scan: _core.ScanResult, now_ms: int) -> None:
        """InvalidTimestampError, before anything changes, when a batch holds a record timestamp
        more than ``message_timestamp_after_max_ms`` ahead of the clock (LogConfig)."""
        bound = self._config.message_timestamp_after_max_ms
        for i in range(scan.batch_count):
            if scan.max_timestamps[i] - now_ms > bound:
                raise InvalidTimestampError(
                    f"[{self._name}] batch {i} of the request holds a record timestamp "
                    f"{scan.max_timestamps[i]}, {scan.max_timestamps[i] - now_ms} ms ahead of the broker's "
                    f"clock ({now_ms}); message_timestamp_after_max_ms allows {bound}")

    def _flush_due(self, now_ms: int) -> bool:
        """``now_ms``: on the monotonic clock."""
        if not self._pending:
            return False
        return (self._pending_records >= self._config.flush_messages
                or self._pending_bytes >= MAX_PENDING_BYTES
                or now_ms >= self._pending_since_ms + self._config.flush_ms)

    def flush_due(self, now_ms: int | None = None) -> bool:
        """Whether the records pending (not in flight) have reached ``flush_messages`` or their
        deadline (:attr:`flush_deadline_ms`); ``now_ms`` is on the monotonic clock (default: now)."""
        return self._flush_due(self._monotonic_clock() if now_ms is None else now_ms)

    @_write_operation
    def flush(self) -> None:
        """Write every pending batch now, and fdatasync unless ``flush_fsync`` is off (completing
        the flushes in flight first).  Refused while writes are failed."""
        self._check_writable()
        self._flush_pending(fsync=self._config.flush_fsync)

    @_write_operation
    def flush_if_due(self, now_ms: int | None = None) -> bool:
        """Flush if the pending records have reached ``flush_messages`` or their deadline
        (:attr:`flush_deadline_ms`; ``now_ms`` on the monotonic clock, default now); True if it
        flushed."""
        if not self._flush_due(self._monotonic_clock() if now_ms is None else now_ms):
            return False
        self._flush_pending(fsync=self._config.flush_fsync)
        return True

    @_write_operation
    def begin_flush(self) -> FlushJob | None:
        """Hand the pending batches to a :class:`FlushJob` for another thread to run; None when
        nothing is pending.  Jobs already in flight are fine: each writes after the one begun
        before it.  Until :meth:`complete_flush` the job's records are neither pending nor
        readable."""
        self._check_writable()
        if not self._pending:
            return None
        job = self._take_pending(self._config.flush_fsync, self._in_flight[-1] if self._in_flight else None)
        self._in_flight.append(job)
        return job

    def _take_pending(self, fsync: bool, previous: FlushJob | None) -> FlushJob:
        """The pending batches as a flush job (not yet run).  The leader-epoch file is written
        first if it lags (an epoch begun with ``durable=False``): no record reaches the segment
        before the entry of its epoch is durable, so the file never misses an epoch that holds
        a record on disk.  Raises OSError (nothing taken) when that write fails."""
        self._leader_epochs.flush()
        job = FlushJob(self._segments[-1], self._pending, fsync, self._pending_records, self._pending_bytes,
                       previous)
        self._pending = []
        self._pending_bytes = self._pending_records = 0
        self._pending_since_ms = None
        return job

    @_write_operation
    def complete_flush(self, job: FlushJob) -> None:
        """Finish ``job`` (wait for the flusher running it, or run it here if none has started
        it) and apply it: its records become readable (the high watermark moves past them) and,
        if it synced, durable.  A failed job puts the log in the *writes failed* state (module
        docstring), dropping the jobs after it; completing a dropped job raises the StorageError
        that says why.  A job the log already applied itself (a roll, :meth:`flush` or
        :meth:`close` completes the job in flight) is a no-op."""
        if not job.applied:
            if job not in self._in_flight:
                raise ValueError(f"[{self._name}] that flush job is not one of this log's flushes in flight")
            while not job.applied:
                self._apply(self._in_flight[0])
        if job.dropped:
            raise StorageError(self._write_failure.message if self._write_failure is not None
                               else f"[{self._name}] the flush was dropped unwritten")

    def _apply(self, job: FlushJob) -> None:
        """Apply ``job``, which is either the oldest in flight or one not yet in flight."""
        job.run()  # here and now, unless a flusher has claimed it: then wait for that
        job.wait()
        if self._in_flight and self._in_flight[0] is job:
            self._in_flight.popleft()
        job.applied = True
        if job.error is not None:
            job.dropped = True  # never acknowledged: what it wrote is truncated away
            raise job.error  # an OSError: _write_operation fails writes, dropping the jobs after it
        segment = job.segment
        segment.commit(job.batches, job.written)
        if job.fsync:
            segment.log.mark_synced()
            self._recovery_point = segment.next_offset
        try:
            segment.write_index_entries()  # after the data, so an entry never leads past it
        except OSError as e:
            # The records are written (and synced): they stand.  The index file may now end in
            # part of an entry; resume_writes rebuilds it before anything is appended again.
            self._fail_writes("index write", e)
        if self.on_flush is not None:
            self.on_flush(job)

    def _flush_pending(self, *, fsync: bool) -> None:
        """Synchronously: complete the flushes in flight, then write (and sync) what is pending,
        as a flush job run here: the high watermark moves only once the data is written (and
        synced), the index entries are written only after it."""
        while self._in_flight:
            self._apply(self._in_flight[0])
        if self._pending:
            self._apply(self._take_pending(fsync, None))
        self._check_writable()  # an index write that failed above dropped the rest
        active = self._segments[-1]
        if fsync:
            self._synced(active.log.sync())  # what earlier flushes wrote without syncing, if anything
            self._recovery_point = active.next_offset
        active.write_index_entries()  # after the data, so an entry never leads past it

    # --- rolling -------------------------------------------------------------------------------

    def _roll_reason(self, request_bytes: int, last_offset: int, max_timestamp: int,
                     now_ms: int) -> str | None:
        """Why the request about to be appended (``request_bytes`` of batches ending at
        ``last_offset``, its largest timestamp ``max_timestamp``) must start a new segment, or None.
        Decided once per request, so the request lands whole in one segment.

        Time is measured Kafka's way: from the active segment's first batch timestamp to the
        request's largest, so producer clocks (or replayed old data) cannot roll a segment per
        request; the wall clock since the segment was created counts only where timestamps are
        missing.
        """
        active, config = self._segments[-1], self._config
        active_bytes = active.size_in_bytes + self.pending_bytes
        if active_bytes == 0:
            return None  # never roll an empty segment: a huge request gets one to itself
        if active_bytes + request_bytes > config.segment_bytes:
            return f"{active_bytes} + {request_bytes} bytes would exceed segment_bytes {config.segment_bytes}"
        first = self._active_first_timestamp
        if first >= 0 and max_timestamp >= 0:
            if max_timestamp - first > config.segment_ms:
                return f"timestamp {max_timestamp} is more than segment_ms {config.segment_ms} after {first}"
        elif now_ms - active.created_ms > config.segment_ms:
            return f"segment created at {active.created_ms} is older than segment_ms {config.segment_ms}"
        if last_offset - active.base_offset > _MAX_RELATIVE_OFFSET:
            return "relative offsets would overflow u32"
        return None

    @_write_operation
    def roll(self) -> None:
        """Start a new active segment now (flushing pending records and completing the flush in
        flight first); no-op if the active one is empty and nothing is waiting to be written."""
        self._check_writable()
        if self._segments[-1].size_in_bytes or self._pending or self._in_flight:
            self._roll(self._clock(), "requested")

    def _roll(self, now_ms: int, reason: str) -> None:
        """Start a new segment at the log end: flush and fsync the active one, checkpoint.

        Called before any batch of the request being appended is pending (append decides the
        roll once per request).  The new segment is made first, as it is what a full disk
        refuses: a roll that fails has written nothing (the failure drops everything pending).
        The checkpoint after it is best effort: a stale one only makes the next open scan more."""
        new = Segment(self._directory, self._log_end_offset, self._config, create=True, now_ms=now_ms,
                      log_name=self._name)
        old = self._segments[-1]
        try:
            self._flush_pending(fsync=True)
            self._synced(old.sync())
            fsync_dir(self._directory)  # the new segment's entry, before anything is written to it
        except BaseException:
            new.close()
            new.delete_files()
            raise
        old.release_index_files()
        self._segments.append(new)
        self._bases.append(new.base_offset)
        self._active_first_timestamp = -1
        self._recovery_point = new.base_offset
        try:
            self._checkpoint.write(self._recovery_point)
        except OSError as e:
            logger.warning("[%s] the checkpoint at the roll to %s was not written: %s", self._name, new.path,
                           e)
        self._producers.take_snapshot(new.base_offset)  # best effort, like the checkpoint
        logger.info("[%s] rolled to segment %s at offset %d: %s", self._name, new.path, new.base_offset,
                    reason)

    # --- reading -------------------------------------------------------------------------------

    def _check_offset(self, offset: int) -> None:
        if not self.log_start_offset <= offset <= self._log_end_offset:
            raise OffsetOutOfRangeError(
                f"[{self._name}] offset {offset} is outside the log's range "
                f"[{self.log_start_offset}, {self._log_end_offset}]",
                log_start_offset=self.log_start_offset,
                log_end_offset=self._log_end_offset,
            )

    @_disk_operation
    def read(self, offset: int, max_bytes: int) -> FileSlice:
        """Whole flushed batches of one segment, from the batch containing ``offset``.

        The slice holds the first batch even if it is larger than ``max_bytes`` (so a consumer
        always progresses), then as many whole batches as fit in ``max_bytes``.  An offset in
        ``[high_watermark, log_end_offset]`` gives an empty slice (length 0); one outside
        ``[log_start_offset, log_end_offset]`` raises OffsetOutOfRangeError carrying the range.
        """
        if not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
        return self._read(offset, max_bytes)

    def _read(self, offset: int, max_bytes: int) -> FileSlice:
        """:meth:`read` whose OSError is the caller's business."""
        self._check_offset(offset)
        if offset >= self.high_watermark:
            active = self._segments[-1]
            return FileSlice(active.log.fd, active.size_in_bytes, 0, offset, active.path, offset)
        i = bisect.bisect_right(self._bases, offset) - 1
        while self._segments[i].next_offset <= offset:  # offset at the very end of a segment
            i += 1
        segment = self._segments[i]
        if offset < segment.base_offset:  # between two segments: a gap
            gap = next(g for g in self._gaps if g.first_offset <= offset < g.next_offset)
            raise DamagedRangeError(f"[{self._name}] offset {offset} lies in a damaged range: "
                                    f"{gap.describe()}", gap.first_offset, gap.next_offset)
        return self._using_index(segment, lambda: segment.read(offset, max_bytes))

    def read_bytes(self, offset: int, max_bytes: int) -> bytes:
        """The bytes of :meth:`read`'s slice (for tests and tools; the broker uses sendfile)."""
        file_slice = self.read(offset, max_bytes)
        if not file_slice.length:
            return b""
        try:
            return pread_full(file_slice.fd, file_slice.length, file_slice.position)
        except OSError as e:
            raise self._go_offline("read_bytes", e) from e

    @_disk_operation
    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The earliest flushed offset whose record timestamp is >= ``timestamp_ms``; None if no
        record is that recent.  Timestamps need not increase with offsets."""
        for segment in self._segments:
            if segment.max_timestamp >= timestamp_ms:
                found = self._using_index(segment, lambda s=segment: s.offset_for_timestamp(timestamp_ms))
                if found is not None:
                    return found
        return None

    def _using_index(self, segment: Segment, lookup: Callable[[], _T]) -> _T:
        """Run ``lookup``; if the segment's index turns out to disagree with its log, rebuild the
        index from the log (never trusting it over the log) and run it again.

        When the rebuild finds the log itself damaged, the damage is contained (damaged ranges,
        see the module docstring) and the log stays online; the segment remembers, so reads that
        reach the damage fail at once with DamagedRangeError instead of scanning it again.
        """
        try:
            return lookup()
        except IndexCorruptError as e:
            logger.warning("[%s] %s; rebuilding the indexes of %s", self._name, e, segment.path)
        segment.rebuild_indexes()
        self._list_damaged_segments()
        if segment is not self._segments[-1]:
            self._synced(segment.sync())  # what the rebuild rewrote, then closed again
            segment.release_index_files()
        try:
            return lookup()
        except IndexCorruptError as e:  # the log changed under the rebuild: no way to read it
            raise CorruptRecordError(f"[{self._name}] {segment.path} cannot be read after rebuilding its "
                                     f"indexes: {e}") from None

    def _list_damaged_segments(self) -> None:
        """Keep the damaged-segments file (hpbroker.io.checkpoint) in step with the segments that
        hold damaged ranges, so that the next open scans them in full and finds them again.  A
        failure to write it is logged, not raised: the damage is then found again by the reads
        that reach it (and the log must stay readable on a full disk)."""
        damaged = {segment.base_offset for segment in self._segments if segment.damaged}
        if damaged == self._damage_listed:
            return
        try:
            self._damaged_segments.write(damaged)
        except OSError as e:
            logger.warning("[%s] cannot record the damaged segments %s in %s: %s", self._name,
                           sorted(damaged), self._damaged_segments.path, e)
            return
        self._damage_listed = damaged

    @property
    def damaged_ranges(self) -> list[DamagedRange]:
        """Every damaged range known in the log (gaps between segments and damaged bytes inside
        them), in offset order: found when the log was opened, or by reads since."""
        ranges = [g for g in self._gaps if g.next_offset > self.log_start_offset]
        for segment in self._segments:
            ranges += segment.damaged
        return sorted(ranges, key=lambda r: (r.first_offset, r.first_position))

    # --- truncation and leader epochs (hpbroker.io.leader_epochs) -------------------------------

    @property
    def leader_epochs(self) -> LeaderEpochCache:
        """The leader-epoch cache (epoch -> start offset), for ``end_offset_for``.  Look, do not
        touch: the log keeps it within its offsets."""
        return self._leader_epochs

    @_write_operation
    def truncate_to(self, offset: int) -> int:
        """Cut the log back so that it ends at ``offset`` (``log_start_offset <= offset <=
        log_end_offset``, else ValueError); returns the new log end.  For a follower that found,
        through the leader's epoch end offsets, that its log diverges from the leader's there.

        Whole batches only, as Kafka: an ``offset`` inside a batch cuts that whole batch, so the
        log ends at its base offset (below ``offset``).  Pending records and flushes in flight
        are first completed (flushed and fsynced) like ``flush()``, then cut with the rest.  The
        segments after the cut are deleted (their descriptors closed ``file_delete_delay_ms``
        later), the one holding it is cut and its indexes rebuilt, the high watermark, recovery
        point and checkpoint move down, damaged ranges above go, the producer state is rebuilt
        (a batch cut away is no duplicate any more) and the leader epochs starting at or after
        the new end are dropped.  Appends then continue at the new end.

        Crash safety: the checkpoint is lowered first, then the segments go from the last one
        down, so a crash leaves a shorter prefix of the log (the caller truncates again after
        the restart, as its follower protocol makes it); the open drops snapshots and leader
        epochs beyond the log end.  A disk error puts the log in the *writes failed* state."""
        self._check_writable()
        if not isinstance(offset, int) or not self.log_start_offset <= offset <= self._log_end_offset:
            raise ValueError(f"[{self._name}] cannot truncate to {offset!r}: outside the log's range "
                             f"[{self.log_start_offset}, {self._log_end_offset}]")
        return truncation.truncate_to(self, offset)

    @_write_operation
    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Empty the log and start it again at ``offset`` (any offset >= 0, else ValueError):
        afterwards ``log_start_offset == high_watermark == log_end_offset == offset``, one
        empty segment, no damaged range, the leader epochs and the producer state forgotten
        (their files too), the checkpoint at ``offset``; all of it durable before this returns.
        For a follower whose fetch offset fell out of the leader's log, below its start.

        Pending records and flushes in flight are first completed (flushed and fsynced) like
        ``flush()``, so a flush job the owner still holds completes as a no-op; then they go
        with the rest.  The segments' files are deleted at once (their descriptors closed
        ``file_delete_delay_ms`` later, so slices handed out stay readable).  Appends then
        continue at ``offset``.

        Crash safety (step by step in hpbroker.io.truncation): a crash leaves the whole old log,
        a suffix of it, or an empty log at ``offset`` (or below it), never a damaged one; the
        follower's protocol then truncates again.  A disk error before the first file is
        deleted puts the log in the *writes failed* state; from then on, it takes the log
        offline (reopen it)."""
        self._check_writable()
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ValueError(f"[{self._name}] cannot start the log at {offset!r}: an offset is an int >= 0")
        truncation.truncate_fully_and_start_at(self, offset)

    # --- producer state (hpbroker.io.producer_state) ---------------------------------------------

    @property
    def producer_state(self) -> ProducerStateTable:
        """The idempotent producers' state, as the next append checks it.  Look, do not touch."""
        return self._producers.table

    def _load_producer_state(self, now_ms: int) -> None:
        """Rebuild the producer state from the newest valid snapshot at or below the high
        watermark and the batch headers after it, read through the read path
        (hpbroker.io.producer_replay): at open, and when writes resume (the batches a write
        failure dropped must leave it, else their retry would be taken for a duplicate and never
        stored).  Raises OSError."""
        end, expiration_ms = self.high_watermark, self._config.producer_id_expiration_ms
        self._producers.load(
            self.log_start_offset, end, now_ms=now_ms, expiration_ms=expiration_ms,
            unexpired_offset=unexpired_offset(self._segments, now_ms - expiration_ms, end),
            replay=lambda start: replay_batches(self._read, start, end, self._bases, self._name))

    # --- retention -----------------------------------------------------------------------------

    @_write_operation
    def delete_old_segments(self, now_ms: int | None = None) -> int:
        """Apply retention to closed segments, oldest first; returns how many were deleted.

        A segment goes when its largest timestamp (for a segment without one, or whose largest
        timestamp lies further past its ``.log``'s modification time than
        ``message_timestamp_after_max_ms`` allows, that modification time: see
        ``Segment.retention_time_ms``) is older than ``now - retention_ms``, or while
        the log without it still holds ``retention_bytes``; the active segment always stays.
        Files are unlinked at once, durably (the directory is fsynced before this returns, so
        ``log_start_offset`` cannot move back after a power loss); descriptors stay open
        ``file_delete_delay_ms`` longer (measured on the monotonic clock; closed by a later call)
        so slices handed out earlier remain readable.  ``now_ms`` is wall-clock time (default:
        the log's clock).  The producer state forgets the producers whose batches are all below
        the new log start, and those with no append for ``producer_id_expiration_ms``.
        """
        now = self._clock() if now_ms is None else now_ms
        self._close_doomed()
        config, remaining = self._config, self.size_in_bytes
        count = 0
        for segment in self._segments[:-1]:
            size = segment.size_in_bytes
            expired = config.retention_ms >= 0 and segment.retention_time_ms(
                config.message_timestamp_after_max_ms) < now - config.retention_ms
            oversize = config.retention_bytes >= 0 and remaining - size >= config.retention_bytes
            if not (expired or oversize):
                break
            remaining -= size
            count += 1
        for segment in self._segments[:count]:
            segment.delete_files()
            self._doom([segment])
            logger.info("[%s] deleted segment %s by retention: offsets [%d, %d), max timestamp %d",
                        self._name, segment.path, segment.base_offset, segment.next_offset,
                        segment.max_timestamp)
        del self._segments[:count]
        del self._bases[:count]
        if count:
            self._producers.truncate_head(self.log_start_offset)
            self._leader_epochs.truncate_from_start(self.log_start_offset)
            fsync_dir(self._directory)  # else the files may come back after a power loss
            self._list_damaged_segments()
        self._producers.expire(now, config.producer_id_expiration_ms)
        return count

    def _doom(self, segments: list[Segment]) -> None:
        """Close the descriptors of ``segments``, whose files are gone, ``file_delete_delay_ms``
        from now on the monotonic clock (by a later :meth:`_close_doomed`), so slices handed
        out stay readable until then whatever the wall clock does."""
        close_at_ms = self._monotonic_clock() + self._config.file_delete_delay_ms
        self._doomed += [(close_at_ms, segment) for segment in segments]

    def _close_doomed(self) -> None:
        """Close the deleted segments whose delay (:meth:`_doom`) has passed."""
        now_ms = self._monotonic_clock()
        keep = []
        for close_at_ms, segment in self._doomed:
            if close_at_ms <= now_ms:
                segment.close()
            else:
                keep.append((close_at_ms, segment))
        self._doomed = keep

    # --- durability and the end ----------------------------------------------------------------

    @_write_operation
    def checkpoint(self) -> None:
        """fsync the flushed data and indexes and record ``high_watermark`` as the recovery
        point, so the next open only scans what comes after it.  Pending records stay pending.
        Refused while writes are failed."""
        self._check_writable()
        self._synced(self._segments[-1].sync())
        self._leader_epochs.flush()
        self._recovery_point = self.high_watermark
        self._checkpoint.write(self._recovery_point)

    def _synced(self, sync_ns: int | None) -> None:
        """A ``.log`` fdatasync outside a flush job took ``sync_ns`` (None: there was none)."""
        if sync_ns is not None and self.on_sync is not None:
            self.on_sync(sync_ns)

    def close(self) -> None:
        """Flush, fsync everything, write the checkpoint and then the clean-shutdown marker (so
        the next open need not re-read the active segment), close every descriptor.  Idempotent.

        An offline log, or one whose writes failed, only releases its descriptors (no marker:
        the next open recovers).  Slices handed out are invalid afterwards.
        """
        if self._closed:
            return
        try:
            if not self._offline and self._write_failure is None:
                try:
                    self._flush_pending(fsync=True)
                    for segment in self._segments:
                        self._synced(segment.sync())
                    self._leader_epochs.flush()
                    self._producers.take_snapshot(self.high_watermark)  # best effort: else the open replays
                    self._recovery_point = self.high_watermark
                    self._checkpoint.write(self._recovery_point)
                    self._clean_shutdown.write(self._recovery_point)  # last: all above is durable
                except OSError as e:
                    self._drop_unacknowledged()  # what the failed flush wrote must not be found on open
                    raise self._go_offline("close", e) from e
        finally:
            self._release()
        logger.info("[%s] closed at offset %d", self._name, self._log_end_offset)

    def _release(self) -> None:
        """Close every descriptor, whatever happens: the log is unusable afterwards."""
        for job in self._in_flight:
            job.cancel()
        self._in_flight.clear()
        self._closed = True
        self._pending = []
        for segment in self._segments + [segment for _close_at_ms, segment in self._doomed]:
            try:
                segment.close()
            except OSError as e:
                logger.warning("[%s] closing %s: %s", self._name, segment.path, e)
        self._doomed = []
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the directory lock
            self._lock_fd = -1

    def _abandon(self) -> None:
        """For crash tests only: drop every descriptor without flushing or syncing, as if the
        process had been killed; pending records are lost."""
        self._release()

    def _check_usable(self) -> None:
        if self._closed:
            raise ValueError(f"[{self._name}] the log in {self._directory} is closed")
        if self._offline:
            raise StorageError(f"[{self._name}] the log in {self._directory} is offline after a disk error")

    def _go_offline(self, operation: str, error: Exception) -> StorageError:
        """Mark the log offline and build the StorageError to raise (from ``error``)."""
        self._offline = True
        logger.error("[%s] %s failed in %s, taking the log offline: %s", self._name, operation,
                     self._directory, error)
        return StorageError(f"[{self._name}] {operation} failed in {self._directory}: {error}")

    # --- the writes failed state (module docstring) ------------------------------------------

    def _check_writable(self) -> None:
        if self._write_failure is not None:
            raise StorageError(self._write_failure.message)

    def _fail_writes(self, operation: str, error: OSError) -> StorageError:
        """Enter (or stay in) the *writes failed* state after ``error`` in ``operation``: drop
        what was not acknowledged and build the StorageError to raise (from ``error``)."""
        self._drop_unacknowledged()
        if error.errno in _NO_SPACE_ERRNOS:
            why = ("no space left on device: the partition refuses writes until space is freed "
                   "(retention, or files deleted), then takes them again by itself; retriable")
        else:
            why = ("the partition refuses writes until its data on disk has been re-read and "
                   "verified, then takes them again by itself; reads go on; retriable")
        message = f"[{self._name}] {operation} failed in {self._directory}: {error}; {why}"
        if self._write_failure is None or self._write_errno != error.errno:
            logger.error("[%s] %s failed in %s: %s; refusing writes until they can resume (reads of "
                         "the acknowledged records go on)", self._name, operation, self._directory, error)
        self._write_failure = StorageError(message)
        self._write_errno = error.errno
        return StorageError(message)

    def _drop_unacknowledged(self) -> None:
        """Forget the pending records and the flushes in flight (never acknowledged: their
        offsets will be given again) and cut what a failed ``writev`` left past the high
        watermark (``ftruncate`` needs no free space; if it fails, resume_writes cuts it)."""
        for job in self._in_flight:
            job.cancel()  # waits for one a flusher is running
            job.applied = job.dropped = True
        self._in_flight.clear()
        self._pending = []
        self._pending_bytes = self._pending_records = 0
        self._pending_since_ms = None
        if not self._segments:
            return
        active = self._segments[-1]
        self._log_end_offset = active.next_offset
        try:
            if os.fstat(active.log.fd).st_size > active.size_in_bytes:
                os.ftruncate(active.log.fd, active.size_in_bytes)
        except OSError as e:
            logger.warning("[%s] cannot cut %s back to its %d acknowledged bytes yet: %s", self._name,
                           active.path, active.size_in_bytes, e)

    def resume_writes(self) -> bool:
        """Leave the *writes failed* state if the disk allows it now; True when the log takes
        appends (again).  For the owner to call now and then, with backoff.

        After a full disk (``ENOSPC``, ``EDQUOT``) nothing is tried until a probe file of
        RESUME_MIN_FREE_BYTES can be preallocated (``posix_fallocate``, then removed).  Then: the
        active segment is cut back to the acknowledged size, fdatasync'd, its cached pages
        dropped (``POSIX_FADV_DONTNEED``), and the log is reloaded through recovery
        (hpbroker.io.loader) from the recovery point (the last fsynced offset), so what follows
        it is re-read from the disk and validated; the checkpoint is written.  Only if all of that
        succeeds are the reloaded segments taken (the old ones are closed ``file_delete_delay_ms``
        later, so slices handed out stay readable); otherwise the log stays as it was, still
        serving reads, with the new reason (False).  A closed or offline log raises as every call does."""
        self._check_usable()
        if self._write_failure is None:
            return True
        no_space = self._write_errno in _NO_SPACE_ERRNOS
        if no_space and not _can_allocate(self._directory, RESUME_MIN_FREE_BYTES):
            return False
        try:
            self._reload()
            self._load_producer_state(self._clock())  # without the dropped batches, nor what the disk lost
            self._leader_epochs.truncate_from_end(self._log_end_offset)  # the epochs they began
        except OSError as e:
            self._fail_writes("resume", e)
            logger.info("[%s] cannot resume writes yet: %s", self._name, e)
            return False
        except HPBrokerError as e:
            logger.error("[%s] cannot resume writes: %s", self._name, e)
            return False
        logger.warning("[%s] writes resumed after %s: the log was re-read from offset %d and ends at %d",
                       self._name, self._write_failure.message, self._recovery_point, self._log_end_offset)
        self._write_failure = self._write_errno = None
        return True

    def _reload(self) -> None:
        """resume_writes's re-read of the active segment (the closed ones are unchanged: the
        recovery point lies in the active one), taken only if all went well.

        It is recovered from the high watermark, not the recovery point: every offset below
        it was handed to readers, so what the disk lost of it (records written without
        fdatasync whose write-back failed) becomes a damaged range, and no such offset is ever
        handed out again."""
        old = self._segments[-1]
        high_watermark = old.next_offset
        os.ftruncate(old.log.fd, old.size_in_bytes)
        os.fdatasync(old.log.fd)
        os.posix_fadvise(old.log.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        now = self._clock()
        loaded = reload_last_segment(self._directory, self._config, old.base_offset, high_watermark,
                                     now_ms=now, log_name=self._name)
        try:
            for segment in loaded.segments:
                segment.sync()
            for segment in loaded.segments[:-1]:
                segment.release_index_files()
            self._checkpoint.write(loaded.segments[-1].next_offset)
        except BaseException:
            for segment in loaded.segments:
                segment.close()
            raise
        self._doom([old])  # slices handed out stay readable
        self._segments = self._segments[:-1] + loaded.segments
        self._gaps += loaded.gaps
        self._bases = [segment.base_offset for segment in self._segments]
        self._list_damaged_segments()
        active = self._segments[-1]
        if loaded.gaps or active.base_offset != old.base_offset:
            logger.error("[%s] the active segment re-read from the disk lacks records below the high "
                         "watermark %d (written without fdatasync, lost with a failed write-back): a "
                         "damaged range; the log goes on at %d", self._name, high_watermark,
                         active.next_offset)
        self._log_end_offset = self._recovery_point = active.next_offset
        self._active_first_timestamp = active.first_batch_timestamp


def _can_allocate(directory: str, size: int) -> bool:
    """Whether this process can allocate ``size`` bytes in ``directory`` now: ``posix_fallocate``
    of a probe file (``*.tmp``: recovery removes one left behind), removed at once.  Unlike
    ``statvfs``, this counts the blocks reserved for root, or for the filesystem's own metadata,
    the way a write would.  True where the filesystem cannot preallocate (the reload finds out)."""
    path = os.path.join(directory, SPACE_PROBE_NAME)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    except OSError:
        return False
    try:
        os.posix_fallocate(fd, 0, size)
        return True
    except OSError as e:
        return e.errno in (errno.EOPNOTSUPP, errno.EINVAL)
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
