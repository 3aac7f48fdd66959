"""A worker's share of replication: the leader and follower roles of the partitions it owns.

Roles come from the arbiter as ``replica_role`` controls (``hpbroker.workers.backend``), parsed
into a :class:`ReplicaRole`, and are applied by :class:`Replication` to the partition's
:class:`~hpbroker.workers.partitions.Partition` as its ``replica``:

- :class:`LeaderReplica`: this broker leads the partition in ``leader_epoch``.  The log records
  the epoch (``PartitionLog.begin_leader_epoch``) and every produce is stamped with it.  The
  epoch is recorded in memory only (``durable=False``): its ``leader-epoch-checkpoint`` file is
  written by the log before the first record of the epoch is flushed, and otherwise by
  :meth:`Replication.tick`, EPOCH_FILES_PER_TURN partitions per loop turn, so that many
  partitions made leader at once (a broker died) cost the loop no fsync per partition
  (``hpbroker.io.leader_epochs`` says why an entry lost to a crash before then is harmless).  A
  :class:`~hpbroker.replica.leader.LeaderState` tracks each follower's flushed end (from its
  replica fetches) and computes the replicated high watermark (HW): consumers read below it,
  ListOffsets LATEST answers it, an acks=-1 produce is answered once it passes the request's
  last offset (NotEnoughReplicasError at once, nothing appended, when the ISR is smaller than
  ``min_insync_replicas``; and, saying the records were appended, when the ISR shrank below it
  while the request waited: Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND).  The
  leader proposes ISR changes to the arbiter (worker control ``isr_change``) when a follower
  falls ``replica_lag_time_max_ms`` behind or catches up again, checked at each replica fetch and
  on a timer (for followers gone silent); the arbiter writes the change to ZooKeeper and the new
  ISR comes back as a role of the same epoch.
- :class:`FollowerReplica`: another broker leads.  Produce, consumer fetch and list-offsets get
  NotLeaderOrFollowerError naming the leader (its host and front-end port, the role's
  ``leader_port``).  The partition fetches from the leader's data port
  with a :class:`~hpbroker.replica.fetcher.ReplicaFetcher` of its own (a connection per followed
  partition: the data port answers a connection's requests in order, so a fetch parked at a
  caught-up partition's end would hold back the others' answers), from its log end,
  and appends the leader's very bytes
  (``PartitionLog.append_replicated``), flushing them at once, one group commit per response
  (fdatasync'd as the topic's ``flush_fsync`` says).  While that flush runs it fetches the next
  range without waiting at the leader (FetchRequest version 2: ``durable_offset`` its flushed
  end, which alone counts toward the leader's HW); after an empty answer, or with both flushes
  of the partition in flight, it waits for a flush to complete, and a fetch sent with nothing
  being flushed says its offset is durable (version 1) and may wait at the leader.  A response
  naming a diverging epoch truncates the log first (``hpbroker.replica.divergence``), an offset
  out of range below the leader's log start empties it and starts it there
  (``truncate_fully_and_start_at``); a range the leader cannot give intact (its bytes fail
  this replica's checks, or it answers error 2, 7 or 18) is logged once, counted failed
  (``fetch_failed`` in the stats) and fetched again after a backoff doubling up to
  FAILED_FETCH_BACKOFF_MAX_S, and at once on a new leader or epoch; any other error, or a lost
  connection, is retried after a backoff until a new role arrives.
- A role ``none``: the broker holds the partition but is no replica of it in this epoch (it is
  being moved away): every request is refused like a follower's; nothing is fetched.

A partition never given a role is *unreplicated*: it behaves exactly as before replication
existed (acks=-1 is acks=1).  A partition opened with ``replicated`` in its spec refuses
requests with NotLeaderOrFollowerError until its first role arrives, so that nothing is
appended to it outside an epoch.

Role changes: a role whose ``leader_epoch`` is older than the partition's current one is refused
(the ``ack`` carries the error; nothing changes).  The same epoch as leader again updates the
ISR, ``min_insync_replicas`` and ``replica_lag_time_max_ms`` (a topic altered meanwhile).
Leaving the leader role fails the acks=-1 produce requests still waiting
(NotLeaderOrFollowerError: they may or may not have been stored) and every parked fetch; so
does a graceful stop (``Partition.flush_and_answer``), for those its last flush did not commit.

High watermark on disk: each replicated partition keeps the HW it knows (a leader's, or the one
a follower heard from its leader) in its ``high-watermark-checkpoint`` file
(:class:`HighWatermarkCheckpoint`), written where it moved every
HIGH_WATERMARK_CHECKPOINT_INTERVAL_S and at a clean close.  The first role after a (re)start
starts from it (at most the log's flushed end), so a restarted leader's consumers and ListOffsets
LATEST see what was committed before, without waiting for every follower's first fetch.

Divergence answers (leader side): ``diverging_epoch`` and ``diverging_end_offset`` of a
FetchResponse; when the leader cannot tell where the follower's epoch ends
(``replica.divergence.diverging_epoch`` answers (-1, -1)) it sends ``diverging_epoch`` -1 with
its HW as ``diverging_end_offset``, so that the answer is told apart from "no divergence" (both
-1): the follower then truncates to that HW, below which every record is committed.

Single-threaded: everything runs on the worker's event loop.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpbroker import protocol
from hpbroker.errors import (
    CorruptRecordError,
    DamagedRangeError,
    FencedLeaderEpochError,
    HPBrokerError,
    InvalidRequestError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    StorageError,
    UnsupportedVersionError,
)
from hpbroker.io.checkpoint import OffsetCheckpointFile
from hpbroker.replica.divergence import diverging_epoch, truncation_offset
from hpbroker.replica.fetcher import ReplicaFetcher
from hpbroker.replica.leader import LeaderState
from hpbroker.workers.replies import fetch_reply

if TYPE_CHECKING:
    from hpbroker.workers.partitions import FetchWaiter, Partition, PartitionSet

__all__ = [
    "EPOCH_FILES_PER_TURN",
    "FAILED_FETCH_BACKOFF_MAX_S",
    "FETCH_BACKOFF_MAX_S",
    "FETCH_BACKOFF_MIN_S",
    "HIGH_WATERMARK_CHECKPOINT_FILE_NAME",
    "HIGH_WATERMARK_CHECKPOINT_INTERVAL_S",
    "FollowerReplica",
    "HighWatermarkCheckpoint",
    "LeaderReplica",
    "NoReplica",
    "UNSAFE_ACK_BEFORE_REPLICATION_ENV",
    "unsafe_ack_before_replication",
    "ReplicaRole",
    "Replication",
]

logger = logging.getLogger(__name__)

ROLE_LEADER, ROLE_FOLLOWER, ROLE_NONE = "leader", "follower", "none"
# How soon a follower fetches again after an error, first and at most (seconds).
FETCH_BACKOFF_MIN_S = 0.1
FETCH_BACKOFF_MAX_S = 2.0
# How long a follower waits, at most, before fetching again a range its leader could not give
# intact (bytes failing the follower's checks; error 2, 7 or 18 from the leader): Kafka marks such
# a partition failed; here it stays counted failed and is retried, at once on a new role.
FAILED_FETCH_BACKOFF_MAX_S = 30.0
_DAMAGED_AT_THE_LEADER = frozenset({CorruptRecordError.code, StorageError.code, DamagedRangeError.code})
# How many leader-epoch files a loop turn writes, at most, of those a new leader left to write
# (each costs two fsyncs; the log writes a partition's file itself before its first flush).
EPOCH_FILES_PER_TURN = 4
# How often a leader checks its followers' lag without a fetch to trigger it, at most (seconds).
ISR_CHECK_MAX_INTERVAL_S = 1.0
# The replicated high watermark kept in the partition directory (docs/FORMAT.md), and how often
# it is written where it moved (Kafka's replica.high.watermark.checkpoint.interval.ms).
HIGH_WATERMARK_CHECKPOINT_FILE_NAME = "high-watermark-checkpoint"
HIGH_WATERMARK_CHECKPOINT_INTERVAL_S = 5.0
# Test only, a planted bug for the chaos suite's checker: set to "1" in a broker's environment,
# its leaders answer acks=all at their own flush, breaking the acks=all promise (docs/REPLICATION.md).
UNSAFE_ACK_BEFORE_REPLICATION_ENV = "HPBROKER_UNSAFE_ACK_BEFORE_REPLICATION"


def unsafe_ack_before_replication(environ: Mapping[str, str] | None = None) -> bool:
    """Whether UNSAFE_ACK_BEFORE_REPLICATION_ENV is on in ``environ`` (default: this process's
    environment, which the arbiter's workers inherit): exactly "1".  The arbiter announces it
    (an ERROR line at start, the ``hpbroker_unsafe_ack_before_replication`` gauge); every worker
    logs a warning and its leaders act on it."""
    return (os.environ if environ is None else environ).get(UNSAFE_ACK_BEFORE_REPLICATION_ENV) == "1"


@dataclass(frozen=True, slots=True)
class ReplicaRole:
    """A ``replica_role`` control's body (``hpbroker.workers.backend``), checked."""

    topic: str
    partition: int
    role: str
    leader_epoch: int
    leader: int
    leader_address: tuple[str, int] | None
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    min_insync_replicas: int = 1
    lag_time_max_ms: int = 30_000
    leader_port: int | None = None  # the leader's front-end port, which clients are told

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ReplicaRole:
        """ValueError naming the field when ``body`` is not a valid role."""
        def integer(name: str, low: int, default: int | None = None) -> int:
            value = body.get(name, default)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"replica_role: {name} must be an int >= {low}, got {value!r}")
            return value

        def brokers(name: str) -> tuple[int, ...]:
            value = body.get(name)
            if not isinstance(value, list) or not all(
                    isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in value):
                raise ValueError(f"replica_role: {name} must be a list of broker ids, got {value!r}")
            return tuple(value)

        topic, role = body.get("topic"), body.get("role")
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"replica_role: topic must be a name, got {topic!r}")
        if role not in (ROLE_LEADER, ROLE_FOLLOWER, ROLE_NONE):
            raise ValueError(f"replica_role: role must be leader, follower or none, got {role!r}")
        address = body.get("leader_address")
        if address is not None:
            if (not isinstance(address, list) or len(address) != 2 or not isinstance(address[0], str)
                    or not isinstance(address[1], int) or not 0 < address[1] < 65536):
                raise ValueError(f"replica_role: leader_address must be [host, data_port] or null, got "
                                 f"{address!r}")
            address = (address[0], address[1])
        port = body.get("leader_port")
        if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
            raise ValueError(f"replica_role: leader_port must be a port or null, got {port!r}")
        return cls(topic, integer("partition", 0), role, integer("leader_epoch", 0), integer("leader", -1),
                   address, brokers("replicas"), brokers("isr"), integer("min_insync_replicas", 1, 1),
                   integer("replica_lag_time_max_ms", 1, 30_000), port)

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def leader_text(self) -> str:
        """Who leads, for a NotLeaderOrFollowerError message: the leader's host and front-end port,
        where clients send requests (the data port in ``leader_address`` is for fetches only);
        no address when the role lacks the front-end port."""
        if self.leader < 0:
            return f"it has no leader now (leader epoch {self.leader_epoch})"
        where = ""
        if self.leader_address is not None and self.leader_port is not None:
            where = f" at {self.leader_address[0]}:{self.leader_port}"
        return f"the leader is broker {self.leader}{where} (leader epoch {self.leader_epoch})"


