"""What waits on a partition: produce requests until their records are flushed (or replicated),
fetches until enough is readable, and the deadlines of both.

Used by :class:`~hpbroker.workers.partitions.Partition`, which decides when each waiter is
answered (its module docstring says in which order and on what); a waiter answers exactly once
(``finished`` then set), through its request's responder (``hpbroker.workers.replies``).
Single-threaded: the worker's event loop.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from hpbroker import protocol
from hpbroker.errors import DamagedRangeError, HPBrokerError, OffsetOutOfRangeError
from hpbroker.io import PartitionLog
from hpbroker.io.logfile import FileSlice
from hpbroker.workers.replies import Responder, error_reply, fetch_error_reply, fetch_reply, produce_reply

if TYPE_CHECKING:
    from hpbroker.workers.partitions import Partition

__all__ = ["DeadlineQueue", "FetchWaiter", "ProduceWaiter"]


class DeadlineQueue:
    """Deadlines of waiting requests (``time.monotonic()`` seconds), soonest first.  Entries of
    waiters answered meanwhile are skipped when they come up (lazy deletion), and swept out
    whenever the heap has doubled since the last sweep, so a stream of produces acknowledged
    long before their deadline keeps it small."""

    _MIN_SWEEP = 4096

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Partition, Any]] = []
        self._sequence = itertools.count()
        self._sweep_at = self._MIN_SWEEP

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, deadline: float, partition: Partition, waiter: ProduceWaiter | FetchWaiter) -> None:
        heapq.heappush(self._heap, (deadline, next(self._sequence), partition, waiter))
        if len(self._heap) > self._sweep_at:
            self._heap = [entry for entry in self._heap if not entry[3].finished]
            heapq.heapify(self._heap)
            self._sweep_at = max(self._MIN_SWEEP, 2 * len(self._heap))

    def next_deadline(self) -> float | None:
        heap = self._heap
        while heap and heap[0][3].finished:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def expire(self, now: float) -> None:
        """Tell each partition about its waiters whose deadline has passed."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            _deadline, _sequence, partition, waiter = heapq.heappop(heap)
            if not waiter.finished:
                partition.expire(waiter)


class ProduceWaiter:
    """An acks=1 or acks=-1 produce request: its records ``base_offset..last_offset`` are pending
    (acks=1: until flushed; acks=-1: until the replicated high watermark passes them), or its
    ``error`` is decided and waits only for the requests before it."""

    __slots__ = ("acks", "base_offset", "correlation_id", "duplicate", "error", "finished", "last_offset",
                 "responder", "timeout_ms", "version")

    def __init__(self, correlation_id: int, responder: Responder, *, base_offset: int = -1,
                 last_offset: int = -1, timeout_ms: int = 0, error: HPBrokerError | None = None,
                 version: int = 0, duplicate: bool = False, acks: int = 1) -> None:
        self.correlation_id = correlation_id
        self.acks = acks
        self.responder = responder
        self.base_offset = base_offset
        self.last_offset = last_offset
        self.timeout_ms = timeout_ms
        self.error = error
        self.version = version  # the request's api_version, which the response answers in
        self.duplicate = duplicate  # the records were stored by an earlier copy of the request
        self.finished = False

    def answer(self, log_start_offset: int) -> None:
        self.finished = True
        if self.error is None:
            self.responder(produce_reply(self.correlation_id, self.base_offset, log_start_offset,
                                         version=self.version, duplicate=self.duplicate))
        else:
            self.responder(error_reply(protocol.ApiKey.PRODUCE, self.correlation_id, self.error,
                                       version=self.version, log_start_offset=log_start_offset))


class FetchWaiter:
    """A fetch: read ``max_bytes`` from ``offset``; with less than ``min_bytes`` readable, wait
    until more is flushed or the deadline (``expired`` once it has passed, or from the start when
    the request may not wait).  A consumer's fetch reads below the partition's high watermark
    (a replicated partition's leader: the replicated one); a follower's (``replica``) up to the
    leader's flushed end."""

    __slots__ = ("correlation_id", "expired", "finished", "max_bytes", "min_bytes", "offset", "order_key",
                 "replica", "responder", "version")

    def __init__(self, correlation_id: int, responder: Responder, order_key: Hashable, offset: int,
                 max_bytes: int, min_bytes: int, *, expired: bool, version: int = 0,
                 replica: bool = False) -> None:
        self.version = version  # the request's api_version, which the response answers in
        self.replica = replica
        self.correlation_id = correlation_id
        self.responder = responder
        self.order_key = order_key
        self.offset = offset
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        self.expired = expired
        self.finished = False

    def try_answer(self, partition: Partition) -> bool:
        """Answer if enough is readable (or the wait is over); False if it must wait on."""
        log = partition.log
        high_watermark = partition.high_watermark
        try:
            file_slice = log.read(self.offset, self.max_bytes)
            if not self.replica and file_slice.next_offset > high_watermark:
                file_slice = _below(log, file_slice, high_watermark, self.offset)
        except (OffsetOutOfRangeError, DamagedRangeError) as e:
            # a follower asking past the leader's end learns the leader's flushed end, to truncate to
            end = log.high_watermark if self.replica else high_watermark
            reply = fetch_error_reply(self.correlation_id, e, end, log.log_start_offset, version=self.version)
        except HPBrokerError as e:  # StorageError (offline), CorruptRecordError (damage met)
            reply = fetch_error_reply(self.correlation_id, e, version=self.version)
        else:
            if file_slice.length < self.min_bytes and not self.expired:
                return False
            reply = fetch_reply(self.correlation_id, high_watermark, log.log_start_offset, file_slice,
                                version=self.version, leader_epoch=partition.leader_epoch)
        self.finished = True
        self.responder(reply)
        return True

    def fail(self, error: HPBrokerError) -> None:
        self.finished = True
        self.responder(fetch_error_reply(self.correlation_id, error, version=self.version))


def _below(log: PartitionLog, file_slice: FileSlice, end: int, offset: int) -> FileSlice:
    """``file_slice`` cut to its whole batches below ``end`` (a replicated high watermark: the
    batch holding it and those after are left out); empty (at ``offset``) when none is."""
    if file_slice.first_offset < end:
        boundary = log.read(end, 1)  # the batch holding end: in the slice's segment (the slice passes end)
        if boundary.fd == file_slice.fd and boundary.position > file_slice.position:
            return FileSlice(file_slice.fd, file_slice.position, boundary.position - file_slice.position,
                             file_slice.first_offset, file_slice.path, boundary.first_offset)
    return FileSlice(file_slice.fd, file_slice.position, 0, offset, file_slice.path, offset)
