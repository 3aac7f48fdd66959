"""What a worker measures, and the file through which the arbiter sees it.

Everything is a cumulative Python number on the worker's event loop, changed per request or per
flush, never per record, and read by nobody else in the process:

- per partition (attributes of :class:`~hpbroker.workers.partitions.Partition`): records and
  bytes appended by produce requests, records and bytes handed out by fetch responses (both
  transports; a response's records are those of its whole batches, from
  ``FileSlice.first_offset`` to ``next_offset``; counted once the transport took the response,
  so a slice the ZeroMQ path could not read counts as the error the client got instead, and one
  for a data port connection already closed not at all), flushes and the bytes they wrote;
- per worker (:class:`WorkerStats`): requests received by type and transport; answers with an
  error by request type and code; latency histograms of produce (from the request's arrival at
  the worker to its response, the wait for the flush included; acks=0 requests have none) and
  fetch (from arrival to response, by transport and by whether it was *parked*, i.e. waited at
  the log end for a long poll); the group commits' duration (``writev`` + ``fdatasync``), as the
  native flush job measured it (``FlushJob.write_ns``, ``sync_ns``); and every ``fdatasync`` of a
  segment's data the logs issued: a group commit's (``FlushJob.sync_ns``, with ``flush_fsync``
  on, or when a roll or close runs the job) and those of rolls, checkpoints and closes
  (``PartitionLog.on_sync``), whatever ``flush_fsync`` says.

A response's time ends when the worker hands it to its transport: the backend socket to the
arbiter (which forwards it to the client at once) or the data port connection (written at once
unless the client is slow to read).

**The stats file.**  When the broker serves metrics (``metrics_port`` set), the worker replaces
``<run_dir>/worker-<slot>.stats.json`` at every heartbeat (write ``worker-<slot>.stats.json.tmp``,
one name per slot so that a worker killed while writing leaves nothing its successor does not
replace, then rename; no fsync),
which the arbiter reads on each scrape, so figures are at most one ``heartbeat_interval_ms`` old::

    {"version": 1, "slot": 0, "pid": 1234, "time_ms": 1700000000000, "start_time_s": 1699999000.5,
     "cpu_seconds": 12.5, "resident_bytes": 81920000, "connections": 3,
     "requests": [[api_key, "zmq" | "tcp", count], ...],
     "errors": [[api_key, code, count], ...],
     "produce_latency": {"counts": [...], "sum": 0.84},
     "fetch_latency": [["tcp", parked (bool), {"counts": [...], "sum": 1.2}], ...],
     "flush_duration": {...}, "fsync_duration": {...}, "isr_shrinks": 0, "isr_expands": 0,
     "partitions": [{"topic": "orders", "partition": 3,
                     "produced_records": 0, "produced_bytes": 0, "duplicate_records": 0, "fetched_records": 0,
                     "fetched_bytes": 0, "flushes": 0, "flushed_bytes": 0, "log_start_offset": 0,
                     "high_watermark": 0, "size_bytes": 0, "segments": 1, "damaged_ranges": 0,
                     "damaged_records": 0, "writes_refused": 0}, ...]}

A replicated partition's entry adds its ``role`` (``leader``, ``follower``, ``none``; just
``awaiting`` while its first role has not come), ``leader_epoch`` and
``replicated_high_watermark``; on its leader also ``under_replicated`` (1
while the ISR is smaller than the replicas), ``under_min_isr`` (1 while the ISR is smaller than
``min_insync_replicas``: acks=-1 produce is refused), ``isr_shrinks`` and ``isr_expands`` (ISR
changes taken since leadership began) and ``followers``: ``[{"broker": 1, "fetch_offset": 51200,
"in_sync": true, "lag_records": 34, "lag_bytes": 4096, "last_caught_up_ms": ...}, ...]`` (lag
behind the leader's flushed end, as of each follower's last fetch; ``fetch_offset`` -1 before
its first fetch in this leader epoch); on a follower ``fetch_failed`` (1 while its leader could
not give the range from ``failed_offset`` intact, ``hpbroker.workers.replication``) and
``failed_offset`` (null when none).

The worker-wide ``isr_shrinks`` and ``isr_expands`` (top level) count the ISR changes its
leaders took since the worker started: a partition's own counts start again with each
leadership, so each snapshot adds what every leadership it saw at the previous one (still
leading or not) took since, and what the new ones took.  A leadership that begins and ends
between two snapshots (one ``heartbeat_interval_ms``) is not counted.

``duplicate_records`` counts the records of produce requests an idempotent producer sent again
after the partition had stored them (answered with the stored copy's offsets, not appended).
``writes_refused`` is 1 while the partition's log refuses appends after a failed write (a full
disk, a failed ``fdatasync``: ``PartitionLog.write_failure``), 0 otherwise.

Histograms are ``hpbroker.metrics.Histogram`` snapshots over ``LATENCY_BUCKETS_S``.  A respawned
worker starts again from zero: a reset, which Prometheus's ``rate`` and ``increase`` take in their
stride (``hpbroker_worker_start_time_seconds`` says when it happened).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from bisect import bisect_left
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from hpbroker.metrics import Histogram
from hpbroker.metrics.process import cpu_seconds, resident_memory_bytes
from hpbroker.protocol import ApiKey
from hpbroker.workers.replies import Reply, Responder

if TYPE_CHECKING:
    from hpbroker.io.log import FlushJob
    from hpbroker.workers.partitions import Partition

__all__ = ["STATS_VERSION", "TRANSPORTS", "TimedResponder", "WorkerStats", "read_stats", "stats_path",
           "write_stats"]

STATS_VERSION = 1
TRANSPORTS = ("zmq", "tcp")  # requests relayed by the arbiter; the worker's TCP data port
_NS = 1e-9
_PRODUCE, _FETCH = ApiKey.PRODUCE, ApiKey.FETCH


class WorkerStats:
    """The per-worker measurements of one worker process (module docstring).  Single-threaded:
    the worker's event loop."""

    def __init__(self) -> None:
        self.start_time_s = time.time()
        self.requests: dict[tuple[int, str], int] = {}
        self.errors: dict[tuple[int, int], int] = {}
        self.produce_latency = Histogram()
        self.fetch_latency = {(transport, parked): Histogram() for transport in TRANSPORTS
                              for parked in (False, True)}
        self.flush_duration = Histogram()
        self.fsync_duration = Histogram()
        self.isr_shrinks = self.isr_expands = 0  # taken by this worker's leaders (module docstring)
        # Each leadership (a LeaderReplica, kept alive here) seen by the last snapshot, with its
        # counts then: id -> (replica, isr_shrinks, isr_expands).
        self._leaderships: dict[int, tuple[Any, int, int]] = {}

    def timed(self, responder: Responder, api_key: int, transport: str) -> TimedResponder:
        """Count a request arriving now, and wrap its responder to measure its answer."""
        key = (api_key, transport)
        self.requests[key] = self.requests.get(key, 0) + 1
        return TimedResponder(responder, self, api_key, transport)

    def flushed(self, job: FlushJob) -> None:
        """A group commit the log applied (``PartitionLog.on_flush``)."""
        self.flush_duration.observe((job.write_ns + job.sync_ns) * _NS)
        if job.fsync:
            self.fsync_duration.observe(job.sync_ns * _NS)

    def synced(self, sync_ns: int) -> None:
        """Any other fdatasync of a segment's data the log issued (``PartitionLog.on_sync``)."""
        self.fsync_duration.observe(sync_ns * _NS)

    def count_isr_changes(self, partitions: Iterable[Partition]) -> None:
        """Add the ISR changes the leaderships of ``partitions`` and those of the last call took
        since the last call (module docstring)."""
        leaderships = {}
        for partition in partitions:
            replica = partition.replica
            if replica is not None and hasattr(replica, "isr_shrinks"):
                leaderships[id(replica)] = replica
        seen = self._leaderships
        for key in seen.keys() | leaderships.keys():
            replica, shrinks, expands = seen.get(key) or (leaderships[key], 0, 0)
            self.isr_shrinks += max(0, replica.isr_shrinks - shrinks)
            self.isr_expands += max(0, replica.isr_expands - expands)
        self._leaderships = {key: (replica, replica.isr_shrinks, replica.isr_expands)
                             for key, replica in leaderships.items()}

    def snapshot(self, slot: int, partitions: Iterable[Partition], connections: int) -> dict[str, Any]:
        """The stats file's content now (module docstring)."""
        partitions = list(partitions)
        self.count_isr_changes(partitions)
        return {
            "version": STATS_VERSION, "slot": slot, "pid": os.getpid(),
            "time_ms": time.time_ns() // 1_000_000,
            "start_time_s": self.start_time_s, "cpu_seconds": cpu_seconds(),
            "resident_bytes": resident_memory_bytes(), "connections": connections,
            "requests": [[api_key, transport, n] for (api_key, transport), n in self.requests.items()],
            "errors": [[api_key, code, n] for (api_key, code), n in self.errors.items()],
            "produce_latency": self.produce_latency.to_json(),
            "fetch_latency": [[transport, parked, histogram.to_json()]
                              for (transport, parked), histogram in self.fetch_latency.items()],
            "flush_duration": self.flush_duration.to_json(),
            "fsync_duration": self.fsync_duration.to_json(),
            "isr_shrinks": self.isr_shrinks, "isr_expands": self.isr_expands,
            "partitions": [_partition_entry(p) for p in partitions],
        }


