"""The idempotent producer's bookkeeping: which of a partition's requests may go now, in what
order, and when their outcomes may be told.  Pure logic, no I/O: the producer's I/O thread
(``hpbroker.client.producer``) drives it, and owns every object here.

The rules (Kafka's, KIP-98), for one partition and one producer identity:

- **Sequences are assigned once.**  The accumulator numbers a partition's records when it drains
  them (``Batch.base_sequence``) and the request's bytes are built then; a retry resends those
  bytes, so the broker sees the same (producer id, epoch, sequence range) and answers a copy it
  already stored with its offsets (``duplicate``) instead of appending it again.
- **One request at a time until the partition knows the identity.**  A leader with no state
  for a producer id accepts any first sequence (it must: the state may have expired, or gone
  with retention).  So until a request of the current identity is acknowledged on a partition,
  that partition has one request in flight: were a first request lost and a second stored, the
  second would be accepted behind a gap and the first's resend refused (error 20).  Once one is
  acknowledged the leader checks every sequence against the last it stored.
- **At most 5 requests unsettled.**  The partition leader remembers each producer's newest 5
  *runs* (docs/PROTOCOL.md): a run covers batches stored one after another, at consecutive
  offsets with consecutive sequences, and one request always lies inside one run (its batches
  are appended together).  A partition has at most ``max_in_flight``
  (<= :data:`MAX_UNSETTLED_REQUESTS`) requests unsettled (in flight, acknowledged but not yet
  told, or queued for a retry), so every request a retry resends lies inside a run the leader
  still remembers, however many batches it carries.  A request carries every batch that is due,
  up to ``max_request_bytes``, as without idempotence: one request per partition per drain.
- **Recovery goes one request at a time, in order.**  Once a request of the partition failed
  with a retriable error (or its connection was lost, or it timed out), the requests behind it
  fail too (their sequences no longer follow what the broker stored: error 20 while the failed
  one is not the first unsettled request is retriable for that reason).  Nothing new is sent
  then: the unsettled requests are resent in sequence order, each only once nothing else of the
  partition is in flight, until none of them has failed; then pipelining resumes.
- **Outcomes are told in order.**  A request acknowledged while an earlier one of its partition
  is still unsettled waits (``ACKED``) until every earlier one is settled, so later records are
  never acknowledged before earlier ones fail.  Failures are told at once.
- **A fresh id may be unknown for a moment.**  Error 22 (the leader does not know the id was
  issued) is retried, like a retriable error, while the identity is younger than
  :data:`UNKNOWN_PRODUCER_ID_RETRY_S`: another broker's new id block may not have reached
  this leader yet.  Later it is final.
- **A new identity after a break.**  A request that fails for good (errors 20 as the first
  unsettled request, 21, 22 (but while fresh), any other error that is not retriable, or the delivery timeout)
  leaves a hole in the identity's sequences on that partition: the producer takes a new
  identity (:class:`ProducerIdentity`), and a partition drains batches of the new identity only
  once no request of the old one is left in its window.

A request handled here is a ``PartitionRequest`` (``hpbroker.client.produce_request``); this
module reads and sets its ``state``, ``retries``, ``due_s``, ``deadline_s`` and ``generation``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from hpbroker.client.backoff import backoff_ms

__all__ = ["ACKED", "IN_FLIGHT", "MAX_UNSETTLED_REQUESTS", "PIPELINE_AFTER_IDLE_S", "QUEUED",
           "UNKNOWN_PRODUCER_ID_RETRY_S", "PartitionWindow", "ProducerIdentity"]

# The partition leader remembers this many runs per producer (Kafka keeps 5 batches); each request
# lies inside one run, so a partition's unsettled requests never exceed it (max_in_flight <= it)
# and a retry always finds its first copy.
MAX_UNSETTLED_REQUESTS = 5

# How long after the producer took an identity a partition leader's error 22 (producer id
# unknown) is retried rather than final: in a cluster a broker learns of an id block another
# broker took through a ZooKeeper watch, which may lag behind the id it handed out.
UNKNOWN_PRODUCER_ID_RETRY_S = 10.0
# A partition with nothing unsettled for this long sends its next request alone again, until it
# is acknowledged: the leader may have forgotten the producer meanwhile (producer_id_expiration_ms,
# or retention deleting all its records) and then accepts any first sequence, so pipelined
# requests after a lost first one would be stored with a gap.
PIPELINE_AFTER_IDLE_S = 10.0

QUEUED = 0  # built, to be sent (first time, or again after a retriable failure) at due_s
IN_FLIGHT = 1  # handed to a connection, no answer yet
ACKED = 2  # acknowledged, its outcome told once every earlier request is settled


class PartitionWindow:
    """One partition's requests not yet settled, in sequence order (module docstring).

    ``acknowledged_generation``: the newest identity generation a request of this partition was
    acknowledged under (0: none); requests of a newer generation go one at a time.  The owner
    keeps it when it drops an empty window and gives it back to the partition's next one.

    Invariants: ``requests[0]`` is never ``ACKED`` after a call returns (an acknowledged head is
    handed back to be settled at once); the requests are all of one generation (the owner adds
    a newer generation's only once :meth:`blocks_drain` says the older ones are settled); there
    are never more than the owner's ``max_in_flight`` of them (it adds one only once
    :meth:`blocks_drain` says there is room), nor ever more than :data:`MAX_UNSETTLED_REQUESTS`
    (:meth:`add` refuses one more)."""

    __slots__ = ("acknowledged_generation", "requests")

    def __init__(self, acknowledged_generation: int = 0) -> None:
        self.requests: list[Any] = []
        self.acknowledged_generation = acknowledged_generation

    def __repr__(self) -> str:
        states = "".join("QFA"[r.state] for r in self.requests)
        return (f"PartitionWindow({states}, recovering={self.recovering}, "
                f"acknowledged_generation={self.acknowledged_generation})")

    def __bool__(self) -> bool:
        return bool(self.requests)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self.requests))

    @property
    def recovering(self) -> bool:
        """A request not yet acknowledged has failed at least once: resend one at a time."""
        return any(r.retries and r.state != ACKED for r in self.requests)

    def add(self, request: Any) -> None:
        """A request just built from drained batches: its sequences follow every other's here.
        RuntimeError if the window already holds :data:`MAX_UNSETTLED_REQUESTS` (a retry of
        the oldest could then miss the leader's remembered runs)."""
        if len(self.requests) >= MAX_UNSETTLED_REQUESTS:
            raise RuntimeError(f"{self!r} holds {len(self.requests)} unsettled requests, the most the "
                               f"partition leader remembers ({MAX_UNSETTLED_REQUESTS}): no more may be added")
        request.state = QUEUED
        self.requests.append(request)

    def is_first(self, request: Any) -> bool:
        """Every earlier request of the partition is settled (so the broker's last stored
        sequence is the one before this request's, if this identity's requests all went well)."""
        return bool(self.requests) and self.requests[0] is request

    def in_flight_limit(self, max_in_flight: int) -> int:
        """How many requests may be in flight now: ``max_in_flight`` once a request of the
        requests' identity has been acknowledged here, 1 until then (module docstring)."""
        if self.requests and self.requests[0].generation != self.acknowledged_generation:
            return 1
        return max_in_flight

    def blocks_drain(self, generation: int, max_in_flight: int) -> bool:
        """Whether the partition must take no new batches now: a request of an older identity is
        unsettled, it is recovering, a request waits to be sent (batches due meanwhile join the
        next request), or it has as many requests unsettled as it may have in flight."""
        if not self.requests:
            return False
        return (len(self.requests) >= self.in_flight_limit(max_in_flight)
                or any(r.state == QUEUED or r.generation != generation for r in self.requests)
                or self.recovering)

    def sendable(self, now_s: float, max_in_flight: int) -> list[Any]:
        """The queued requests to send now, in order (module docstring)."""
        if self.recovering:
            if any(r.state == IN_FLIGHT for r in self.requests):
                return []
            first = next((r for r in self.requests if r.state == QUEUED), None)
            return [first] if first is not None and first.due_s <= now_s else []
        max_in_flight = self.in_flight_limit(max_in_flight)
        out = []
        count = sum(r.state != QUEUED for r in self.requests)
        for request in self.requests:
            if request.state != QUEUED:
                continue
            if request.due_s > now_s or count >= max_in_flight:
                break
            out.append(request)
            count += 1
        return out

    def next_due_s(self, max_in_flight: int) -> float:
        """When time alone may let a queued request go (its retry backoff ends) or fail (its
        delivery timeout); infinity if neither.  A request held back by the requests before it
        waits for their answers, not for the clock."""
        queued = [r for r in self.requests if r.state == QUEUED]
        due = min((r.deadline_s for r in queued), default=math.inf)
        if not queued:
            return due
        if self.recovering:
            free = not any(r.state == IN_FLIGHT for r in self.requests)
        else:
            free = len(self.requests) - len(queued) < self.in_flight_limit(max_in_flight)
        return min(due, queued[0].due_s) if free else due

    def sent(self, request: Any) -> None:
        request.state = IN_FLIGHT

    def to_retry(self, request: Any) -> None:
        """``request`` failed retriably (the caller counted the retry and set ``due_s``)."""
        request.state = QUEUED

    def acknowledged(self, request: Any) -> list[Any]:
        """``request`` was acknowledged: the requests whose outcome may be told now, in order."""
        request.state = ACKED
        self.acknowledged_generation = max(self.acknowledged_generation, request.generation)
        return self._settleable()

    def remove(self, request: Any) -> list[Any]:
        """``request`` failed for good and leaves the window: the acknowledged requests whose
        outcome may be told now, in order (after the failure)."""
        self.requests.remove(request)
        return self._settleable()

    def _settleable(self) -> list[Any]:
        done = []
        while self.requests and self.requests[0].state == ACKED:
            done.append(self.requests.pop(0))
        return done


class ProducerIdentity:
    """The producer id and epoch the accumulator stamps on batches, and when to ask for one.

    ``generation`` counts the identities set (0: none yet); a request remembers the generation it
    was drained under, so a partition can tell its requests of an older identity.  An identity
    is wanted before the first drain and again after a request of the current generation failed
    for good (``reset_wanted``).  Asking (InitProducerId) backs off after failures.

    ``obtained_s``: when the current identity came (``time.monotonic()``).  For
    :data:`UNKNOWN_PRODUCER_ID_RETRY_S` after that, the identity is *fresh*: a partition leader
    may not know it was issued yet (error 22), so that error is retried then (:meth:`fresh`)."""

    def __init__(self, backoff_ms: float, backoff_max_ms: float) -> None:
        self.producer_id = -1
        self.producer_epoch = -1
        self.generation = 0
        self.reset_wanted = False
        self.resets = 0  # identities taken after the first
        self.next_attempt_s = 0.0
        self.obtained_s = -math.inf
        self.last_error: BaseException | None = None
        self._backoff_ms = backoff_ms
        self._backoff_max_ms = backoff_max_ms
        self._failures = 0

    def __repr__(self) -> str:
        return (f"ProducerIdentity(id={self.producer_id}, epoch={self.producer_epoch}, "
                f"generation={self.generation}, reset_wanted={self.reset_wanted})")

    @property
    def wanted(self) -> bool:
        """No identity yet, or the current one must be replaced before the next drain."""
        return self.generation == 0 or self.reset_wanted

    def broken(self, generation: int) -> bool:
        """A request of ``generation`` failed for good: a new identity is wanted if that is the
        current one (True then).  An older generation's failure changes nothing: the current
        identity numbers that partition afresh already."""
        if generation == self.generation and self.generation and not self.reset_wanted:
            self.reset_wanted = True
            return True
        return False

    def obtained(self, producer_id: int, producer_epoch: int, now_s: float) -> None:
        if self.generation:
            self.resets += 1
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self.generation += 1
        self.obtained_s = now_s
        self.reset_wanted = False
        self.last_error = None
        self._failures = 0
        self.next_attempt_s = 0.0

    def fresh(self, generation: int, now_s: float) -> bool:
        """Whether ``generation`` is the current identity and it came less than
        :data:`UNKNOWN_PRODUCER_ID_RETRY_S` ago."""
        return (generation == self.generation and not self.reset_wanted
                and now_s - self.obtained_s < UNKNOWN_PRODUCER_ID_RETRY_S)

    def failed(self, now_s: float, error: BaseException) -> None:
        """An InitProducerId attempt failed: the next after a backoff (doubling up to the max)."""
        self.last_error = error
        wait_ms = backoff_ms(self._backoff_ms, self._backoff_max_ms, self._failures)
        self._failures += 1
        self.next_attempt_s = now_s + wait_ms / 1000
