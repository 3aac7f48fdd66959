"""The leader-epoch cache of a partition log: which leader epoch began at which offset (KIP-101).

Each replica keeps, for every leader epoch it has records of, the offset of the first record
written in that epoch.  A follower of a new leader asks the leader for the end offset of its own
latest epoch (:meth:`LeaderEpochCache.end_offset_for` on the leader's side) and truncates its log
to it before fetching, so replicas never diverge.  Kafka's ``LeaderEpochFileCache``.

File ``leader-epoch-checkpoint``, ASCII (Kafka's format)::

    0             format version
    2             number of entries
    0 0           epoch start_offset, one entry a line, both strictly increasing
    3 1042

Replaced atomically and durably on every change (``hpbroker.io.files.replace_atomically``:
``.tmp`` written and fsynced, renamed over the file, the directory fsynced), with one exception:
an entry assigned with ``durable=False`` (a new leader's own epoch,
``PartitionLog.begin_leader_epoch``) changes only the entries in memory and marks the cache
:attr:`~LeaderEpochCache.dirty`; the file is written, the same durable way, by
:meth:`~LeaderEpochCache.flush` or by the next change.  The log flushes the cache before it
writes any record (its flush, ``PartitionLog._take_pending``), so the file never lags behind
the records on disk: **an epoch holding a record on disk is in the file**, whatever crashes.

Why an entry not yet written may be lost (a crash before the flush).  Until the flush the
epoch holds no record on disk here, and so none anywhere: followers fetch only what the leader
has written, and learn epochs only from the batches they append (``append_replicated``, from
the leader epoch in each batch header), never from a role.  Nothing was acknowledged in the
epoch either (an acknowledgement follows the flush).  An epoch without records is no evidence
of what a log holds (KIP-101: the cache answers "where does the log that epoch E wrote end",
and an empty epoch wrote nothing), and the entry written durably would not have outlived the
crash either: the open drops the entries that start at or past the log end
(:meth:`~LeaderEpochCache.truncate_from_end`), and an epoch holding no record starts there.
So after the crash the log is exactly what it would have been, one that never led in that
epoch, which the rules of KIP-101 already cover (``end_offset_for`` answers for an unknown
epoch with the newest one below it, ending where the next known one starts).
The file is never torn by this: it is replaced whole, so a crash leaves the old file or the
new one.  (Kafka writes the entry of ``assign`` synchronously and rebuilds entries from the
batches during recovery; this log rebuilds none, hence the rule above.)

The cache is derived data: a missing file reads as empty; a malformed one is logged, and the
cache starts empty (and is rewritten so): the epochs of the records appended from then on are
recorded again.  A log whose cache lost its entries answers end-offset questions with
"undefined" (-1, -1) for the epochs it forgot, which makes a follower fall back to the high
watermark, as Kafka's does.

Invariants: epochs and start offsets strictly increase from one entry to the next.
Single writer: the partition log, which keeps the entries within its offsets
(:meth:`~LeaderEpochCache.truncate_from_end` when the log is truncated,
:meth:`~LeaderEpochCache.truncate_from_start` when retention moves the log start,
:meth:`~LeaderEpochCache.clear` when the log is emptied to start at another offset).
"""

from __future__ import annotations

import bisect
import logging
import os

from hpbroker.io.files import replace_atomically

__all__ = ["LEADER_EPOCH_FILE_NAME", "LEADER_EPOCH_VERSION", "UNDEFINED_EPOCH", "UNDEFINED_EPOCH_OFFSET",
           "LeaderEpochCache"]

LEADER_EPOCH_FILE_NAME = "leader-epoch-checkpoint"  # the cache's file in a partition directory
LEADER_EPOCH_VERSION = 0  # first line of the file
UNDEFINED_EPOCH = -1  # no epoch known (Kafka's UNDEFINED_EPOCH)
UNDEFINED_EPOCH_OFFSET = -1  # no end offset known (Kafka's UNDEFINED_EPOCH_OFFSET)
_MAX_FILE_BYTES = 16 << 20  # far more epochs than any partition has

logger = logging.getLogger(__name__)


