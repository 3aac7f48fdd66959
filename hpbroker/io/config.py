"""Configuration of one partition log: :class:`LogConfig`.

One frozen dataclass, validated on construction; an out-of-range or mistyped field raises
:class:`~hpbroker.errors.InvalidConfigError` whose message names the field, its allowed range and
the value given.  Derive variants with :meth:`LogConfig.replace`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hpbroker.errors import InvalidConfigError

__all__ = ["LogConfig", "MAX_SEGMENT_BYTES", "MIN_SEGMENT_BYTES"]

# Index entries store byte positions as u32 and every segment stays below its limit (a request
# larger than segment_bytes gets a segment of its own; the log refuses one larger than this),
# so a segment never outgrows an i32.
MAX_SEGMENT_BYTES = 2**31 - 1
# Small enough for tests that roll every few batches, large enough to hold any batch header.
MIN_SEGMENT_BYTES = 512
_MAX_I32 = 2**31 - 1
_MAX_I64 = 2**63 - 1
_DAY_MS = 24 * 60 * 60 * 1000


@dataclass(frozen=True, slots=True)
class LogConfig:
    """How one partition log rolls, indexes, flushes and retains its segments.

    Invariants (checked in ``__post_init__``): every field is an ``int`` (``flush_fsync`` and
    ``unclean_leader_election`` a ``bool``) within the range documented beside it.  Instances are
    immutable and may be shared by any number of logs.
    """

    #: bytes; roll to a new segment when the active one would grow past this with the request
    #: being appended (decided once per request: a request never straddles two segments, and
    #: one larger than this gets a segment to itself).  Default 1 GiB.
    #: Range [512, 2**31 - 1]: index entries hold positions as u32.
    segment_bytes: int = 1 << 30
    #: ms; roll when a request's largest timestamp is more than this after the active segment's
    #: first batch timestamp (Kafka's rule; the wall clock since the segment's creation where
    #: timestamps are missing).  Default 7 days.  Range [1, 2**63 - 1].
    segment_ms: int = 7 * _DAY_MS
    #: ms; a closed segment whose largest timestamp (or, holding none, its file's modification
    #: time) is older than now minus this is deleted.
    #: Default 7 days; -1 keeps segments forever.  Range [-1, 2**63 - 1].
    retention_ms: int = 7 * _DAY_MS
    #: bytes; delete the oldest closed segments while the log without them still holds at least
    #: this much.  Default -1 (no size limit).  Range [-1, 2**63 - 1].
    retention_bytes: int = -1
    #: bytes; one offset index entry per this many bytes of log (0: one entry per batch).
    #: Default 4096.  Range [0, 2**31 - 1].
    index_interval_bytes: int = 4096
    #: bytes; the largest batch accepted, whole (its 12-byte log overhead included).  Default
    #: 1 MiB + 12 = 1_048_588, so a batch whose length field says 1 MiB fits.  Range [56, 2**31 - 1].
    max_message_bytes: int = (1 << 20) + 12
    #: records; flush once this many appended records are pending.  Default 10_000.  Range [1, 2**31 - 1].
    flush_messages: int = 10_000
    #: ms; flush once the oldest pending append is this old.  Default 1.  Range [0, 2**31 - 1].
    flush_ms: int = 1
    #: whether a flush ends with ``fdatasync`` (power-loss safe) or leaves data in the page cache
    #: (process-crash safe only).  Default True.
    flush_fsync: bool = True
    #: ms; how long the file descriptors of deleted segments stay open, so a slice being sent
    #: from one stays readable.  Default 60_000.  Range [0, 2**31 - 1].
    file_delete_delay_ms: int = 60_000
    #: ms; an append whose batch holds a record timestamp more than this ahead of the broker's
    #: clock is refused (InvalidTimestampError), so one producer with a wrong clock cannot stall
    #: time-based retention and rolling of every later segment (Kafka's setting of the same
    #: name).  Default 3_600_000 (1 hour); 2**63 - 1 accepts any.  Range [0, 2**63 - 1].
    message_timestamp_after_max_ms: int = 3_600_000
    #: ms; the partition forgets an idempotent producer (its epoch and newest runs, the state
    #: that deduplicates its retries, hpbroker.io.producer_state) once it has appended nothing
    #: for this long; checked by each retention pass (Kafka's ``producer.id.expiration.ms``).
    #: Default 86_400_000 (1 day).  Range [1, 2**63 - 1].
    producer_id_expiration_ms: int = _DAY_MS
    #: replicas; the fewest in-sync replicas (the leader included) with which a replicated
    #: partition takes an ``acks=all`` produce; fewer is NotEnoughReplicasError (Kafka's
    #: ``min.insync.replicas``).  Read by the broker's replication, not by the log.  Default 1.
    #: Range [1, 100].
    min_insync_replicas: int = 1
    #: whether a replicated partition whose in-sync replicas are all gone may get a leader that was
    #: not in sync (available again, at the price of the acknowledged records it lacks; Kafka's
    #: ``unclean.leader.election.enable``).  Read by the controller, not by the log.  Default False.
    unclean_leader_election: bool = False

    def __post_init__(self) -> None:
        _check_int("segment_bytes", self.segment_bytes, MIN_SEGMENT_BYTES, MAX_SEGMENT_BYTES)
        _check_int("segment_ms", self.segment_ms, 1, _MAX_I64)
        _check_int("retention_ms", self.retention_ms, -1, _MAX_I64)
        _check_int("retention_bytes", self.retention_bytes, -1, _MAX_I64)
        _check_int("index_interval_bytes", self.index_interval_bytes, 0, _MAX_I32)
        _check_int("max_message_bytes", self.max_message_bytes, 56, _MAX_I32)
        _check_int("flush_messages", self.flush_messages, 1, _MAX_I32)
        _check_int("flush_ms", self.flush_ms, 0, _MAX_I32)
        _check_int("file_delete_delay_ms", self.file_delete_delay_ms, 0, _MAX_I32)
        _check_int("message_timestamp_after_max_ms", self.message_timestamp_after_max_ms, 0, _MAX_I64)
        _check_int("producer_id_expiration_ms", self.producer_id_expiration_ms, 1, _MAX_I64)
        _check_int("min_insync_replicas", self.min_insync_replicas, 1, 100)
        for name in ("flush_fsync", "unclean_leader_election"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")

    def replace(self, **changes: object) -> LogConfig:
        """A copy with ``changes`` applied, validated like a new instance."""
        try:
            return dataclasses.replace(self, **changes)
        except TypeError as e:  # an unknown field name
            raise InvalidConfigError(f"LogConfig.replace: {e}") from e


def _check_int(field: str, value: object, lowest: int, highest: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidConfigError(f"{field} must be an int, got {value!r} ({type(value).__name__})")
    if not lowest <= value <= highest:
        raise InvalidConfigError(f"{field} must be in [{lowest}, {highest}], got {value}")