class HighWatermarkCheckpoint:
    """A replicated partition's ``high-watermark-checkpoint`` file (Kafka's
    replication-offset-checkpoint, one file per partition directory; docs/FORMAT.md): the
    replicated HW as this broker last knew it, so that a restarted broker's partition starts its
    HW there (at most its log end) instead of at its log start.  Written where the HW moved,
    every HIGH_WATERMARK_CHECKPOINT_INTERVAL_S and at a clean close; never on an append.  The
    periodic writes are not fsynced (a process crash keeps them; after an OS crash the file
    may hold an older HW or be gone: the HW then starts lower and rises as the followers fetch,
    which is always safe); the one at a clean close is, when the topic's ``flush_fsync`` is on.
    A write that fails is logged and tried again at the next turn."""

    def __init__(self, directory: str) -> None:
        self._file = OffsetCheckpointFile(os.path.join(directory, HIGH_WATERMARK_CHECKPOINT_FILE_NAME))
        self.written: int | None = None  # the offset the file holds, as far as known

    def read(self) -> int | None:
        self.written = self._file.read()
        return self.written

    def write(self, high_watermark: int, *, durable: bool = False) -> None:
        if high_watermark == self.written and not durable:
            return
        try:
            self._file.write(high_watermark, durable=durable)
        except OSError as e:
            logger.warning("cannot write %s: %s", self._file.path, e)
            self.written = None
            return
        self.written = high_watermark


