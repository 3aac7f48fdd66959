"""The broker's metrics endpoint, run by the arbiter: :class:`MetricsEndpoint`.

With ``metrics_port`` set, the arbiter binds an HTTP server (``hpbroker.metrics.MetricsServer``)
before it forks its first workers (a port in use stops the broker at start; every worker closes
the inherited socket) and starts its thread once they are forked.  Each scrape of ``/metrics``
renders, on the scraping thread, from:

- the slot table as the arbiter's loop last published it (:attr:`MetricsEndpoint.slots`, a tuple
  of :class:`SlotView` swapped in with one assignment whenever a slot changes state);
- each slot's stats file (``hpbroker.workers.stats``), taken only when it comes from the slot's
  current process: per-partition traffic and log state, per-worker latencies, flush times,
  requests, errors, connections; each partition's role, and for those it leads the ISR's state
  and changes and each follower's lag (series with a ``replica`` label only for partitions led
  here, so their number is bounded by what this broker leads);
- the front-end's error counts (a dict of ints the loop updates, copied whole);
- the ZeroMQ front-end's open connections, as ``hpbroker.workers.peers.FrontendPeers`` counts
  them from the front-end's socket monitor (which the loop drains; an int read whole);
- with ZooKeeper, the consumer groups' committed offsets (``hpbroker.coord.lag``, read on a
  thread of their own every ``metrics_lag_interval_ms``), against the high watermarks of the
  partitions this broker leads (an unreplicated partition it serves, or a replicated one's
  leader: its replicated high watermark, the end consumers read to);
- with ZooKeeper, this broker's controller (``hpbroker.coord.controller``), through
  :attr:`MetricsEndpoint.controller_state`, the controller's ``state`` method (thread-safe, a
  copy, never waiting for ZooKeeper) the arbiter hands over once its controller runs;
- the arbiter process's own usage.

Ages are never negative and never jump with a step of the wall clock (NTP, an operator setting
the date).  ``hpbroker_consumer_group_offsets_age_seconds`` is measured on the monotonic clock:
the poller's thread that reads the offsets runs in this process.  A worker's report carries its
wall-clock time (``time_ms``), written by another process; :class:`_ReportAges` measures its age
on the monotonic clock from the scrape that first read it, and takes the wall-clock age at that
first read only within what is possible: at least 0, at most the time since the previous read of
the slot's file (which did not hold the report yet).  A step between a report's write and its
first read so costs at most the interval between two scrapes, never the step.

Nothing here runs on the loop except the hand-overs (``slots``, ``stopping``,
``controller_state``, :meth:`~MetricsEndpoint.set_topics`): a slow scrape costs the loop nothing
but the GIL.  ``/healthz`` answers 200 while every worker serves, 503 otherwise (naming
the slots that crash-loop).
:data:`FAMILIES` is every metric; docs/METRICS.md describes each (a test keeps the two equal).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpbroker import __version__
from hpbroker.broker.config import BrokerConfig
from hpbroker.errors import ERRORS_BY_CODE
from hpbroker.metrics import Histogram, MetricFamily, MetricsServer, render
from hpbroker.metrics.exposition import COUNTER, GAUGE, HISTOGRAM
from hpbroker.metrics.process import cpu_seconds, open_fds, resident_memory_bytes, start_time_seconds
from hpbroker.metrics.server import load_metrics_token
from hpbroker.protocol import ApiKey
from hpbroker.workers.replication import unsafe_ack_before_replication
from hpbroker.workers.stats import read_stats

if TYPE_CHECKING:  # kazoo is loaded only by a broker configured with ZooKeeper
    from hpbroker.coord.lag import GroupOffsetsPoller
    from hpbroker.coord.session import Session
    from hpbroker.workers.peers import FrontendPeers

__all__ = ["FAMILIES", "MetricsEndpoint", "SlotView"]

logger = logging.getLogger(__name__)

_P = ("topic", "partition")
_R = ("topic", "partition", "replica")
_G = ("group", "topic", "partition")
# Every metric the endpoint serves: name -> (type, label names, help).  docs/METRICS.md lists them.
FAMILIES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "hpbroker_broker_info": (GAUGE, ("broker_id", "version"), "Always 1: this broker's id and version."),
    "hpbroker_unsafe_ack_before_replication": (
        GAUGE, (), "1 while the test-only HPBROKER_UNSAFE_ACK_BEFORE_REPLICATION=1 is on: acks=all is "
                   "answered before replication: acknowledged records can be lost.  Never 1 in production."),
    "process_start_time_seconds": (GAUGE, (), "When the arbiter process started, in seconds since 1970."),
    "process_cpu_seconds_total": (COUNTER, (), "CPU time of the arbiter process, in seconds."),
    "process_resident_memory_bytes": (GAUGE, (), "Resident memory of the arbiter process."),
    "process_open_fds": (GAUGE, (), "Open file descriptors of the arbiter process."),
    "hpbroker_workers": (
        GAUGE, ("state",), "Worker slots by state: booting, serving, stopping, dead, backoff."),
    "hpbroker_worker_serving": (GAUGE, ("worker",), "1 while the slot's worker serves requests, else 0."),
    "hpbroker_worker_restarts_total": (
        COUNTER, ("worker",), "Times the slot's worker was started again after its process ended."),
    "hpbroker_worker_crashloop": (
        GAUGE, ("worker",),
        "1 while the slot is crash-looping: its partitions are unavailable and it is retried with backoff."),
    "hpbroker_worker_backoff_seconds": (
        GAUGE, ("worker",),
        "The slot's crash-loop backoff before a retry (doubling up to 60 s); 0 when not crash-looping."),
    "hpbroker_worker_backoffs_total": (
        COUNTER, ("worker",), "Times the slot was held back with a backoff instead of restarted at once."),
    "hpbroker_worker_start_time_seconds": (
        GAUGE, ("worker",), "When the slot's current worker process started; its counters count from then."),
    "hpbroker_worker_report_age_seconds": (
        GAUGE, ("worker",), "Age of the figures the slot's worker last reported (one every heartbeat)."),
    "hpbroker_worker_cpu_seconds_total": (COUNTER, ("worker",), "CPU time of the slot's worker, in seconds."),
    "hpbroker_worker_resident_memory_bytes": (GAUGE, ("worker",), "Resident memory of the slot's worker."),
    "hpbroker_data_port_connections": (GAUGE, ("worker",), "Open TCP connections on the worker's data port."),
    "hpbroker_frontend_connections": (GAUGE, (), "Open client connections to the ZeroMQ front-end."),
    "hpbroker_requests_total": (
        COUNTER, ("worker", "request", "transport"),
        "Requests a worker received, by type; transport zmq: relayed by the front-end, tcp: its data port."),
    "hpbroker_request_errors_total": (
        COUNTER, ("worker", "request", "code", "error"), "Requests a worker answered with an error."),
    "hpbroker_frontend_request_errors_total": (
        COUNTER, ("request", "code", "error"),
        "Requests the front-end answered with an error itself (not relayed to a worker), by code."),
    "hpbroker_produce_latency_seconds": (
        HISTOGRAM, ("worker",),
        "From a produce request's arrival at its worker to its response, the flush it waits for included."),
    "hpbroker_fetch_latency_seconds": (
        HISTOGRAM, ("worker", "transport", "parked"),
        "From a fetch request's arrival at its worker to its response; parked: it waited at the log end."),
    "hpbroker_flush_duration_seconds": (
        HISTOGRAM, ("worker",), "One group commit: its writev calls and fdatasync, timed natively."),
    "hpbroker_fsync_duration_seconds": (
        HISTOGRAM, ("worker",),
        "Every fdatasync of segment data: group commits (flush_fsync), rolls, checkpoints, closing."),
    "hpbroker_produced_records_total": (COUNTER, _P, "Records appended by produce requests."),
    "hpbroker_produced_bytes_total": (COUNTER, _P, "Bytes of record batches appended by produce requests."),
    "hpbroker_produce_duplicate_records_total": (
        COUNTER, _P, "Records of produce requests an idempotent producer retried after they were stored: "
                     "answered with the stored copy's offsets, not appended again."),
    "hpbroker_fetched_records_total": (COUNTER, _P, "Records in the batches fetch responses handed out."),
    "hpbroker_fetched_bytes_total": (COUNTER, _P, "Bytes of record batches fetch responses handed out."),
    "hpbroker_log_flushes_total": (COUNTER, _P, "Group commits applied to the partition's log."),
    "hpbroker_log_flushed_bytes_total": (COUNTER, _P, "Bytes the partition's group commits wrote."),
    "hpbroker_log_start_offset": (GAUGE, _P, "The partition's first offset still kept."),
    "hpbroker_log_high_watermark": (
        GAUGE, _P, "The partition's log end as consumers see it: the offset after the last flushed record."),
    "hpbroker_log_size_bytes": (GAUGE, _P, "Bytes of flushed batches in the partition's segments."),
    "hpbroker_log_segments": (GAUGE, _P, "Segments of the partition's log."),
    "hpbroker_log_damaged_ranges": (
        GAUGE, _P, "Damaged ranges known in the partition's log: stored bytes that failed their checks, or "
                   "a missing segment; reads there get error 18."),
    "hpbroker_log_damaged_records": (
        GAUGE, _P, "Offsets inside the partition's damaged ranges: records that cannot be read."),
    "hpbroker_log_writes_refused": (
        GAUGE, _P, "1 while the partition refuses produce after a failed write (a full disk), until writes "
                   "resume by themselves; else 0."),
    "hpbroker_leader_partitions": (
        GAUGE, (), "Partitions this broker leads: the unreplicated ones it serves, the replicated ones it "
                   "is leader of."),
    "hpbroker_under_replicated_partitions": (
        GAUGE, (), "Partitions this broker leads whose ISR is smaller than their replicas."),
    "hpbroker_under_min_isr_partitions": (
        GAUGE, (), "Partitions this broker leads whose ISR is smaller than min_insync_replicas: "
                   "acks=all produce is refused."),
    "hpbroker_replica_fetch_failed_partitions": (
        GAUGE, (), "Partitions this broker follows whose leader could not give a range intact (its bytes "
                   "failed this replica's checks, or it answered a storage error): retried with backoff."),
    "hpbroker_offline_replicas": (
        GAUGE, (), "Replicated partitions whose replica here this broker reports offline: its worker slot "
                   "crash-loops, or serves on probation since its retry."),
    "hpbroker_isr_shrinks_total": (
        COUNTER, ("worker",), "ISR shrinks (a follower dropped) of the partitions the worker leads."),
    "hpbroker_isr_expands_total": (
        COUNTER, ("worker",), "ISR expands (a follower back in sync) of the partitions the worker leads."),
    "hpbroker_replica_lag_records": (
        GAUGE, _R, "Records a follower of a partition led here lacks: the leader's flushed end minus the "
                   "follower's, as of its last fetch."),
    "hpbroker_replica_lag_bytes": (
        GAUGE, _R, "Bytes of record batches a follower of a partition led here lacks, as of its last fetch."),
    "hpbroker_controller_active": (GAUGE, (), "1 while this broker is the cluster's controller, else 0."),
    "hpbroker_controller_epoch": (GAUGE, (), "The controller epoch the active controller was elected in."),
    "hpbroker_offline_partitions": (
        GAUGE, (), "Replicated partitions without a leader, as the active controller last saw them."),
    "hpbroker_preferred_replica_imbalance": (
        GAUGE, (), "Replicated partitions led by another broker than their preferred replica, as the active "
                   "controller last saw them."),
    "hpbroker_leader_elections_total": (
        COUNTER, (), "Leaders this broker's controller elected while it was active."),
    "hpbroker_consumer_group_committed_offset": (
        GAUGE, _G, "The group's committed offset (the next record it consumes) in a partition served here."),
    "hpbroker_consumer_group_lag": (
        GAUGE, _G, "Records the group has not consumed: high watermark minus committed offset, at least 0."),
    "hpbroker_consumer_group_offsets_age_seconds": (
        GAUGE, (), "Age of the committed offsets behind the consumer-group metrics."),
}
_STATES = ("booting", "serving", "stopping", "dead", "backoff")  # SlotState values
_REQUEST_NAMES = {getattr(ApiKey, name): name.lower() for name in vars(ApiKey) if name.isupper()}
_UNKNOWN_REQUEST = "unknown"  # every api key the broker does not know: one series, not one per key
_PARTITION_FIELDS = (  # stats file field -> family
    ("produced_records", "hpbroker_produced_records_total"),
    ("produced_bytes", "hpbroker_produced_bytes_total"),
    ("duplicate_records", "hpbroker_produce_duplicate_records_total"),
    ("fetched_records", "hpbroker_fetched_records_total"),
    ("fetched_bytes", "hpbroker_fetched_bytes_total"),
    ("flushes", "hpbroker_log_flushes_total"),
    ("flushed_bytes", "hpbroker_log_flushed_bytes_total"),
    ("log_start_offset", "hpbroker_log_start_offset"),
    ("high_watermark", "hpbroker_log_high_watermark"),
    ("size_bytes", "hpbroker_log_size_bytes"),
    ("segments", "hpbroker_log_segments"),
    ("damaged_ranges", "hpbroker_log_damaged_ranges"),
    ("damaged_records", "hpbroker_log_damaged_records"),
    ("writes_refused", "hpbroker_log_writes_refused"),
)


@dataclass(frozen=True, slots=True)
class SlotView:
    """One slot as the arbiter's loop last saw it."""

    index: int
    state: str  # a SlotState value
    pid: int
    restarts: int
    crash_looping: bool = False  # its partitions unavailable: held back or retrying (slots.Slot)
    backoff_s: float = 0.0  # the current crash-loop backoff; 0 when not crash-looping
    backoffs: int = 0  # times it was held back