def _partition_entry(partition: Partition) -> dict[str, Any]:
    log = partition.log
    damaged = log.damaged_ranges
    return {"topic": partition.topic, "partition": partition.partition,
            "produced_records": partition.produced_records, "produced_bytes": partition.produced_bytes,
            "duplicate_records": partition.duplicate_records,
            "fetched_records": partition.fetched_records, "fetched_bytes": partition.fetched_bytes,
            "flushes": partition.flushes_done, "flushed_bytes": partition.flushed_bytes,
            "log_start_offset": log.log_start_offset, "high_watermark": log.high_watermark,
            "size_bytes": log.size_in_bytes, "segments": log.segment_count,
            "damaged_ranges": len(damaged), "damaged_records": sum(r.record_count for r in damaged),
            "writes_refused": int(log.write_failure is not None), **_replication_entry(partition)}


def _replication_entry(partition: Partition) -> dict[str, Any]:
    """A replicated partition's role, and on its leader the followers' lag and the ISR's changes."""
    replica = partition.replica
    if replica is None:
        return {"role": "awaiting"} if partition.awaiting_role else {}
    entry: dict[str, Any] = {"role": replica.role.role, "leader_epoch": replica.leader_epoch,
                             "replicated_high_watermark": replica.high_watermark}
    stats = getattr(replica, "stats", None)
    if stats is not None:
        entry.update(stats())
    state = getattr(replica, "state", None)  # a leader's LeaderState
    if state is not None:
        entry["under_min_isr"] = int(len(state.isr) < state.min_insync_replicas)
    return entry