class _Replica:
    """What a partition's role gives it (``Partition.replica``); see the subclasses.
    ``checkpoint``: the partition's high-watermark file, handed from role to role."""

    leading = False

    def __init__(self, partition: Partition, role: ReplicaRole, checkpoint: HighWatermarkCheckpoint) -> None:
        self.partition = partition
        self.role = role
        self.checkpoint = checkpoint

    @property
    def leader_epoch(self) -> int:
        return self.role.leader_epoch

    @property
    def high_watermark(self) -> int:
        """The offset consumers may read below (the replicated HW as this replica knows it)."""
        return self.partition.log.high_watermark

    def not_leader(self, broker_id: int) -> NotLeaderOrFollowerError:
        return NotLeaderOrFollowerError(f"broker {broker_id} does not lead {self.role.name}: "
                                        f"{self.role.leader_text()}")

    def check_produce(self, acks: int) -> int:
        """Raise when a produce must be refused before anything is appended; else the acks
        level to answer it at (``acks`` itself but under UNSAFE_ACK_BEFORE_REPLICATION_ENV)."""
        return acks

    def flushed(self) -> None:
        """A group commit of the partition's log was applied."""

    def settle_error(self) -> HPBrokerError | None:
        """The error for an acks=-1 produce whose records reached the HW (None: success)."""
        return None

    def heartbeat(self) -> dict[str, Any]:
        return {"role": self.role.role, "leader": self.role.leader, "leader_epoch": self.role.leader_epoch,
                "replicas": list(self.role.replicas), "isr": list(self.role.isr)}

    def checkpoint_high_watermark(self, *, closing: bool = False) -> None:
        """Write the HW to the partition's checkpoint if it moved (``closing``: the worker stops
        cleanly; fsynced when the topic's ``flush_fsync`` is on)."""
        log = self.partition.log
        if log.offline or log.closed:
            return
        self.checkpoint.write(self.high_watermark, durable=closing and log.config.flush_fsync)

    def close(self) -> None:
        """The worker stops cleanly and the log is about to close (its last flush done)."""
        self.checkpoint_high_watermark(closing=True)


class LeaderReplica(_Replica):
    """The partition is led here, in ``role.leader_epoch`` (module docstring)."""

    leading = True

    def __init__(self, partition: Partition, role: ReplicaRole, checkpoint: HighWatermarkCheckpoint,
                 state: LeaderState) -> None:
        super().__init__(partition, role, checkpoint)
        self.state = state
        self.isr_shrinks = self.isr_expands = 0
        self.unsafe_ack_before_replication = False  # UNSAFE_ACK_BEFORE_REPLICATION_ENV (tests only)

    @property
    def high_watermark(self) -> int:
        return self.state.current_high_watermark

    def update_high_watermark(self) -> bool:
        """Recompute the HW from the log's flushed end; True when it moved."""
        before = self.state.current_high_watermark
        return self.state.high_watermark(self.partition.log.high_watermark) != before

    def flushed(self) -> None:
        self.update_high_watermark()  # the partition settles its produces and wakes its fetches next

    def check_produce(self, acks: int) -> int:
        if acks == protocol.ACKS_ALL:
            if self.unsafe_ack_before_replication:
                return 1  # the planted bug: acks=all answered at this leader's own flush
            self.state.check_min_isr(self.role.name)
        return acks

    def settle_error(self) -> HPBrokerError | None:
        """Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND, sent as error 24: the records were appended
        (and every replica of the smaller ISR has them) but fewer replicas than
        ``min_insync_replicas`` hold them.  Retriable: an idempotent producer's retry is found
        stored and not appended again."""
        state = self.state
        if len(state.isr) >= state.min_insync_replicas:
            return None
        return NotEnoughReplicasError(
            f"{self.role.name}: the records were appended but the ISR shrank below min_insync_replicas "
            f"{state.min_insync_replicas} before every replica had them (now {len(state.isr)} in-sync "
            f"replicas {list(state.isr)}); they may be committed later; retry (an idempotent producer's "
            f"retry is not stored twice)")

    def role_updated(self, role: ReplicaRole) -> None:
        """A role of the same epoch: ZooKeeper's ISR (this leader's proposal, or the controller's),
        and the topic's ``min_insync_replicas`` and ``replica_lag_time_max_ms`` as they are now
        (an altered topic's new values apply at once, not at the next epoch)."""
        state = self.state
        old, new = set(state.isr), set(role.isr)
        if state.replicas != role.replicas:  # a reassignment under way
            logger.info("[%s] replicas %s (were %s)", role.name, list(role.replicas), list(state.replicas))
            state.replicas_changed(role.replicas)
        state.isr_changed(role.isr)
        if (state.min_insync_replicas, state.lag_time_max_ms) != (role.min_insync_replicas,
                                                                   role.lag_time_max_ms):
            logger.info("[%s] min_insync_replicas %d, replica_lag_time_max_ms %d (were %d, %d)", role.name,
                        role.min_insync_replicas, role.lag_time_max_ms, state.min_insync_replicas,
                        state.lag_time_max_ms)
            state.min_insync_replicas = role.min_insync_replicas
            state.lag_time_max_ms = role.lag_time_max_ms
        self.role = role
        if old - new:
            self.isr_shrinks += 1
        if new - old:
            self.isr_expands += 1
        if old != new:
            logger.info("[%s] ISR %s -> %s (leader epoch %d)", role.name, sorted(old), list(role.isr),
                        role.leader_epoch)

    def heartbeat(self) -> dict[str, Any]:
        entry = super().heartbeat()
        entry["isr"] = list(self.state.isr)
        return entry

    def stats(self) -> dict[str, Any]:
        """For ``hpbroker.workers.stats``: each follower's lag behind the leader's flushed end,
        in records and bytes (from its last fetch; a follower that has not fetched in this epoch
        counts from the log start), and the ISR's shrinks and expands since leadership began."""
        log = self.partition.log
        end = log.high_watermark
        followers = []
        for replica, (fetch_offset, last_caught_up_ms) in sorted(self.state.follower_progress().items()):
            offset = fetch_offset if fetch_offset >= 0 else log.log_start_offset
            followers.append({"broker": replica, "fetch_offset": fetch_offset,
                              "in_sync": replica in self.state.isr, "lag_records": max(0, end - offset),
                              "lag_bytes": _bytes_after(log, offset), "last_caught_up_ms": last_caught_up_ms})
        return {"isr_shrinks": self.isr_shrinks, "isr_expands": self.isr_expands, "followers": followers,
                "under_replicated": int(len(self.state.isr) < len(self.state.replicas))}