class MetricsEndpoint:
    """The arbiter's metrics endpoint (module docstring).  Construct it where a failure should stop
    the broker (it binds); :meth:`watch_peers` before the front-end binds; :meth:`start` and
    :meth:`watch_groups` start threads, so call them after the first fork with the arbiter's
    signals blocked; :meth:`close` at the end."""

    def __init__(self, config: BrokerConfig, run_dir: str,
                 frontend_errors: Callable[[], Mapping[tuple[int, int], int]]) -> None:
        self._config = config
        self._run_dir = run_dir
        self._frontend_errors = frontend_errors
        started_s = start_time_seconds()  # the kernel's record; else (no /proc) about now
        self._started_s = started_s if started_s is not None else time.time()
        self.slots: tuple[SlotView, ...] = ()
        self.stopping = False
        self.offline_replicas = 0  # set by the arbiter: the replicas its registration reports offline
        self.unsafe_ack_before_replication = unsafe_ack_before_replication()  # the workers inherit it
        # The controller's state (Controller.state: thread-safe, never waits); None: no controller.
        self.controller_state: Callable[[], Mapping[str, Any]] | None = None
        self._peers: FrontendPeers | None = None
        self._groups: GroupOffsetsPoller | None = None
        self._reports = _ReportAges()
        token = load_metrics_token(config.metrics_token_file) if config.metrics_token_file else None
        self._server = MetricsServer(config.metrics_host or config.host, config.metrics_port, self.render,
                                     self.health, token=token)

    @property
    def address(self) -> tuple[str, int]:
        return self._server.address

    # --- the arbiter's side -------------------------------------------------------------------

    def watch_peers(self, peers: FrontendPeers) -> None:
        """Show the front-end's connections as ``peers`` counts them (the loop drains it)."""
        self._peers = peers

    def start(self) -> None:
        """Serve the endpoint."""
        self._server.start()

    def watch_groups(self, session: Session, interval_s: float, topics: frozenset[str]) -> None:
        """Read the consumer groups' committed offsets of ``topics`` from ZooKeeper from now on."""
        from hpbroker.coord.lag import GroupOffsetsPoller

        self._groups = GroupOffsetsPoller(session, interval_s=interval_s)
        self._groups.topics = topics
        self._groups.start()

    def set_topics(self, topics: frozenset[str]) -> None:
        groups = self._groups
        if groups is not None:
            groups.topics = topics

    def stop_watching_groups(self) -> None:
        groups, self._groups = self._groups, None  # a scrape reads the attribute once
        if groups is not None:
            groups.close()

    def close(self) -> None:
        """Stop serving and watching.  Idempotent; before the ZeroMQ context is terminated."""
        self.stop_watching_groups()
        self._server.close()

    # --- the scraping thread ------------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        slots = self.slots
        serving = sum(1 for s in slots if s.state == "serving")
        text = f"{serving} of {len(slots)} workers serving"
        looping = [str(s.index) for s in slots if s.crash_looping]
        if looping:
            text += f"; crash-looping, retried with backoff: slot {', '.join(looping)}"
        if self.stopping:
            return False, f"stopping: {text}"
        return serving == len(slots), text

    def render(self) -> str:
        return render(self.collect())

    def collect(self) -> list[MetricFamily]:
        """Every family of :data:`FAMILIES`, with the series known now."""
        families = {name: MetricFamily(name, kind, text, labels)
                    for name, (kind, labels, text) in FAMILIES.items()}
        config = self._config
        families["hpbroker_broker_info"].add((config.broker_id, __version__), 1)
        families["hpbroker_unsafe_ack_before_replication"].add((), int(self.unsafe_ack_before_replication))
        families["process_start_time_seconds"].add((), self._started_s)
        families["process_cpu_seconds_total"].add((), cpu_seconds())
        for name, value in (("process_resident_memory_bytes", resident_memory_bytes()),
                            ("process_open_fds", open_fds())):
            if value is not None:
                families[name].add((), value)
        if self._peers is not None:
            families["hpbroker_frontend_connections"].add((), self._peers.count)
        slots = self.slots
        for state in _STATES:
            families["hpbroker_workers"].add((state,), sum(1 for s in slots if s.state == state))
        frontend_errors: dict[tuple[str, int], int] = {}
        for (api_key, code), count in dict(self._frontend_errors()).items():
            key = (_request_name(api_key), code)
            frontend_errors[key] = frontend_errors.get(key, 0) + count
        for (request, code), count in sorted(frontend_errors.items()):
            families["hpbroker_frontend_request_errors_total"].add((request, code, _error_name(code)), count)
        replicas = _Replicas()
        for view in slots:
            families["hpbroker_worker_serving"].add((view.index,), int(view.state == "serving"))
            families["hpbroker_worker_restarts_total"].add((view.index,), view.restarts)
            families["hpbroker_worker_crashloop"].add((view.index,), int(view.crash_looping))
            families["hpbroker_worker_backoff_seconds"].add((view.index,), view.backoff_s)
            families["hpbroker_worker_backoffs_total"].add((view.index,), view.backoffs)
            stats, age_s = self._reports.read(self._run_dir, view.index) if view.pid else (None, None)
            if stats is None or stats.get("pid") != view.pid:
                continue
            try:
                _add_worker(families, view.index, stats, age_s, replicas)
            except (KeyError, TypeError, ValueError) as e:  # a file from a worker of another version
                logger.warning("[arbiter] metrics: ignoring the stats of worker slot %d: %r", view.index, e)
        for name, value in (("hpbroker_leader_partitions", replicas.leaders),
                            ("hpbroker_under_replicated_partitions", replicas.under_replicated),
                            ("hpbroker_under_min_isr_partitions", replicas.under_min_isr),
                            ("hpbroker_replica_fetch_failed_partitions", replicas.fetch_failed),
                            ("hpbroker_offline_replicas", self.offline_replicas)):
            families[name].add((), value)
        self._add_controller(families)
        self._add_groups(families, replicas.high_watermarks)
        return list(families.values())

    def _add_controller(self, families: dict[str, MetricFamily]) -> None:
        controller_state = self.controller_state  # once: the loop may set it to None meanwhile
        if controller_state is None:
            return
        try:
            state = controller_state()
            active = bool(state["active"])
            series = [("hpbroker_controller_active", int(active)),
                      ("hpbroker_leader_elections_total", int(state["leader_elections"]))]
            if active:  # the figures of the cluster are the active controller's to report
                series += [(f"hpbroker_{name}", int(state[name])) for name in (
                    "controller_epoch", "offline_partitions", "preferred_replica_imbalance")]
        except Exception:  # a scrape shows the rest rather than failing
            logger.exception("[arbiter] metrics: cannot read the controller's state")
            return
        for name, value in series:
            families[name].add((), value)

    def _add_groups(self, families: dict[str, MetricFamily],
                    high_watermarks: Mapping[tuple[str, int], int]) -> None:
        groups = self._groups  # once: the loop may set it to None meanwhile (stop_watching_groups)
        snapshot = groups.snapshot if groups is not None else None
        if snapshot is None:
            return
        age_s = max(0.0, time.monotonic() - snapshot.read_at)  # read_at: this process's monotonic clock
        families["hpbroker_consumer_group_offsets_age_seconds"].add((), age_s)
        for (group, topic, partition), offset in sorted(snapshot.offsets.items()):
            high_watermark = high_watermarks.get((topic, partition))
            if high_watermark is None:  # not served here now
                continue
            key = (group, topic, partition)
            families["hpbroker_consumer_group_committed_offset"].add(key, offset)
            families["hpbroker_consumer_group_lag"].add(key, max(0, high_watermark - offset))


