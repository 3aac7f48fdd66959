"""A producer process: sends numbered records at the paced rate, measures acknowledgements.

The loop, per chunk (at most ``chunk_records`` records, as many as the :class:`~loadgen.pacing.
Pacer` says are due): take the wall clock once, build the chunk's values (header with this
producer's index, the run id, consecutive sequence numbers and that time; see
:mod:`loadgen.payload`), draw their keys, and hand them to ``Producer.send_many`` with the
chunk's timestamp, all but the last; the last goes through ``send(..., callback=...)``, so each
chunk yields one produce-ack latency sample (send to acknowledgement of its last record) without
a callback per record.  The chunk's records are counted in the ground truth window of that
timestamp.

At the end (duration over, record limit reached, or the runner's stop event) it flushes, closes the
producer and reports its totals (with the records the broker said it had already stored, from
``Producer.metrics``), its ack latency histogram and its truth windows.
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass

import numpy as np

from hpbroker import Producer
from loadgen.config import LoadConfig
from loadgen.histogram import Histogram
from loadgen.pacing import Pacer
from loadgen.payload import KeyChooser, PayloadSource
from loadgen.truth import TruthWindows
from loadgen.worker import ClientLogCounter, WorkerLink, run_worker

__all__ = ["ProducerTask", "producer_main"]

_FLUSH_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ProducerTask:
    index: int
    name: str  # the hpbroker producer name: in every batch header, the audit's key
    run_id: int
    config: LoadConfig
    rate: float | None  # this producer's share
    limit: int | None  # this producer's share of the record count
    seed: int


def producer_main(task: ProducerTask, link: WorkerLink) -> None:
    """Entry point of a producer process."""
    run_worker("producer", task.index, link, lambda: _ProducerRun(task, link).run())


def _metric(producer: Producer | None, name: str) -> int | None:
    """One of the producer's ``metrics`` counts (``records_deduplicated``: records the broker
    acknowledged as already stored; ``retries``: requests sent again); None when the client does
    not count it."""
    metrics = getattr(producer, "metrics", None)
    if callable(metrics):
        metrics = metrics()
    if not isinstance(metrics, dict):
        return None
    value = metrics.get(name)
    return value if isinstance(value, int) else None


class _ProducerRun:
    def __init__(self, task: ProducerTask, link: WorkerLink) -> None:
        self.task = task
        self.link = link
        self.config = task.config
        self.counter = ClientLogCounter()
        self.counter.attach()
        self.acks: collections.deque[tuple[int, int, bool]] = collections.deque()  # from the I/O thread
        self.total_latency = Histogram()
        self.interval_latency = Histogram()
        self.truth = TruthWindows(self.config.window_ms)
        self.sent = self.sent_bytes = self.acked = self.send_errors = 0
        self.interval = {"records": 0, "bytes": 0, "acked": 0}
        self.reported_failed = self.reported_retries = 0
        self.start = 0.0
        self.max_lag_s = 0.0
        self.producer: Producer | None = None

    def run(self) -> None:
        config, task = self.config, self.task
        source = PayloadSource(config.record_size, config.payload, task.index, task.run_id, task.seed)
        keys = KeyChooser(config.keys, np.random.default_rng(task.seed + 1))
        producer = self.producer = Producer(config.bootstrap, name=task.name, security=config.security(),
                                                   **config.producer_options())
        first_error = None
        deduplicated = None
        try:
            self.link.put("producer", task.index, "ready")
            start = self.start = self.link.wait_for_start()
            if start is None:
                return
            started_wall = time.time()
            first_error = self._send_loop(producer, source, keys, start)
            send_end_wall = time.time()
            try:
                producer.flush(_FLUSH_TIMEOUT_S)
            except Exception as e:  # failures are counted from the client's log; keep the first
                first_error = first_error or f"{type(e).__name__}: {e}"
            end_wall = time.time()  # every record acknowledged or failed
            deduplicated = _metric(producer, "records_deduplicated")
        finally:
            try:
                producer.close(_FLUSH_TIMEOUT_S)
            except Exception as e:
                first_error = first_error or f"{type(e).__name__}: {e}"
        self._report_interval(int((time.monotonic() - self.start) / self.config.interval_s) + 1)
        self.link.put("producer", task.index, "done", name=task.name, run_id=task.run_id,
                      records=self.sent, bytes=self.sent_bytes, acked=self.acked,
                      failed=self.counter.failed_records + self.send_errors, retries=self._retries(),
                      deduplicated=deduplicated,
                      first_error=first_error or self.counter.first_error, started=started_wall,
                      send_ended=send_end_wall, ended=end_wall, max_lag_s=self.max_lag_s,
                      ack_latency=self.total_latency.to_sparse(),
                      truth=self.truth.rows(task.name, task.index))

    def _send_loop(self, producer: Producer, source: PayloadSource, keys: KeyChooser,
                   start: float) -> str | None:
        config, task = self.config, self.task
        pacer = Pacer(task.rate, start, limit=task.limit, max_chunk=config.chunk_records,
                      pace_s=config.pace_ms / 1000)
        duration = config.effective_duration_s
        deadline = start + (duration if duration is not None else config.max_duration_s)
        interval = config.interval_s
        tick = 1
        next_tick = start + interval
        topic = config.topic
        first_error = None
        while True:
            now = time.monotonic()
            if now >= next_tick:
                self._report_interval(tick)
                tick = int((now - start) / interval) + 1
                next_tick = start + tick * interval
                if self.link.stop.is_set():
                    break
            if now >= deadline:
                break
            n, wait_s = pacer.next(now)
            if n == 0:
                if math.isinf(wait_s):
                    break  # the record limit is reached
                time.sleep(min(wait_s, next_tick - now, deadline - now) if wait_s > 0 else 0)
                continue
            send_ns = time.time_ns()
            timestamp_ms = send_ns // 1_000_000
            values, nbytes = source.build(pacer.sent_total, n, send_ns)
            key_list = keys.draw(n)
            sent_at = time.perf_counter_ns()
            try:
                if n > 1:
                    producer.send_many(topic, values[:-1], None if key_list is None else key_list[:-1],
                                       timestamp=timestamp_ms)
                producer.send(topic, values[-1], None if key_list is None else key_list[-1],
                              timestamp=timestamp_ms, callback=self._callback(sent_at, n))
            except Exception as e:  # the chunk counts as sent (numbers are used) and failed
                self.send_errors += n
                first_error = first_error or f"{type(e).__name__}: {e}"
                if type(e).__name__ in ("UnknownTopicOrPartitionError", "ProducerClosedError"):
                    pacer.sent(n)
                    self._count(n, nbytes, timestamp_ms)
                    break
            pacer.sent(n)
            self._count(n, nbytes, timestamp_ms)
        self.max_lag_s = pacer.max_lag_s
        return first_error

    def _count(self, n: int, nbytes: int, timestamp_ms: int) -> None:
        self.sent += n
        self.sent_bytes += nbytes
        self.interval["records"] += n
        self.interval["bytes"] += nbytes
        self.truth.add(self.config.topic, timestamp_ms, n, nbytes)

    def _callback(self, sent_at: int, n: int):
        acks = self.acks

        def acknowledged(metadata, error, sent_at=sent_at, n=n):
            acks.append((time.perf_counter_ns() - sent_at, n, error is None))

        return acknowledged

    def _drain_acks(self) -> None:
        acks = self.acks
        latencies = []
        while acks:
            latency, n, ok = acks.popleft()
            if ok:
                latencies.append(latency)
                self.acked += n
                self.interval["acked"] += n
        if latencies:
            self.interval_latency.record_array(latencies)

    def _retries(self) -> int:
        """Requests sent again: the producer's count, or where it has none, its log's."""
        counted = _metric(self.producer, "retries")
        return self.counter.retries if counted is None else counted

    def _report_interval(self, tick: int) -> None:
        """Send this interval's counts and start the next."""
        self._drain_acks()
        failed, retries = self.counter.failed_records + self.send_errors, self._retries()
        self.link.put("producer", self.task.index, "progress", tick=tick, **self.interval,
                      failed=failed - self.reported_failed, retries=retries - self.reported_retries,
                      latency=self.interval_latency.to_sparse())
        self.reported_failed, self.reported_retries = failed, retries
        self.total_latency.merge(self.interval_latency)
        self.interval_latency.reset()
        self.interval = {"records": 0, "bytes": 0, "acked": 0}