class TimedResponder:
    """The responder of one request, in front of its transport's: when the answer comes it
    observes the latency (up to the hand-over), hands it over, then counts an error and, for a
    fetch, what the answer handed out of :attr:`partition` (set by the handler once it found the
    partition; :attr:`parked` once the fetch had to wait), as the transport left the reply."""

    __slots__ = ("_api_key", "_inner", "_started", "_stats", "_transport", "parked", "partition")

    def __init__(self, inner: Responder, stats: WorkerStats, api_key: int, transport: str) -> None:
        self._inner = inner
        self._stats = stats
        self._api_key = api_key
        self._transport = transport
        self._started = time.monotonic()
        self.partition: Partition | None = None
        self.parked = False

    def __call__(self, reply: Reply) -> None:
        elapsed = time.monotonic() - self._started
        self._inner(reply)  # first: the transport says in the reply what it could not hand out
        stats, api_key = self._stats, self._api_key
        if reply.error_code:
            key = (api_key, reply.error_code)
            stats.errors[key] = stats.errors.get(key, 0) + 1
        if api_key == _PRODUCE:
            histogram = stats.produce_latency
        elif api_key == _FETCH:
            histogram = stats.fetch_latency[self._transport, self.parked]
            file_slice, partition = reply.file_slice, self.partition
            if file_slice is not None and partition is not None:
                partition.fetched_bytes += file_slice.length
                partition.fetched_records += file_slice.next_offset - file_slice.first_offset
        else:
            return
        histogram.counts[bisect_left(histogram.bounds, elapsed)] += 1  # Histogram.observe, inlined
        histogram.sum += elapsed


def stats_path(run_dir: str, slot: int) -> str:
    return os.path.join(run_dir, f"worker-{slot}.stats.json")


def write_stats(run_dir: str, slot: int, content: dict[str, Any]) -> None:
    """Replace the slot's stats file (the worker, from its loop)."""
    path = stats_path(run_dir, slot)
    tmp = f"{path}.tmp"  # one per slot: a slot has one process at a time
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(content, f, separators=(",", ":"))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # a write cut short by a full disk gives back what it took
        raise


def read_stats(run_dir: str, slot: int) -> dict[str, Any] | None:
    """The slot's latest stats (the arbiter); None when there are none or they do not parse."""
    try:
        with open(stats_path(run_dir, slot), encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(content, dict) or content.get("version") != STATS_VERSION:
        return None
    return content