class _Replicas:
    """What the workers' stats say of the partitions' roles, summed over the slots of one scrape."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, int]] = set()  # partitions already counted (by one slot only)
        self.high_watermarks: dict[tuple[str, int], int] = {}  # those led here: where consumers read to
        self.leaders = self.under_replicated = self.under_min_isr = 0
        self.fetch_failed = 0  # partitions followed here whose leader's range failed


class _ReportAges:
    """Reads the workers' stats files and tells each report's age (module docstring), on the
    monotonic clock.  Per slot it keeps the report last read, ``(pid, time_ms)``, the monotonic
    time it was written at as estimated at its first read, and when the file was last read.
    Thread-safe: concurrent scrapes take turns (a read and its bookkeeping under one lock)."""

    def __init__(self, *, wall_clock: Callable[[], float] = time.time,
                 monotonic_clock: Callable[[], float] = time.monotonic) -> None:
        self._wall_clock, self._monotonic_clock = wall_clock, monotonic_clock
        self._lock = threading.Lock()
        # Before any worker is forked: no report of a current worker was written earlier.
        self._created = monotonic_clock()
        self._slots: dict[int, tuple[object, float | None, float]] = {}  # report, written at, last read

    def read(self, run_dir: str, slot: int) -> tuple[dict[str, Any] | None, float | None]:
        """The slot's stats (``read_stats``) and their age in seconds; the age is None when the
        stats carry no valid ``time_ms``."""
        with self._lock:
            read_at = self._monotonic_clock()
            wall = self._wall_clock()
            stats = read_stats(run_dir, slot)
            report, written_at, last_read = self._slots.get(slot, (None, None, self._created))
            key = (stats.get("pid"), stats.get("time_ms")) if stats is not None else None
            if key != report:
                written_at = None
                if key is not None and type(key[1]) is int:
                    wall_age_s = min(max(0.0, wall - key[1] / 1000), read_at - last_read)
                    written_at = read_at - wall_age_s
            self._slots[slot] = (key, written_at, read_at)
            if written_at is None:
                return stats, None
            return stats, max(0.0, self._monotonic_clock() - written_at)


def _add_worker(families: dict[str, MetricFamily], slot: int, stats: dict[str, Any], age_s: float | None,
                replicas: _Replicas) -> None:
    """One worker's stats file (``hpbroker.workers.stats``) into the families, its partitions'
    roles into ``replicas``; ``age_s`` the report's age (:class:`_ReportAges`).  Everything is
    parsed before anything is added."""
    worker = (slot,)
    if age_s is None:
        raise ValueError(f"time_ms is not a time in ms: {stats.get('time_ms')!r}")
    scalars = [("hpbroker_worker_start_time_seconds", float(stats["start_time_s"])),
               ("hpbroker_worker_report_age_seconds", age_s),
               ("hpbroker_worker_cpu_seconds_total", float(stats["cpu_seconds"])),
               ("hpbroker_data_port_connections", int(stats["connections"]))]
    if stats.get("resident_bytes") is not None:
        scalars.append(("hpbroker_worker_resident_memory_bytes", int(stats["resident_bytes"])))
    series: list[tuple[str, tuple[object, ...], Any]] = [(name, worker, value) for name, value in scalars]
    for api_key, transport, count in stats["requests"]:
        series.append(("hpbroker_requests_total", (slot, _request_name(api_key), transport), int(count)))
    for api_key, code, count in stats["errors"]:
        labels = (slot, _request_name(api_key), code, _error_name(code))
        series.append(("hpbroker_request_errors_total", labels, int(count)))
    series.append(("hpbroker_produce_latency_seconds", worker, Histogram.from_json(stats["produce_latency"])))
    for transport, parked, histogram in stats["fetch_latency"]:
        series.append(("hpbroker_fetch_latency_seconds", (slot, transport, str(bool(parked)).lower()),
                       Histogram.from_json(histogram)))
    series.append(("hpbroker_flush_duration_seconds", worker, Histogram.from_json(stats["flush_duration"])))
    series.append(("hpbroker_fsync_duration_seconds", worker, Histogram.from_json(stats["fsync_duration"])))
    for name in ("isr_shrinks", "isr_expands"):
        series.append((f"hpbroker_{name}_total", worker, int(stats.get(name, 0))))
    partitions: dict[tuple[str, int], tuple[dict[str, int], _Role]] = {}
    for entry in stats["partitions"]:
        partitions[str(entry["topic"]), int(entry["partition"])] = (
            {field: int(entry[field]) for field, _family in _PARTITION_FIELDS}, _Role.parse(entry))
    for key in sorted(partitions):
        if key in replicas.seen:  # never two series of one partition (two slots claiming it)
            continue
        replicas.seen.add(key)
        values, role = partitions[key]
        series.extend((family, key, values[field]) for field, family in _PARTITION_FIELDS)
        replicas.fetch_failed += role.fetch_failed
        if role.leading:
            replicas.leaders += 1
            replicas.under_replicated += role.under_replicated
            replicas.under_min_isr += role.under_min_isr
            replicas.high_watermarks[key] = (values["high_watermark"] if role.high_watermark is None
                                             else role.high_watermark)
        for replica, lag_records, lag_bytes in role.followers:
            series.append(("hpbroker_replica_lag_records", (*key, replica), lag_records))
            series.append(("hpbroker_replica_lag_bytes", (*key, replica), lag_bytes))
    for name, labels, value in series:
        families[name].add(labels, value)


@dataclass(frozen=True, slots=True)
class _Role:
    """A partition's replication figures in a stats file entry (``hpbroker.workers.stats``)."""

    leading: bool  # unreplicated (served here), or the replicated partition's leader
    high_watermark: int | None  # the replicated high watermark on its leader; None: unreplicated
    under_replicated: int
    under_min_isr: int
    followers: tuple[tuple[int, int, int], ...]  # (broker, lag in records, lag in bytes), on the leader
    fetch_failed: int = 0  # on a follower: 1 while its leader's range failed

    @classmethod
    def parse(cls, entry: Mapping[str, Any]) -> _Role:
        role = entry.get("role")
        if role is None:
            return cls(True, None, 0, 0, ())
        if role != "leader":
            return cls(False, None, 0, 0, (), int(entry.get("fetch_failed", 0)))
        followers = tuple((int(f["broker"]), int(f["lag_records"]), int(f["lag_bytes"]))
                          for f in entry.get("followers", ()))
        return cls(True, int(entry["replicated_high_watermark"]), int(entry.get("under_replicated", 0)),
                   int(entry.get("under_min_isr", 0)), followers)


def _request_name(api_key: int) -> str:
    return _REQUEST_NAMES.get(api_key, _UNKNOWN_REQUEST)


def _error_name(code: int) -> str:
    error = ERRORS_BY_CODE.get(code)
    return error.__name__ if error is not None else "Unknown"
