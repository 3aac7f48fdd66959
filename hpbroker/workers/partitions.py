"""The partitions a worker owns: each one's log, its group commits in flight, and the requests
waiting on it.

A :class:`Partition` is one :class:`~hpbroker.io.PartitionLog` opened with
``flush_on_append=False`` plus what waits on its high watermark:

- *flushes in flight*: group commits (:class:`~hpbroker.io.log.FlushJob`) begun on the event loop
  and run by the worker's one :class:`Flusher` (a native writer thread), at most
  :data:`MAX_FLUSHES_IN_FLIGHT` per log, applied in the order they were begun.  A commit without
  fdatasync (``flush_fsync`` off) that has no other in flight before it is written on the loop
  itself, at once: a ``writev`` into the page cache costs less than the two thread hand-offs
  (the price: while the kernel throttles a writer of too many dirty pages, the loop waits too);
- *produce waiters* (``hpbroker.workers.waiters``): acks=1 produce requests, answered once the
  high watermark passes their last offset, and acks=-1 ones, once the *replicated* high watermark
  does (``hpbroker.workers.replication``; an unreplicated partition's is its high watermark, so
  there acks=-1 is acks=1). They are answered in request order (an error decided at once, e.g. a
  corrupt batch, waits behind the earlier requests of the same partition), so a producer that
  pipelines sees its responses in order. An idempotent producer's retry of a request already
  stored (the log says ``duplicate``) appends nothing and waits the same way for the high
  watermark to pass the stored copy, which may still be pending or in a flush in flight, then is
  answered with the stored copy's base offset and ``duplicate=1`` (a version 0 request: the same,
  without the flag); a write failure that drops the stored copy fails it like the original. A
  resend of a request a crash cut after its first whole batches (the log appends only the rest,
  right after them) waits like a new request and is answered from the stored prefix's first
  offset, ``duplicate=0``;
- *fetch waiters*: long polls parked because less than ``min_bytes`` was readable (a consumer
  reads below the replicated high watermark, a follower up to the flushed end), re-tried each
  time a flush or the replicated high watermark moves, and answered with what there is at
  their deadline.
  Fetches of one client (or TCP connection) for one partition are answered in the order they
  came: a later one waits behind an earlier parked one.

A failed write (a full disk, a failed ``fdatasync``) puts the log in its *writes failed* state
(``hpbroker.io.log``): the produce requests whose records were not flushed are answered with the
log's StorageError (error 7, "no space left on device" for a full disk, retriable), and so is
every produce until writes resume; fetches and list-offsets go on serving what was flushed.  The
partition then retries :meth:`PartitionLog.resume_writes` with backoff (RESUME_BACKOFF_MIN_S
doubling up to RESUME_BACKOFF_MAX_S, and at once after retention deleted a segment anywhere in
the worker), which re-reads the log's tail from the disk before taking appends again.

Invariants: a record is acknowledged only after the flush that wrote it was applied (the high
watermark passed it), so with ``flush_fsync`` only fdatasync'd records are acknowledged; every
waiter is answered exactly once (by the flush, its deadline, a write failure, the log going
offline, the topic's deletion or the worker's graceful stop).  Single-threaded: everything here
runs on the worker's event loop; the flusher's thread runs native code only and touches no Python
object.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any

from hpbroker import protocol
from hpbroker.errors import (
    HPBrokerError,
    NotLeaderOrFollowerError,
    RequestTimedOutError,
    StorageError,
    UnknownTopicOrPartitionError,
)
from hpbroker.io import AppendInfo, LogConfig, PartitionLog
from hpbroker.io._writer import WriterThread
from hpbroker.io.files import fsync_dir
from hpbroker.io.log import FlushJob
from hpbroker.workers.backend import PartitionSpec
from hpbroker.workers.replies import Responder
from hpbroker.workers.waiters import DeadlineQueue, FetchWaiter, ProduceWaiter

if TYPE_CHECKING:
    from hpbroker.workers.replication import _Replica
    from hpbroker.workers.stats import WorkerStats

__all__ = [
    "FETCH_MAX_BYTES",
    "MAX_FLUSHES_IN_FLIGHT",
    "DeadlineQueue",
    "FetchWaiter",
    "Flusher",
    "Partition",
    "PartitionSet",
    "ProduceWaiter",
    "partition_directory",
]

logger = logging.getLogger(__name__)

# Group commits in flight per log: one being written, the next one queued behind it, so the
# flusher never idles while the loop keeps appending (bench/test_bench_log.py measures the same).
MAX_FLUSHES_IN_FLIGHT = 2
# A fetch response must fit in one protocol message; its head is far below 4 KiB.
FETCH_MAX_BYTES = protocol.MAX_MESSAGE_BYTES - 4096
# How soon a partition whose writes failed tries to resume them, first and at most (seconds).
RESUME_BACKOFF_MIN_S = 0.25
RESUME_BACKOFF_MAX_S = 5.0
# Suffix a partition directory is renamed to before it is removed, so a crash halfway through a
# delete leaves no half-deleted partition that a re-created topic would open (never a valid
# partition directory name, which ends in ``-<digits>``).
DELETING_SUFFIX = ".deleting"


def partition_directory(data_dir: str, topic: str, partition: int) -> str:
    return os.path.join(data_dir, f"{topic}-{partition}")


class Flusher:
    """The worker's one flusher: a native :class:`~hpbroker.io._writer.WriterThread` running the
    group commits (one ``writev`` and an ``fdatasync`` each, without the GIL) in the order they
    are submitted, off the event loop.  A commit without fdatasync that has none in flight
    before it never comes here: :meth:`Partition.flush_if_due` writes it on the loop.

    When a job is done the thread writes a byte to the loop's wake-up fd (once per turn of the
    loop, however many jobs finish); the loop then collects, with :meth:`take_done`, the
    partitions whose oldest flush is done.  Until :meth:`start` (and after :meth:`shutdown`) no
    job is run by the flusher; whoever completes one runs it (FlushJob's rule).  Start it in the
    process that uses it (after ``fork()``).
    """

    def __init__(self) -> None:
        self._writer: WriterThread | None = None
        self._flushing: set[Partition] = set()  # partitions that had a flush in flight

    def start(self, wake_fd: int) -> None:
        self._writer = WriterThread(wake_fd)

    def submit(self, partition: Partition, job: FlushJob) -> None:
        self._flushing.add(partition)
        if self._writer is not None:
            self._writer.submit(job.io)  # refused once stopping: complete_flush runs it on the loop

    @property
    def has_done(self) -> bool:
        """Whether a job finished since the last :meth:`take_done`."""
        return self._writer is not None and self._writer.notified

    def take_done(self) -> list[Partition]:
        """The partitions whose oldest flush in flight is done (clearing the notification first,
        so a job finishing meanwhile wakes the loop again)."""
        if self._writer is not None:
            self._writer.take_notification()
        done = [p for p in self._flushing if p.flushes and p.flushes[0].done]
        self._flushing = {p for p in self._flushing if p.flushes}
        return done

    def shutdown(self, *, wait: bool) -> None:
        """Stop the thread: ``wait`` runs the jobs queued first, otherwise they are left to their
        logs (which run or cancel them when completed or closed)."""
        if self._writer is not None:
            self._writer.stop(drain=wait)


class Partition:
    """One owned partition: its log, its flushes in flight and the requests waiting on it (see
    the module docstring).  ``dirty`` is the set's set of partitions with records pending and not
    yet handed to a flush, which the loop checks at their flush deadline.

    Its counters (``hpbroker.workers.stats``): ``produced_records`` and ``produced_bytes``
    appended by produce requests, ``duplicate_records`` of the requests found stored already
    (idempotent retries: not appended again), ``fetched_records`` and ``fetched_bytes`` handed out by fetch
    responses (counted by the request's :class:`~hpbroker.workers.stats.TimedResponder`),
    ``flushes_done`` and ``flushed_bytes`` of the group commits applied to the log."""

    def __init__(self, topic: str, partition: int, log: PartitionLog, flusher: Flusher,
                 deadlines: DeadlineQueue, dirty: set[Partition], stats: WorkerStats | None = None,
                 write_failed: set[Partition] | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self.log = log
        self.flushes: deque[FlushJob] = deque()
        self.produces: deque[ProduceWaiter] = deque()
        self.fetches: dict[Hashable, deque[FetchWaiter]] = {}
        self.checkpointed = log.high_watermark  # the high watermark at the last checkpoint
        self.produced_records = self.produced_bytes = self.fetched_records = self.fetched_bytes = 0
        self.duplicate_records = 0
        self.flushes_done = self.flushed_bytes = 0
        self._flusher = flusher
        self._deadlines = deadlines
        self._dirty = dirty
        self._stats = stats
        # The set's partitions whose writes failed; this one is in it while it retries, at resume_at.
        self._write_failed = write_failed if write_failed is not None else set()
        self.resume_at: float | None = None
        self._resume_backoff_s = RESUME_BACKOFF_MIN_S
        # Its role in replication (hpbroker.workers.replication); None: unreplicated, as before
        # replication existed.  ``awaiting_role``: replicated, but no role has come yet.
        self.replica: _Replica | None = None
        self.awaiting_role = False
        log.on_flush = self._flushed
        if stats is not None:
            log.on_sync = stats.synced

    def __repr__(self) -> str:
        return f"Partition({self.log.name})"

    # --- replication (hpbroker.workers.replication) ---------------------------------------------

    @property
    def high_watermark(self) -> int:
        """The offset consumers read below: the log's flushed end, or for a replicated
        partition the replicated high watermark."""
        replica = self.replica
        return self.log.high_watermark if replica is None else replica.high_watermark

    @property
    def leader_epoch(self) -> int:
        """The leader epoch of the partition's role (-1: unreplicated)."""
        replica = self.replica
        return protocol.NO_LEADER_EPOCH if replica is None else replica.leader_epoch

    def check_leader(self, broker_id: int) -> None:
        """NotLeaderOrFollowerError unless the partition takes produce requests and consumer
        fetches here: unreplicated, or led by this broker."""
        replica = self.replica
        if replica is None:
            if self.awaiting_role:
                raise NotLeaderOrFollowerError(f"{self.log.name} is replicated and broker {broker_id} has "
                                               f"not learned its role yet; retry after a metadata refresh")
            return
        if not replica.leading:
            raise replica.not_leader(broker_id)

    def high_watermark_moved(self) -> None:
        """The replicated high watermark may have moved (or the ISR changed): answer what that
        made answerable."""
        self._settle_produces()
        self._wake_fetches()

    def leave_leadership(self, error: HPBrokerError) -> None:
        """The partition is no longer led here: its acks=-1 produce requests still waiting and
        its parked fetches fail with ``error``; acks=1 requests still get their local flush."""
        for waiter in self.produces:
            if waiter.acks == protocol.ACKS_ALL and waiter.error is None:
                waiter.error = error
        self._settle_produces()
        fetches, self.fetches = self.fetches, {}
        for queue in fetches.values():
            for waiter in queue:
                if not waiter.finished:
                    waiter.fail(error)

    def flush_now(self) -> None:
        """Begin a group commit of the pending records now, whatever the flush policy says (a
        follower flushes each fetch response at once)."""
        self._begin_flush()

    # --- produce -------------------------------------------------------------------------------

    def produce(self, payload: memoryview, acks: int, correlation_id: int, responder: Responder,
                deadline: float, timeout_ms: int, *, immutable: bool = False, version: int = 0) -> None:
        """Append ``payload`` (whole, or nothing of it) and, for acks=1, answer once it is flushed
        (a duplicate: once its stored copy is), in ``version`` of ProduceResponse.
        ``immutable``: nobody changes the payload's bytes, so the log need not copy them.
        acks=-1: answered once the replicated high watermark passes the records (an unreplicated
        partition's high watermark is its flushed end: acks=1); NotEnoughReplicasError before
        anything is appended when the ISR is too small."""
        replica = self.replica
        try:
            if replica is None:
                info = self.log.append(payload, immutable=immutable,
                                       leader_epoch=max(0, self.log.leader_epochs.latest_epoch))
            else:
                acks = replica.check_produce(acks)
                info = self.log.append(payload, immutable=immutable, leader_epoch=replica.leader_epoch)
        except HPBrokerError as e:
            if isinstance(e, StorageError):
                self.storage_error(e)
            if acks == 0:
                logger.debug("[%s] acks=0 produce %d refused: %s", self.log.name, correlation_id, e)
                return
            self._answer_in_order(ProduceWaiter(correlation_id, responder, error=e, version=version))
            return
        if info.duplicate:
            self._duplicate(info, acks, correlation_id, responder, deadline, timeout_ms, version)
            return
        self.produced_records += info.record_count - info.duplicate_records
        self.produced_bytes += payload.nbytes
        self.duplicate_records += info.duplicate_records  # a resend's stored prefix, not appended again
        if acks != 0:
            waiter = ProduceWaiter(correlation_id, responder, base_offset=info.first_offset,
                                   last_offset=info.last_offset, timeout_ms=timeout_ms, version=version,
                                   acks=acks)
            self.produces.append(waiter)
            self._deadlines.push(deadline, self, waiter)
        self.flush_if_due()
        if self.log.flush_deadline_ms is not None:
            self._dirty.add(self)

    def _duplicate(self, info: AppendInfo, acks: int, correlation_id: int, responder: Responder,
                   deadline: float, timeout_ms: int, version: int) -> None:
        """A request whose records are stored already: answer, in order, once the stored copy
        is flushed (at once if it is and nothing waits before it)."""
        self.duplicate_records += info.record_count
        logger.debug("[%s] produce %d is a duplicate of offsets %d..%d", self.log.name, correlation_id,
                     info.first_offset, info.last_offset)
        if acks == 0:
            return
        waiter = ProduceWaiter(correlation_id, responder, base_offset=info.first_offset,
                               last_offset=info.last_offset, timeout_ms=timeout_ms, version=version,
                               duplicate=True, acks=acks)
        self.produces.append(waiter)
        self._deadlines.push(deadline, self, waiter)
        self._settle_produces()

    def _answer_in_order(self, waiter: ProduceWaiter) -> None:
        if self.produces:
            self.produces.append(waiter)
        else:
            waiter.answer(self.log.log_start_offset)

    def _settle_produces(self) -> None:
        """Answer, front first, the produce requests whose records are flushed (acks=-1: below
        the replicated high watermark) or whose error is decided."""
        produces = self.produces
        if not produces:
            return
        flushed_end, log_start_offset = self.log.high_watermark, self.log.log_start_offset
        replicated = self.high_watermark
        while produces:
            waiter = produces[0]
            if waiter.error is None and not waiter.finished:
                if waiter.acks == protocol.ACKS_ALL:
                    if waiter.last_offset >= replicated:
                        break
                    if self.replica is not None:
                        waiter.error = self.replica.settle_error()
                elif waiter.last_offset >= flushed_end:
                    break
            produces.popleft()
            if not waiter.finished:
                waiter.answer(log_start_offset)

    # --- fetch ---------------------------------------------------------------------------------

    def fetch(self, waiter: FetchWaiter, deadline: float) -> None:
        """Answer now if enough is readable, else park until a flush or the deadline; behind an
        earlier parked fetch with the same order key, wait for that one first."""
        queue = self.fetches.get(waiter.order_key)
        if queue is None:
            if waiter.try_answer(self):
                return
            self.fetches[waiter.order_key] = deque((waiter,))
        else:
            queue.append(waiter)
        self._deadlines.push(deadline, self, waiter)

    def _drain_fetches(self, key: Hashable) -> None:
        """Answer the fetches of ``key`` front first, as far as they can be answered now."""
        queue = self.fetches.get(key)
        while queue:
            waiter = queue[0]
            if not waiter.finished and not waiter.try_answer(self):
                return
            queue.popleft()
        self.fetches.pop(key, None)

    def _wake_fetches(self) -> None:
        for key in list(self.fetches):
            self._drain_fetches(key)

    # --- deadlines, flushing ----------------------------------------------------------------

    def _flushed(self, job: FlushJob) -> None:
        """The log applied a group commit (``PartitionLog.on_flush``)."""
        self.flushes_done += 1
        self.flushed_bytes += job.written
        if self._stats is not None:
            self._stats.flushed(job)

    def expire(self, waiter: ProduceWaiter | FetchWaiter) -> None:
        """``waiter``'s deadline has passed."""
        if isinstance(waiter, FetchWaiter):
            waiter.expired = True
            self._drain_fetches(waiter.order_key)
            return
        if waiter.acks == protocol.ACKS_ALL and self.replica is not None:
            what, mark = "replicated to every in-sync replica", self.high_watermark
        else:
            what, mark = "flushed", self.log.high_watermark
        waiter.error = RequestTimedOutError(
            f"[{self.log.name}] offsets {waiter.base_offset}..{waiter.last_offset} were not {what} "
            f"within timeout_ms {waiter.timeout_ms} (high watermark {mark}); they may still be appended"
        )
        self._settle_produces()

    def flush_if_due(self, now_ms: int | None = None) -> None:
        """Begin a group commit of the pending records if one is due and fewer than
        MAX_FLUSHES_IN_FLIGHT are running."""
        if len(self.flushes) >= MAX_FLUSHES_IN_FLIGHT or not self.log.flush_due(now_ms):
            return
        self._begin_flush()

    def _begin_flush(self) -> None:
        if len(self.flushes) >= MAX_FLUSHES_IN_FLIGHT:
            return
        try:
            job = self.log.begin_flush()
        except StorageError as e:
            self.storage_error(e)
            return
        if job is not None:
            self.flushes.append(job)
            if not job.fsync and len(self.flushes) == 1:
                # Into the page cache, nothing in flight before it: written here at once, which
                # costs less than the hand-off to the flusher's thread and back.
                job.run()
                self.complete_flushes()
                return
            self._flusher.submit(self, job)

    @property
    def flush_deadline_ms(self) -> int | None:
        """When the loop must look at this partition again for its pending records (ms on the
        log's monotonic clock), None when only a finished flush can make it flush (or nothing is
        pending)."""
        if len(self.flushes) >= MAX_FLUSHES_IN_FLIGHT:
            return None
        return self.log.flush_deadline_ms

    def complete_flushes(self) -> None:
        """Apply the finished flushes, oldest first; answer what they made answerable; begin the
        next flush if one is due."""
        applied = False
        while self.flushes and self.flushes[0].done:
            job = self.flushes.popleft()
            try:
                self.log.complete_flush(job)
            except StorageError as e:
                self.storage_error(e)
                return
            applied = True
            if not self.log.writable:  # the flush stands, but writing its index failed
                self.writes_failed()
                return
        if applied:
            if self.replica is not None:
                self.replica.flushed()
            self._settle_produces()
            self._wake_fetches()
        self.flush_if_due()

    def reconfigure(self, config: LogConfig) -> None:
        """New settings for the open log (``PartitionLog.reconfigure``); a flush policy that got
        stricter may make the records already pending due now."""
        self.log.reconfigure(config)
        if self.log.flush_deadline_ms is not None:
            self._dirty.add(self)
            self.flush_if_due()

    def storage_error(self, error: StorageError) -> None:
        """A log call raised ``error``: take the partition offline, or into the writes failed
        state, as the log now is (nothing when the log still takes writes)."""
        if self.log.offline:
            self.go_offline(error)
        elif self.log.write_failure is not None:
            self.writes_failed()

    def writes_failed(self) -> None:
        """The log refuses writes (``PartitionLog.write_failure``) and dropped what it had not
        flushed: answer the produce requests it acknowledged, fail the others with its error,
        wake the fetches a last flush made answerable, and schedule the first resume."""
        error = self.log.write_failure
        assert error is not None
        if self in self._write_failed and not (self.flushes or self.produces):
            return  # a produce refused while it retries: nothing waits on the log
        self.flushes.clear()
        self._dirty.discard(self)
        self._settle_produces()
        for waiter in self.produces:
            if waiter.error is None:
                waiter.error = error
        self._settle_produces()
        self._wake_fetches()
        if self not in self._write_failed:
            self._write_failed.add(self)
            self._resume_backoff_s = RESUME_BACKOFF_MIN_S
            self.resume_at = time.monotonic() + self._resume_backoff_s

    def try_resume(self, now: float) -> None:
        """Ask the log to resume writes (``PartitionLog.resume_writes``); on failure, try again
        after twice the wait, up to RESUME_BACKOFF_MAX_S."""
        log = self.log
        if log.closed or log.offline:
            self._write_failed.discard(self)
            return
        try:
            resumed = log.resume_writes()
        except Exception:  # a bug in the re-read must not end the worker: try again later
            logger.exception("[%s] resuming writes failed", log.name)
            resumed = False
        if resumed:
            self._write_failed.discard(self)
            self.resume_at = None
            logger.info("[%s] takes writes again", log.name)
            return
        self._resume_backoff_s = min(2 * self._resume_backoff_s, RESUME_BACKOFF_MAX_S)
        self.resume_at = now + self._resume_backoff_s

    def go_offline(self, error: HPBrokerError) -> None:
        """The log is offline after a disk error: fail everything waiting on it."""
        self.flushes.clear()
        self._dirty.discard(self)
        self._write_failed.discard(self)
        self.fail_waiters(StorageError(f"[{self.log.name}] the partition is offline: {error.message}"))

    def fail_waiters(self, error: HPBrokerError) -> None:
        while self.produces:
            waiter = self.produces.popleft()
            if not waiter.finished:
                waiter.error = error
                waiter.answer(-1)
        fetches, self.fetches = self.fetches, {}
        for queue in fetches.values():
            for waiter in queue:
                if not waiter.finished:
                    waiter.fail(error)

    # --- the end -----------------------------------------------------------------------------

    def flush_and_answer(self) -> None:
        """For a graceful stop: flush everything now, answer the produce requests it acknowledges
        and every parked fetch with what there is.  An acks=-1 request of a replicated partition
        whose records are flushed here but not yet below the replicated high watermark fails
        with NotLeaderOrFollowerError (retriable: the client refreshes its metadata and resends
        to the next leader, where an idempotent producer's resend is stored once); one whose
        records could not be flushed, with StorageError."""
        if self.log.writable:
            try:
                self.log.flush()
            except StorageError as e:
                self.storage_error(e)
            else:
                if self.replica is not None and self.replica.leading:
                    self.replica.flushed()  # a leader alone in its ISR: the high watermark moves
        self.flushes.clear()
        self._dirty.discard(self)
        self._settle_produces()
        if self.replica is not None:
            stopping = NotLeaderOrFollowerError(
                f"[{self.log.name}] the broker is stopping; the records may or may not be committed: "
                f"retry at the partition's leader after a metadata refresh")
            flushed_end = self.log.high_watermark
            for waiter in self.produces:
                if waiter.acks == protocol.ACKS_ALL and waiter.error is None \
                        and waiter.last_offset < flushed_end:
                    waiter.error = stopping
        self._settle_produces()
        for queue in self.fetches.values():
            for waiter in queue:
                waiter.expired = True
        self._wake_fetches()
        self.fail_waiters(StorageError(f"[{self.log.name}] the worker stopped before the records were "
                                       f"flushed"))

    def close(self) -> None:
        """Close the log (a clean shutdown unless it is offline or its writes failed).  Never
        raises."""
        self.flushes.clear()
        self._dirty.discard(self)
        self._write_failed.discard(self)
        try:
            self.log.close()
        except Exception:
            logger.exception("[%s] closing the log failed", self.log.name)


class PartitionSet:
    """Every partition the worker owns, by ``(topic, partition)``, and the machinery they share:
    the flusher, the deadlines of waiting requests, the partitions with records pending, the
    worker's measurements (``stats``, fed each flush)."""

    def __init__(self, data_dir: str, default_config: LogConfig, flusher: Flusher,
                 stats: WorkerStats | None = None,
                 producer_id_issued: Callable[[int], bool] | None = None) -> None:
        """``producer_id_issued``: given to every log (``PartitionLog``), tells the producer ids
        the broker issued (``hpbroker.io.producer_state.IssuedProducerIds``); None: all."""
        self._data_dir = data_dir
        self._producer_id_issued = producer_id_issued
        self._default_config = default_config
        self._flusher = flusher
        self._stats = stats
        self._by_key: dict[tuple[str, int], Partition] = {}
        self._dirty: set[Partition] = set()
        self._write_failed: set[Partition] = set()
        # partitions this worker owns but could not open: requests for them get this error
        self._unavailable: dict[tuple[str, int], HPBrokerError] = {}
        self.deadlines = DeadlineQueue()

    def __iter__(self) -> Iterator[Partition]:
        return iter(list(self._by_key.values()))

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, topic: str, partition: int) -> Partition:
        found = self._by_key.get((topic, partition))
        if found is None:
            why = self._unavailable.get((topic, partition))
            if why is not None:
                raise type(why)(why.message)
            raise UnknownTopicOrPartitionError(f"partition {partition} of topic {topic!r} is not served by "
                                               f"this worker")
        return found

    def open(self, spec: PartitionSpec) -> Partition:
        """Open (creating if needed, recovering) the partition of ``spec``; one already open stays
        as it is.  Raises StorageError or InvalidConfigError."""
        key = (spec.topic, spec.partition)
        if key in self._by_key:
            return self._by_key[key]
        config = self._default_config.replace(**spec.config)
        name = f"{spec.topic}-{spec.partition}"
        log = PartitionLog(partition_directory(self._data_dir, spec.topic, spec.partition), config,
                           flush_on_append=False, name=name, producer_id_issued=self._producer_id_issued)
        partition = Partition(spec.topic, spec.partition, log, self._flusher, self.deadlines, self._dirty,
                              self._stats, self._write_failed)
        partition.awaiting_role = spec.replicated
        self._by_key[key] = partition
        self._unavailable.pop(key, None)
        if log.write_failure is not None:  # opened on a full disk: reads now, writes once it can
            partition.writes_failed()
        return partition

    def mark_unavailable(self, spec: PartitionSpec, error: HPBrokerError) -> None:
        """The worker owns ``spec``'s partition but could not open it: answer it with ``error``
        (until an ``open`` succeeds or its topic is deleted)."""
        self._unavailable[(spec.topic, spec.partition)] = error

    def configure(self, topic: str, config: dict[str, Any]) -> list[str]:
        """Apply a topic's new overrides of the default settings to its open partitions (the
        ones opened later get them from their spec); InvalidConfigError when they are not valid."""
        log_config = self._default_config.replace(**config)
        for partition in self:
            if partition.topic == topic:
                partition.reconfigure(log_config)
        return []

    def delete_topic(self, topic: str) -> list[str]:
        """Close the topic's partitions and delete their directories; the errors met, if any."""
        errors = []
        for key in [key for key in self._unavailable if key[0] == topic]:
            del self._unavailable[key]
            directory = partition_directory(self._data_dir, *key)
            try:
                if os.path.isdir(directory):
                    _remove_directory(directory)
            except OSError as e:
                errors.append(f"{key[0]}-{key[1]}: {e}")
        for key in [key for key in self._by_key if key[0] == topic]:
            partition = self._by_key.pop(key)
            partition.fail_waiters(UnknownTopicOrPartitionError(f"topic {topic!r} was deleted"))
            partition.close()
            try:
                _remove_directory(partition.log.directory)
            except OSError as e:
                logger.error("[%s] deleting %s failed: %s", partition.log.name, partition.log.directory, e)
                errors.append(f"{partition.log.name}: {e}")
            else:
                logger.info("[%s] deleted with its topic", partition.log.name)
        return errors

    def remove(self, topic: str, partition: int) -> list[str]:
        """Close one partition and delete its directory: a replica moved to other brokers; the
        errors met, if any."""
        key = (topic, partition)
        directory = partition_directory(self._data_dir, topic, partition)
        self._unavailable.pop(key, None)
        opened = self._by_key.pop(key, None)
        if opened is not None:
            opened.fail_waiters(UnknownTopicOrPartitionError(f"{topic}-{partition} moved to other brokers"))
            opened.close()
            directory = opened.log.directory
        try:
            if os.path.isdir(directory):
                _remove_directory(directory)
        except OSError as e:
            logger.error("[%s-%d] deleting %s failed: %s", topic, partition, directory, e)
            return [f"{topic}-{partition}: {e}"]
        logger.info("[%s-%d] replica removed: it moved to other brokers", topic, partition)
        return []

    def complete_done_flushes(self) -> None:
        for partition in self._flusher.take_done():
            if self._by_key.get((partition.topic, partition.partition)) is partition:
                partition.complete_flushes()

    def flush_due(self, now_ms: int | None = None) -> None:
        """Begin the group commits that are due on partitions with records pending."""
        for partition in list(self._dirty):
            partition.flush_if_due(now_ms)
            if partition.log.flush_deadline_ms is None:
                self._dirty.discard(partition)

    def next_flush_deadline_ms(self) -> int | None:
        deadlines = [d for d in (p.flush_deadline_ms for p in self._dirty) if d is not None]
        return min(deadlines) if deadlines else None

    @property
    def writes_failed(self) -> int:
        """How many partitions refuse writes now (their log's writes failed)."""
        return len(self._write_failed)

    def resume_writes(self, now: float) -> None:
        """Let the partitions whose writes failed try to resume, those whose time has come
        (``time.monotonic()`` seconds)."""
        for partition in list(self._write_failed):
            if partition.resume_at is not None and partition.resume_at <= now:
                partition.try_resume(now)

    def next_resume_at(self) -> float | None:
        """When the next partition whose writes failed tries to resume (monotonic seconds)."""
        times = [p.resume_at for p in self._write_failed if p.resume_at is not None]
        return min(times) if times else None

    def maintain(self) -> None:
        """Retention, and a recovery checkpoint where the high watermark moved since the last one
        (so a restart after a crash re-checks only what came after it).  Only logs that fdatasync
        every flush are checkpointed here: for them the checkpoint's fsync finds little to write,
        whereas for the others it could block the loop writing back what the page cache holds.
        Retention also runs on logs whose writes failed (it is what frees a full disk); when it
        deleted a segment, every partition whose writes failed tries to resume at once."""
        deleted = 0
        for partition in self:
            log = partition.log
            if log.offline:
                continue
            try:
                deleted += log.delete_old_segments()
                if log.writable and log.config.flush_fsync and log.high_watermark != partition.checkpointed:
                    partition.checkpointed = log.high_watermark
                    log.checkpoint()
            except StorageError as e:
                partition.storage_error(e)
            except HPBrokerError as e:
                logger.error("[%s] retention or checkpoint failed: %s", log.name, e)
        if deleted:
            now = time.monotonic()
            for partition in self._write_failed:
                partition.resume_at = now

    def heartbeat_entries(self) -> list[dict[str, Any]]:
        """Each partition's offsets (``hpbroker.workers.heartbeat``); a replicated one's role too,
        its ``high_watermark`` the replicated one."""
        entries = []
        for p in self:
            entry = {"topic": p.topic, "partition": p.partition, "log_start_offset": p.log.log_start_offset,
                     "high_watermark": p.high_watermark}
            if p.replica is not None:
                entry.update(p.replica.heartbeat(), log_end_offset=p.log.high_watermark)
            elif p.awaiting_role:
                entry["role"] = None
            entries.append(entry)
        return entries

    def close_all(self) -> None:
        """Graceful stop: flush and answer everything, let each replicated partition's role wind
        up (its high-watermark checkpoint), then close every log cleanly."""
        for partition in self:
            partition.flush_and_answer()
            if partition.replica is not None:
                partition.replica.close()
        for key in list(self._by_key):
            self._by_key.pop(key).close()


def _remove_directory(directory: str) -> None:
    """Delete a partition directory so that a crash at any point leaves either all of it or
    nothing under its name: rename it aside (durably), then remove it."""
    doomed = directory.rstrip(os.sep) + DELETING_SUFFIX
    if os.path.exists(doomed):
        shutil.rmtree(doomed)
    os.rename(directory, doomed)
    fsync_dir(os.path.dirname(os.path.abspath(directory)))
    shutil.rmtree(doomed)