class FollowerReplica(_Replica):
    """Another broker leads; this one fetches from it with ``fetcher`` (None: no leader known)."""

    def __init__(self, partition: Partition, role: ReplicaRole, checkpoint: HighWatermarkCheckpoint,
                 fetcher: ReplicaFetcher | None, leader_high_watermark: int) -> None:
        super().__init__(partition, role, checkpoint)
        self.fetcher = fetcher
        self.leader_high_watermark = leader_high_watermark  # the leader's HW as last heard
        self.in_flight = False
        self.retry_at = 0.0
        self.backoff_s = FETCH_BACKOFF_MIN_S
        self.on_flushed: Callable[[FollowerReplica], None] | None = None
        self.epochs_checked = False  # a log without leader epochs was cut back to the HW (once)
        self.pipelining = True  # False once the leader refused FetchRequest version 2
        self.fetch_pipelined = False  # the fetch in flight was sent while a flush ran
        self.pipelining_paused = False  # the last answer was empty: the next fetch waits for the flush
        # The offset from which the leader could not give its range intact (its bytes failed this
        # replica's checks, or it answered a storage error there), until a fetch gets past it.
        self.failed_offset: int | None = None
        self.failed_backoff_s = FETCH_BACKOFF_MIN_S

    @property
    def high_watermark(self) -> int:
        return max(self.partition.log.log_start_offset,
                   min(self.leader_high_watermark, self.partition.log.high_watermark))

    def flushed(self) -> None:
        if self.on_flushed is not None:
            self.on_flushed(self)

    def failed(self, now: float) -> None:
        """Fetch again after the backoff, which doubles up to FETCH_BACKOFF_MAX_S."""
        self.retry_at = now + self.backoff_s
        self.backoff_s = min(2 * self.backoff_s, FETCH_BACKOFF_MAX_S)

    def range_failed(self, offset: int, now: float) -> bool:
        """The range from ``offset`` could not be fetched intact: fetch it again after a backoff
        doubling up to FAILED_FETCH_BACKOFF_MAX_S.  True when this is news (another offset)."""
        news = self.failed_offset != offset
        if news:
            self.failed_backoff_s = FETCH_BACKOFF_MIN_S
        self.failed_offset = offset
        self.retry_at = now + self.failed_backoff_s
        self.failed_backoff_s = min(2 * self.failed_backoff_s, FAILED_FETCH_BACKOFF_MAX_S)
        return news

    def carry_failure(self, previous: _Replica | None) -> None:
        """A role of the same leader and epoch as ``previous`` (an ISR change only): keep its
        failed range and backoff; a new leader or epoch starts afresh, fetching at once."""
        if (isinstance(previous, FollowerReplica) and previous.failed_offset is not None
                and (previous.role.leader, previous.leader_epoch) == (self.role.leader, self.leader_epoch)):
            self.failed_offset = previous.failed_offset
            self.failed_backoff_s = previous.failed_backoff_s
            self.retry_at = previous.retry_at

    def stats(self) -> dict[str, Any]:
        """For ``hpbroker.workers.stats``: ``fetch_failed`` 1 while the leader's range from
        ``failed_offset`` could not be fetched intact."""
        return {"fetch_failed": int(self.failed_offset is not None), "failed_offset": self.failed_offset}


class _LeaderBytesFailed(Exception):
    """The records of a fetch response failed this replica's checks (``append_replicated``
    raised ``error``): the leader's range is at fault, not this replica's log, whose own
    CorruptRecordError (a damaged local segment read by a truncation) takes the partition's
    storage-error path instead."""

    def __init__(self, error: CorruptRecordError) -> None:
        super().__init__(str(error))
        self.error = error


class NoReplica(_Replica):
    """The broker holds the partition's log but is no replica of it in this epoch; it keeps the
    HW it knew (``known_high_watermark``), where a later role starts from."""

    def __init__(self, partition: Partition, role: ReplicaRole, checkpoint: HighWatermarkCheckpoint,
                 known_high_watermark: int) -> None:
        super().__init__(partition, role, checkpoint)
        self._known_high_watermark = known_high_watermark

    @property
    def high_watermark(self) -> int:
        log = self.partition.log
        return max(log.log_start_offset, min(self._known_high_watermark, log.high_watermark))