class LeaderEpochCache:
    """The ``(epoch, start_offset)`` entries of one partition, in ``<directory>/leader-epoch-checkpoint``.

    Every method that changes the entries writes the file before it returns (raising OSError
    when that fails: the entries in memory have changed all the same, and the next change, or
    the next open's check against the log, puts the file right), except :meth:`assign` with
    ``durable=False``, which leaves it to :meth:`flush` (module docstring).
    """

    def __init__(self, directory: str, *, name: str = "") -> None:
        """Load the file in ``directory`` (see the module docstring for a missing or bad one)."""
        self.directory = directory
        self.path = os.path.join(directory, LEADER_EPOCH_FILE_NAME)
        self._name = name or os.path.basename(os.path.normpath(directory))
        self._epochs: list[int] = []
        self._start_offsets: list[int] = []
        self._dirty = False  # the file lags the entries in memory (assign with durable=False)
        self._load()

    def __repr__(self) -> str:
        return f"LeaderEpochCache({self.path!r}, {self.entries})"

    @property
    def entries(self) -> list[tuple[int, int]]:
        """The ``(epoch, start_offset)`` entries, oldest first."""
        return list(zip(self._epochs, self._start_offsets, strict=True))

    @property
    def dirty(self) -> bool:
        """Whether the file lags the entries in memory (an ``assign(durable=False)`` not yet
        flushed, or a write that failed)."""
        return self._dirty

    def flush(self) -> bool:
        """Write the file, durably, if it lags the entries in memory; True if it wrote.
        Raises OSError (the cache stays dirty)."""
        if not self._dirty:
            return False
        self._write()
        return True

    @property
    def latest_epoch(self) -> int:
        """The newest epoch, or UNDEFINED_EPOCH (-1) when there is none."""
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int, *, durable: bool = True) -> bool:
        """Record that ``epoch`` began at ``start_offset``; True when the entries changed.
        The file is written before this returns, unless ``durable`` is False: then the cache is
        :attr:`dirty` until :meth:`flush` (module docstring says when that is safe).

        As Kafka does (since 2.1, KAFKA-7415): the same epoch as the latest at the same or a
        later offset changes nothing (the epoch began earlier); anything else is the newest
        truth: the entries whose epoch is at or above ``epoch``, or whose start offset is at or
        above ``start_offset``, are removed (with a warning unless it is only the latest epoch
        moving its start) and the new entry is appended, so both columns stay strictly
        increasing.  The log calls it as it appends the first batch of an epoch."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"[{self._name}] leader epoch {epoch} at offset {start_offset}: both must be "
                             f">= 0")
        if self._epochs and self._epochs[-1] == epoch and start_offset >= self._start_offsets[-1]:
            return False
        removed = []
        while self._epochs and (self._epochs[-1] >= epoch or self._start_offsets[-1] >= start_offset):
            removed.append((self._epochs.pop(), self._start_offsets.pop()))
        if len(removed) > 1 or (removed and removed[0][1] != start_offset):
            logger.warning("[%s] leader epoch %d at offset %d removes the conflicting entries %s",
                           self._name, epoch, start_offset, removed[::-1])
        self._epochs.append(epoch)
        self._start_offsets.append(start_offset)
        if durable:
            self._write()
        else:
            self._dirty = True
        return True

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """``(epoch, end_offset)`` for a follower whose latest epoch is ``epoch``: the end offset
        is the start offset of the first epoch after it (for the latest epoch, ``log_end_offset``),
        and the epoch returned is the newest one at or below ``epoch`` this cache knows.  An epoch
        below the first one known, above the latest, or UNDEFINED_EPOCH is undefined:
        ``(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)``, i.e. (-1, -1)."""
        if epoch == UNDEFINED_EPOCH or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if epoch == self._epochs[-1]:
            return epoch, log_end_offset
        floor = bisect.bisect_right(self._epochs, epoch) - 1  # the newest entry at or below epoch
        if floor < 0 or floor + 1 >= len(self._epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        return self._epochs[floor], self._start_offsets[floor + 1]

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was truncated to ``end_offset``: drop the entries starting at or after it."""
        keep = bisect.bisect_left(self._start_offsets, end_offset)
        if keep < len(self._epochs):
            logger.info("[%s] leader epochs %s dropped: the log ends at %d", self._name,
                        self.entries[keep:], end_offset)
            del self._epochs[keep:], self._start_offsets[keep:]
            self._write()

    def truncate_from_start(self, start_offset: int) -> None:
        """Retention moved the log start to ``start_offset``: drop the entries wholly below it;
        the newest entry starting at or below it is kept, starting at ``start_offset``."""
        covering = bisect.bisect_right(self._start_offsets, start_offset) - 1
        if covering < 0 or (covering == 0 and self._start_offsets[0] == start_offset):
            return
        del self._epochs[:covering], self._start_offsets[:covering]
        self._start_offsets[0] = start_offset
        self._write()

    def clear(self) -> None:
        """The log was emptied and starts again elsewhere: drop every entry."""
        if self._epochs:
            logger.info("[%s] leader epochs %s dropped: the log was emptied", self._name, self.entries)
        del self._epochs[:], self._start_offsets[:]
        self._write()

    # --- the file ---------------------------------------------------------------------------------

    def _write(self) -> None:
        lines = [f"{LEADER_EPOCH_VERSION}\n{len(self._epochs)}\n"]
        lines += [f"{epoch} {offset}\n" for epoch, offset in self.entries]
        self._dirty = True  # until the new file is in place
        replace_atomically(self.path, "".join(lines).encode("ascii"))
        self._dirty = False

    def _load(self) -> None:
        try:
            with open(self.path, "rb") as f:
                content = f.read(_MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return
        entries = _parse(content)
        if entries is None:
            logger.warning("[%s] ignoring the malformed leader-epoch file %s (the epochs of new appends are "
                           "recorded again): %r", self._name, self.path, content[:200])
            try:
                self._write()
            except OSError as e:
                logger.warning("[%s] cannot rewrite %s: %s", self._name, self.path, e)
            return
        self._epochs = [epoch for epoch, _ in entries]
        self._start_offsets = [offset for _, offset in entries]


def _parse(content: bytes) -> list[tuple[int, int]] | None:
    """The entries of a well-formed file (module docstring), or None."""
    if len(content) > _MAX_FILE_BYTES or not content.endswith(b"\n"):
        return None
    lines = content[:-1].split(b"\n")
    if len(lines) < 2 or lines[0] != str(LEADER_EPOCH_VERSION).encode() or not lines[1].isdigit():
        return None
    if int(lines[1]) != len(lines) - 2:
        return None
    entries = []
    for line in lines[2:]:
        fields = line.split(b" ")
        if len(fields) != 2 or not all(field.isdigit() for field in fields):
            return None
        epoch, offset = int(fields[0]), int(fields[1])
        if entries and (epoch <= entries[-1][0] or offset <= entries[-1][1]):
            return None
        entries.append((epoch, offset))
    return entries