class Replication:
    """The roles of one worker's partitions, their fetchers and the leader's timers (module
    docstring).  ``send_control(op, **body)`` sends a control to the arbiter."""

    def __init__(self, broker_id: int, partitions: PartitionSet, send_control: Callable[..., None], *,
                 fetch_max_bytes: int = 8 << 20, fetch_wait_max_ms: int = 500,
                 clock: Callable[[], float] = time.monotonic,
                 token: Callable[[], tuple[str, int] | None] | None = None) -> None:
        """``token``: on a broker whose data ports need a fetch token, what mints one for this
        broker's own principal (``DataPortGuard.mint_own``); each follower connection
        authenticates with it first (``hpbroker.replica.fetcher``)."""
        self.broker_id = broker_id
        self._token = token
        self._partitions = partitions
        self._send_control = send_control
        self._fetch_max_bytes = fetch_max_bytes
        self._fetch_wait_max_ms = fetch_wait_max_ms
        self._clock = clock
        self._followers: set[Partition] = set()
        self._leaders: set[Partition] = set()
        # Partitions whose leader-epoch file lags their log's entries (begun with durable=False),
        # in the order they became leader; written by tick, a few per turn.
        self._epoch_files: dict[Partition, None] = {}
        self._next_isr_check = 0.0
        self._next_high_watermark_checkpoint = clock() + HIGH_WATERMARK_CHECKPOINT_INTERVAL_S
        self.unsafe_ack_before_replication = unsafe_ack_before_replication()
        if self.unsafe_ack_before_replication:
            logger.warning("%s=1: acks=all produce requests are answered at this leader's own flush, "
                           "without waiting for the in-sync replicas and without the min_insync_replicas "
                           "check: acknowledged records can be lost when the leader changes.  A test-only "
                           "switch (it proves the chaos checker finds lost writes); never set it in "
                           "production", UNSAFE_ACK_BEFORE_REPLICATION_ENV)

    # --- roles -----------------------------------------------------------------------------------

    def apply_role(self, body: dict[str, Any]) -> list[str]:
        """Apply a ``replica_role`` control; the errors for its ack (empty: done)."""
        role = ReplicaRole.from_json(body)
        partition = self._partitions.get(role.topic, role.partition)
        current = partition.replica
        if current is not None and role.leader_epoch < current.leader_epoch:
            return [f"{role.name}: role {role.role} in leader epoch {role.leader_epoch} refused: the "
                    f"partition is in leader epoch {current.leader_epoch} already"]
        if role.role != ROLE_NONE and self.broker_id not in role.replicas:
            raise ValueError(f"{role.name}: role {role.role} for broker {self.broker_id}, which is not among "
                             f"the replicas {list(role.replicas)}")
        if role.role == ROLE_LEADER:
            if role.leader != self.broker_id:
                raise ValueError(f"{role.name}: a leader role naming broker {role.leader} as the leader")
            if isinstance(current, LeaderReplica) and current.leader_epoch == role.leader_epoch:
                current.role_updated(role)
                self._high_watermark_checked(partition, current, always=True)
            else:
                self._become_leader(partition, role)
        elif role.role == ROLE_FOLLOWER:
            if role.leader == self.broker_id:
                raise ValueError(f"{role.name}: a follower role naming this broker as the leader")
            self._become_follower(partition, role)
        else:
            checkpoint, known = self._known_high_watermark(partition)
            self._leave(partition, NoReplica(partition, role, checkpoint, known))
        partition.awaiting_role = False
        return []

    def _known_high_watermark(self, partition: Partition) -> tuple[HighWatermarkCheckpoint, int]:
        """The partition's HW checkpoint, and the replicated HW as this broker knows it, where a
        new role starts from: the last role's; at the first role after a (re)start, the one in
        the partition's checkpoint (:class:`HighWatermarkCheckpoint`), or the log start without
        one.  Never above the log's flushed end: a leader's HW rises from there as its in-sync
        followers fetch, so a consumer never reads a record that may not be committed."""
        current = partition.replica
        log = partition.log
        if current is not None:
            checkpoint, known = current.checkpoint, current.high_watermark
        else:
            checkpoint = HighWatermarkCheckpoint(log.directory)
            stored = checkpoint.read()
            known = stored if stored is not None else log.log_start_offset
        return checkpoint, max(log.log_start_offset, min(known, log.high_watermark))

    def _become_leader(self, partition: Partition, role: ReplicaRole) -> None:
        log = partition.log
        checkpoint, known = self._known_high_watermark(partition)
        # ValueError (older) or StorageError: refused.  The file is written later (module docstring).
        log.begin_leader_epoch(role.leader_epoch, durable=False)
        if log.leader_epochs.dirty:
            self._epoch_files[partition] = None
        start = dict(log.leader_epochs.entries).get(role.leader_epoch, log.log_end_offset)
        state = LeaderState(self.broker_id, role.leader_epoch, role.replicas, role.isr,
                            lag_time_max_ms=role.lag_time_max_ms,
                            min_insync_replicas=role.min_insync_replicas, now_ms=self._now_ms(),
                            leader_epoch_start_offset=start, high_watermark=known)
        leader = LeaderReplica(partition, role, checkpoint, state)
        leader.unsafe_ack_before_replication = self.unsafe_ack_before_replication
        self._leave(partition, leader)
        self._leaders.add(partition)
        logger.info("[%s] leader in epoch %d from offset %d, replicas %s, ISR %s, high watermark %d",
                    role.name, role.leader_epoch, start, list(role.replicas), list(role.isr), known)
        self._high_watermark_checked(partition, leader, always=True)

    def _become_follower(self, partition: Partition, role: ReplicaRole) -> None:
        current = partition.replica
        fetcher = None
        if isinstance(current, FollowerReplica) and current.fetcher is not None and role.leader_address \
                == (current.fetcher.host, current.fetcher.port):
            fetcher = current.fetcher  # the same leader: its fetch in flight is answered to the new role
            current.fetcher = None
        elif role.leader_address is not None and role.leader >= 0:
            fetcher = ReplicaFetcher(self.broker_id, role.leader_address[0], role.leader_address[1],
                                     on_response=self._on_response, on_lost=self._on_lost, now=self._clock(),
                                     token=self._token)
        checkpoint, known = self._known_high_watermark(partition)
        follower = FollowerReplica(partition, role, checkpoint, fetcher, known)
        follower.carry_failure(current)
        follower.on_flushed = self._maybe_fetch
        if fetcher is not None:
            follower.in_flight = fetcher.in_flight(partition.topic, partition.partition)
        self._leave(partition, follower)
        self._followers.add(partition)
        logger.info("[%s] follower in epoch %d: %s", role.name, role.leader_epoch, role.leader_text())
        partition.flush_now()  # what it appended as a leader, if anything: fetching starts once flushed
        self._maybe_fetch(follower)

    def _leave(self, partition: Partition, new: _Replica) -> None:
        """Install ``new`` as the partition's replica, winding up the old role."""
        current = partition.replica
        self._leaders.discard(partition)
        self._followers.discard(partition)
        partition.replica = new
        if isinstance(current, LeaderReplica) and not new.leading:
            error = NotLeaderOrFollowerError(
                f"{new.role.name}: this broker stopped leading it (leader epoch {current.leader_epoch}); "
                f"acks=-1 records not yet answered may or may not have been stored; {new.role.leader_text()}")
            partition.leave_leadership(error)
        if isinstance(current, FollowerReplica):
            current.on_flushed = None
            if current.fetcher is not None:
                current.fetcher.close()
                current.fetcher = None

    def forget(self, partition: Partition) -> None:
        """The partition is closed (its topic deleted): nothing more to fetch for it."""
        self._leaders.discard(partition)
        self._followers.discard(partition)
        self._epoch_files.pop(partition, None)
        replica = partition.replica
        if isinstance(replica, FollowerReplica):
            replica.on_flushed = None
            if replica.fetcher is not None:
                replica.fetcher.close()
                replica.fetcher = None

    # --- the leader ----------------------------------------------------------------------------

    def replica_fetch(self, partition: Partition, request: protocol.FetchRequest, waiter: FetchWaiter,
                      deadline: float) -> None:
        """Serve a follower's fetch (``request.replica_id`` >= 0) of a partition led here."""
        leader = partition.replica
        if not isinstance(leader, LeaderReplica):
            if leader is None:
                raise NotLeaderOrFollowerError(f"broker {self.broker_id} does not lead "
                                               f"{partition.topic}-{partition.partition}: it is not "
                                               f"replicated here{' yet' if partition.awaiting_role else ''}")
            raise leader.not_leader(self.broker_id)
        epoch, asked = leader.leader_epoch, request.current_leader_epoch
        if 0 <= asked < epoch:
            raise FencedLeaderEpochError(f"{leader.role.name}: fetch in leader epoch {asked}, the leader is "
                                         f"in epoch {epoch}")
        if asked > epoch:
            raise NotLeaderOrFollowerError(f"{leader.role.name}: fetch in leader epoch {asked}, broker "
                                           f"{self.broker_id} leads in epoch {epoch} (older)")
        if request.replica_id not in leader.state.replicas or request.replica_id == self.broker_id:
            raise NotLeaderOrFollowerError(f"{leader.role.name}: broker {request.replica_id} is not a "
                                           f"follower; the replicas are {list(leader.state.replicas)}")
        if request.durable_offset < -1:  # -1 alone means "the fetch offset": never take garbage as durable
            raise InvalidRequestError(f"{leader.role.name}: broker {request.replica_id} fetches from offset "
                                      f"{request.offset} with durable offset {request.durable_offset}: "
                                      f"it must be -1 (none) or an offset >= 0")
        log = partition.log
        diverging = diverging_epoch(log.leader_epochs, log.log_end_offset, request.last_fetched_epoch,
                                    request.offset)
        if diverging is not None:
            epoch_found, end_offset = diverging
            if end_offset < 0:  # the leader cannot tell: the follower truncates to the HW
                end_offset = leader.high_watermark
            logger.info("[%s] broker %d diverges: its epoch %d at offset %d; answered epoch %d ending at %d",
                        leader.role.name, request.replica_id, request.last_fetched_epoch, request.offset,
                        epoch_found, end_offset)
            waiter.finished = True
            waiter.responder(fetch_reply(waiter.correlation_id, leader.high_watermark, log.log_start_offset,
                                         None, version=waiter.version, leader_epoch=epoch,
                                         diverging_epoch=epoch_found, diverging_end_offset=end_offset))
            return
        durable = request.offset if request.durable_offset < 0 else request.durable_offset
        if durable > request.offset:
            raise InvalidRequestError(f"{leader.role.name}: broker {request.replica_id} fetches from offset "
                                      f"{request.offset} with durable offset {durable} past it")
        if log.log_start_offset <= request.offset <= log.log_end_offset:
            flushed_end = log.high_watermark
            leader.state.follower_fetched(request.replica_id, request.offset, flushed_end, self._now_ms(),
                                          durable_offset=durable)
            self._high_watermark_checked(partition, leader)
            self._propose_isr(leader)
        partition.fetch(waiter, deadline)

    def _high_watermark_checked(self, partition: Partition, leader: LeaderReplica, *,
                                always: bool = False) -> None:
        """Recompute the HW; when it moved (or ``always``: the ISR changed), answer the produce
        requests and fetches it made answerable."""
        if leader.update_high_watermark() or always:
            partition.high_watermark_moved()

    def _propose_isr(self, leader: LeaderReplica) -> None:
        proposal = leader.state.isr_change(leader.partition.log.high_watermark, self._now_ms())
        if proposal is None:
            return
        role = leader.role
        logger.info("[%s] proposes ISR %s (now %s, leader epoch %d)", role.name, list(proposal),
                    list(leader.state.isr), role.leader_epoch)
        self._send_control("isr_change", topic=role.topic, partition=role.partition,
                           leader_epoch=role.leader_epoch, isr=list(proposal),
                           from_isr=list(leader.state.isr))

    # --- the follower --------------------------------------------------------------------------

    def _maybe_fetch(self, follower: FollowerReplica) -> None:
        """Send the partition's next fetch if it may go now (module docstring)."""
        partition, now = follower.partition, self._clock()
        if (follower.in_flight or follower.fetcher is None or now < follower.retry_at
                or partition.replica is not follower):
            return
        log = partition.log
        if not log.writable:
            return
        if _not_in_a_flush(log):
            partition.flush_now()
            if _not_in_a_flush(log):
                return  # no flush could begin: a completion calls again
        if partition.flushes:
            # Flushing: fetch the next range meanwhile, saying what is durable (the leader counts
            # only that), and with no wait at the leader, so that the next fetch, which says the
            # flush is done, follows soon.  Not after an empty answer: then the flush's
            # completion calls again, for a fetch that may wait at the leader.
            if follower.pipelining and follower.epochs_checked and not follower.pipelining_paused:
                self._send_fetch(follower, durable_offset=log.high_watermark, max_wait_ms=0)
            return
        if not follower.epochs_checked:
            follower.epochs_checked = True
            if not log.leader_epochs.entries and log.log_end_offset > log.log_start_offset:
                # Records but no leader epoch (its file was lost): no divergence can be found by
                # epoch, so keep only what is known committed, as Kafka does, and fetch the rest.
                target = follower.high_watermark
                logger.warning("[%s] holds records but no leader epoch: truncating from %d to the high "
                               "watermark %d before fetching", follower.role.name, log.log_end_offset, target)
                log.truncate_to(target)
        self._send_fetch(follower, durable_offset=None, max_wait_ms=self._fetch_wait_max_ms)

    def _send_fetch(self, follower: FollowerReplica, *, durable_offset: int | None, max_wait_ms: int) -> None:
        partition = follower.partition
        log = partition.log
        assert follower.fetcher is not None
        follower.fetcher.fetch(partition.topic, partition.partition, log.log_end_offset,
                               leader_epoch=follower.leader_epoch,
                               last_fetched_epoch=log.leader_epochs.latest_epoch,
                               max_bytes=self._fetch_max_bytes, max_wait_ms=max_wait_ms,
                               durable_offset=durable_offset)
        follower.in_flight = True
        follower.fetch_pipelined = durable_offset is not None

    def _follower(self, topic: str, partition_id: int) -> tuple[Partition, FollowerReplica] | None:
        try:
            partition = self._partitions.get(topic, partition_id)
        except HPBrokerError:
            return None
        follower = partition.replica
        if not isinstance(follower, FollowerReplica) or not follower.in_flight:
            return None
        if follower.fetcher is not None and follower.fetcher.in_flight(topic, partition_id):
            return None  # news of an earlier fetch (lost before a role reused the fetcher): not this one
        return partition, follower

    def _on_lost(self, topic: str, partition_id: int) -> None:
        """A fetch the fetcher lost with its connection: sent again (the fetcher reconnects
        after its backoff)."""
        found = self._follower(topic, partition_id)
        if found is not None:
            found[1].in_flight = False
            self._maybe_fetch(found[1])

    def _on_response(self, topic: str, partition_id: int, header: protocol.ResponseHeader,
                     response: protocol.FetchResponse) -> None:
        """A replica fetch's answer (the fetcher's callback)."""
        found = self._follower(topic, partition_id)
        if found is None:
            return
        partition, follower = found
        follower.in_flight = False
        now = self._clock()
        try:
            fetch_again = self._apply_response(partition, follower, header, response, now)
        except _LeaderBytesFailed as e:  # the leader's bytes failed this replica's checks
            self._range_failed(follower, str(e.error), now)
            return
        except (StorageError, CorruptRecordError) as e:  # this replica's own log: not the leader's fault
            logger.error("[%s] replicating failed: this replica's log: %s", follower.role.name, e)
            partition.storage_error(e)
            follower.failed(now)
            return
        except HPBrokerError as e:
            logger.error("[%s] replicating from broker %d failed: %s; retrying", follower.role.name,
                         follower.role.leader, e)
            follower.failed(now)
            return
        if fetch_again:
            self._maybe_fetch(follower)

    def _apply_response(self, partition: Partition, follower: FollowerReplica,
                        header: protocol.ResponseHeader, response: protocol.FetchResponse,
                        now: float) -> bool:
        """Apply one fetch response; True when the next fetch may go at once (else a flush or a
        backoff comes first)."""
        log, role = partition.log, follower.role
        pipelined, follower.fetch_pipelined = follower.fetch_pipelined, False
        if header.error_code == UnsupportedVersionError.code and pipelined:
            logger.warning("[%s] broker %d does not serve FetchRequest version 2: fetching only once "
                           "flushed", role.name, role.leader)
            follower.pipelining = False
            return True
        if log.pending_records and (
                header.error_code == OffsetOutOfRangeError.code or response.diverging_epoch >= 0
                or response.diverging_end_offset >= 0):
            follower.pipelining_paused = True  # truncating waits for the flushes: the next fetch,
            return True  # sent once they are done, asks again
        if header.error_code == OffsetOutOfRangeError.code:
            return self._out_of_range(partition, follower, response, now)
        if header.error_code in _DAMAGED_AT_THE_LEADER:
            why = f"the leader answers error {header.error_code}: {header.error_message}"
            self._range_failed(follower, why, now)
            return False
        if header.error_code:
            if follower.backoff_s == FETCH_BACKOFF_MIN_S:
                logger.warning("[%s] fetching from broker %d: error %d: %s; retrying", role.name, role.leader,
                               header.error_code, header.error_message)
            follower.failed(now)
            return False
        if response.high_watermark >= 0:
            follower.leader_high_watermark = response.high_watermark
        follower.backoff_s = FETCH_BACKOFF_MIN_S
        if response.diverging_epoch >= 0 or response.diverging_end_offset >= 0:
            offset = truncation_offset(log.leader_epochs, log.log_end_offset, response.diverging_epoch,
                                       response.diverging_end_offset,
                                       high_watermark=follower.leader_high_watermark)
            offset = max(offset, log.log_start_offset)
            logger.warning("[%s] diverges from the leader (broker %d): its epoch %d ends at %d; truncating "
                           "from %d to %d", role.name, role.leader, response.diverging_epoch,
                           response.diverging_end_offset, log.log_end_offset, offset)
            before = (log.log_end_offset, log.leader_epochs.latest_epoch)
            log.truncate_to(offset)
            if (log.log_end_offset, log.leader_epochs.latest_epoch) == before:
                follower.failed(now)  # nothing changed: asking again at once would loop
                return False
            return True
        if not len(response.payload):
            follower.pipelining_paused = True
            return True
        follower.pipelining_paused = False
        try:
            log.append_replicated(response.payload, immutable=isinstance(response.payload, bytes))
        except CorruptRecordError as e:  # only here is a CorruptRecordError about the leader's bytes
            raise _LeaderBytesFailed(e) from e
        if follower.failed_offset is not None:
            logger.info("[%s] replicating from broker %d again: offset %d came intact (log end now %d)",
                        role.name, role.leader, follower.failed_offset, log.log_end_offset)
            follower.failed_offset = None
        partition.flush_now()  # the next fetch says it durable once this flush is applied
        return True

    def _range_failed(self, follower: FollowerReplica, why: str, now: float) -> None:
        """The leader could not give the range from the follower's log end intact: one error
        in the log per offset and leader epoch, the partition counted as failed, and the next
        fetch after a backoff doubling up to FAILED_FETCH_BACKOFF_MAX_S (a new role retries
        at once)."""
        role, offset = follower.role, follower.partition.log.log_end_offset
        if follower.range_failed(offset, now):
            logger.error("[%s] cannot replicate offset %d from its leader, broker %d (leader epoch %d): "
                         "%s; the partition stays under-replicated; fetching it again with backoff up to "
                         "%.0f s, and at once on a new leader or epoch", role.name, offset, role.leader,
                         role.leader_epoch, why, FAILED_FETCH_BACKOFF_MAX_S)
        else:
            logger.debug("[%s] offset %d from broker %d still fails: %s; next try in %.1f s", role.name,
                         offset, role.leader, why, follower.retry_at - now)

    def _out_of_range(self, partition: Partition, follower: FollowerReplica, response: protocol.FetchResponse,
                      now: float) -> bool:
        log, role = partition.log, follower.role
        end = log.log_end_offset
        if response.log_start_offset > end:
            logger.warning("[%s] the leader's log starts at %d, after this log's end %d: starting again "
                           "there", role.name, response.log_start_offset, end)
            log.truncate_fully_and_start_at(response.log_start_offset)
            return True
        if 0 <= response.high_watermark < end:
            target = max(log.log_start_offset, response.high_watermark)
            logger.warning("[%s] this log ends at %d, after the leader's end: truncating to %d", role.name,
                           end, target)
            log.truncate_to(target)
            return True
        follower.failed(now)
        return False

    # --- the loop ------------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether some partition follows a leader here (so fetchers may need polling)."""
        return bool(self._followers)

    def forget_topic(self, topic: str) -> None:
        """The topic is being deleted: its partitions fetch no more."""
        for partition in [p for p in self._followers | self._leaders if p.topic == topic]:
            self.forget(partition)

    def fetchers(self) -> list[ReplicaFetcher]:
        """The followers' fetchers, for the worker's poll (``fileno``, ``wants_write``, ``process``)."""
        fetchers = []
        for partition in self._followers:
            follower = partition.replica
            if isinstance(follower, FollowerReplica) and follower.fetcher is not None:
                fetchers.append(follower.fetcher)
        return fetchers

    def process(self, fetcher: ReplicaFetcher) -> None:
        """Its socket is ready (or its deadline came)."""
        fetcher.process(0, self._clock())

    def tick(self, now: float) -> None:
        """Timers: fetchers' reconnects and overdue fetches, follower retries, the leaders' ISR
        checks, the leader-epoch files left to write."""
        if self._epoch_files:
            self._write_epoch_files()
        for partition in list(self._followers):
            follower = partition.replica
            if not isinstance(follower, FollowerReplica):
                continue
            fetcher = follower.fetcher
            if fetcher is not None:
                deadline = fetcher.next_deadline()
                if deadline is not None and deadline <= now:
                    fetcher.process(0, now)
            if not follower.in_flight:
                self._maybe_fetch(follower)
        if now >= self._next_isr_check and self._leaders:
            self._next_isr_check = now + self._isr_check_interval_s()
            for partition in list(self._leaders):
                leader = partition.replica
                if isinstance(leader, LeaderReplica):
                    self._high_watermark_checked(partition, leader)
                    self._propose_isr(leader)
        if now >= self._next_high_watermark_checkpoint:
            self._next_high_watermark_checkpoint = now + HIGH_WATERMARK_CHECKPOINT_INTERVAL_S
            for partition in self._leaders | self._followers:
                if partition.replica is not None:
                    partition.replica.checkpoint_high_watermark()

    def _write_epoch_files(self) -> None:
        """Write the leader-epoch files of up to EPOCH_FILES_PER_TURN partitions, oldest leader
        first.  One whose log's writes failed goes last in line and is tried again (its first
        flush once writes resume writes the file anyway); a log closed or offline meanwhile is
        dropped; a disk error is the partition's, as any of its log's."""
        for partition in list(self._epoch_files)[:EPOCH_FILES_PER_TURN]:
            del self._epoch_files[partition]
            log = partition.log
            if log.closed or log.offline or not log.leader_epochs.dirty:
                continue
            try:
                log.flush_leader_epochs()
            except StorageError as e:
                logger.error("[%s-%d] writing the leader-epoch file failed: %s", partition.topic,
                             partition.partition, e)
                partition.storage_error(e)
            if not log.offline and log.leader_epochs.dirty:
                self._epoch_files[partition] = None

    def _isr_check_interval_s(self) -> float:
        lags = [p.replica.role.lag_time_max_ms for p in self._leaders if p.replica is not None]
        return min([ISR_CHECK_MAX_INTERVAL_S, *(lag / 4000 for lag in lags)])

    def next_deadline(self) -> float | None:
        """When :meth:`tick` must run next (``time.monotonic()`` seconds), None for never."""
        deadlines = []
        if self._epoch_files and any(p.log.write_failure is None for p in self._epoch_files):
            return 0.0  # leader-epoch files to write: at once, a few per turn
        if self._leaders:
            deadlines.append(self._next_isr_check)
        if self._leaders or self._followers:
            deadlines.append(self._next_high_watermark_checkpoint)
        for partition in self._followers:
            follower = partition.replica
            if not isinstance(follower, FollowerReplica) or follower.fetcher is None:
                continue
            if not follower.in_flight and not partition.flushes and follower.partition.log.writable:
                deadlines.append(follower.retry_at)
            deadline = follower.fetcher.next_deadline()
            if deadline is not None:
                deadlines.append(deadline)
        return min(deadlines) if deadlines else None

    def close(self) -> None:
        """The worker stops: every fetcher closes."""
        for partition in list(self._followers):
            self.forget(partition)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _not_in_a_flush(log: Any) -> bool:
    """Whether the log holds appended records that no flush has begun to write."""
    return log.pending_records > sum(job.records for job in log.flushes_in_flight)


def _bytes_after(log: Any, offset: int) -> int:
    """Bytes of the flushed batches from the one holding ``offset`` on (0 at or past the flushed
    end, -1 when the log cannot tell: offline, a damaged range)."""
    if offset >= log.high_watermark:
        return 0
    try:
        found = log.read(max(offset, log.log_start_offset), 1)
    except HPBrokerError:
        return -1
    total, counting = 0, False
    for segment in log.segments:
        if segment.path == found.path:
            counting = True
            total += segment.size_in_bytes - found.position
        elif counting:
            total += segment.size_in_bytes
    return total
