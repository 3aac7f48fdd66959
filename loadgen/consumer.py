"""A consumer process: reads its partitions, tallies every record, measures end-to-end latency.

It is assigned partitions ``p`` with ``p mod consumers == index`` (the runner lists them), seeks
each to the start or the end, and polls.  Each partition's list of records is handled at once:
the 24-byte headers of all its values are joined into one buffer and read as a numpy array
(:data:`loadgen.payload.HEADER_DTYPE`), which feeds the :class:`~loadgen.tally.Tally` and, in the
e2e workload, the latency histogram: ``now - send_time_ns``, with ``now`` the wall clock when
``poll`` returned the list.  Python work per record is the header slice alone.

With ``check`` off it only counts records and value bytes (a consumer's raw speed).

It stops at the deadline, at its record limit (the run's ``records``: exact with one consumer),
when ``until_end`` and every partition reached the end offset it had at the start, or on the
runner's stop event (checked at every tick and after every poll).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from hpbroker import Consumer, TopicPartition
from loadgen.config import LoadConfig
from loadgen.histogram import Histogram
from loadgen.payload import HEADER_BYTES, HEADER_DTYPE, MAGIC_U16
from loadgen.tally import Tally
from loadgen.worker import WorkerLink, run_worker

__all__ = ["ConsumerTask", "consumer_main", "parse_headers"]

_POLL_MS = 100
_ERROR_BACKOFF_S = 0.1


@dataclass(frozen=True)
class ConsumerTask:
    index: int
    run_id: int  # the run whose records count as the e2e run's (consume: any run)
    config: LoadConfig
    partitions: tuple[int, ...]
    limit: int | None


def consumer_main(task: ConsumerTask, link: WorkerLink) -> None:
    """Entry point of a consumer process."""
    run_worker("consumer", task.index, link, lambda: _ConsumerRun(task, link).run())


def parse_headers(records: list) -> tuple[np.ndarray, int, int]:
    """``(headers of the records that have one, value bytes of all, records without one)``."""
    values = [r.value for r in records]
    try:
        joined = b"".join([v[:HEADER_BYTES] for v in values])
        nbytes = sum(map(len, values))
    except TypeError:  # a null value (tombstone)
        joined = None
    if joined is not None and len(joined) == HEADER_BYTES * len(values):
        return np.frombuffer(joined, dtype=HEADER_DTYPE), nbytes, 0
    nbytes = sum(len(v) for v in values if v is not None)
    kept = [v[:HEADER_BYTES] for v in values if v is not None and len(v) >= HEADER_BYTES]
    return np.frombuffer(b"".join(kept), dtype=HEADER_DTYPE), nbytes, len(values) - len(kept)


class _ConsumerRun:
    def __init__(self, task: ConsumerTask, link: WorkerLink) -> None:
        self.task = task
        self.link = link
        self.config = task.config
        self.e2e = self.config.workload == "e2e"
        self.tally = Tally(task.run_id if self.e2e else None)
        self.total_latency = Histogram()
        self.interval_latency = Histogram()
        self.records = self.bytes = self.errors = 0  # every record read (foreign too)
        self.interval = {"records": 0, "bytes": 0, "errors": 0}
        self.first_record_wall: float | None = None
        self.last_record_wall: float | None = None
        self.first_error: str | None = None

    def run(self) -> None:
        config, task = self.config, self.task
        consumer = Consumer(config.bootstrap, auto_offset_reset=config.consumer_start,
                            fetch_max_wait_ms=config.fetch_max_wait_ms,
                            max_partition_fetch_bytes=config.max_partition_fetch_bytes,
                            client_id=f"loadgen-consumer-{task.index}")
        try:
            tps = [TopicPartition(config.topic, p) for p in task.partitions]
            consumer.assign(tps)
            if config.consumer_start == "latest":
                consumer.seek_to_end()
            else:
                consumer.seek_to_beginning()
            positions = {tp: consumer.position(tp) for tp in tps}
            ends = consumer.end_offsets(tps) if config.until_end else None
            self.link.put("consumer", task.index, "ready",
                          positions={tp.partition: offset for tp, offset in positions.items()})
            start = self.link.wait_for_start()
            if start is None:
                return
            started_wall = time.time()
            self._poll_loop(consumer, start, ends)
        finally:
            consumer.close()
        tick = int((time.monotonic() - start) / config.interval_s) + 1
        self._report_interval(tick)
        self.link.put("consumer", task.index, "done", records=self.records, bytes=self.bytes,
                      errors=self.errors, first_error=self.first_error, started=started_wall,
                      first_record=self.first_record_wall, last_record=self.last_record_wall,
                      e2e_latency=self.total_latency.to_sparse(), tally=self.tally.export(),
                      checked=config.check)

    def _poll_loop(self, consumer: Consumer, start: float, ends: dict | None) -> None:
        config = self.config
        duration = config.effective_duration_s
        deadline = start + (duration if duration is not None else config.max_duration_s)
        if self.e2e:  # consumers outlive the producers until the runner says all is read
            deadline += config.drain_timeout_s + 5.0
        interval = config.interval_s
        next_tick = start + interval
        limit = self.task.limit
        while True:
            now = time.monotonic()
            if now >= next_tick:
                tick = int((now - start) / interval)
                self._report_interval(tick)
                next_tick = start + (tick + 1) * interval
            if now >= deadline or self.link.stop.is_set() or (limit is not None and self.records >= limit):
                return
            if ends is not None and all(consumer.position(tp) >= end for tp, end in ends.items()):
                return
            try:
                batches = consumer.poll(timeout_ms=max(1, min(_POLL_MS, int((next_tick - now) * 1000) + 1)))
            except Exception as e:  # a partition's fetch error: count it, back off, go on
                self.errors += 1
                self.interval["errors"] += 1
                self.first_error = self.first_error or f"{type(e).__name__}: {e}"
                time.sleep(_ERROR_BACKOFF_S)
                continue
            if not batches:
                continue
            now_ns = time.time_ns()
            for tp, records in batches.items():
                if limit is not None and self.records + len(records) > limit:
                    records = records[:limit - self.records]
                self._handle(tp.partition, records, now_ns)

    def _handle(self, partition: int, records: list, now_ns: int) -> None:
        if not records:
            return
        if self.first_record_wall is None:
            self.first_record_wall = now_ns / 1e9
        self.last_record_wall = time.time()
        if self.config.check:
            headers, nbytes, headerless = parse_headers(records)
            self.tally.foreign += headerless
            self.tally.add(partition, headers)
            if self.e2e and headers.size:
                mine = (headers["magic"] == MAGIC_U16) & (headers["run_id"] == self.task.run_id)
                if not mine.all():
                    headers = headers[mine]
                self.interval_latency.record_array(now_ns - headers["send_time_ns"].astype(np.int64))
        else:
            nbytes = sum(len(r.value) for r in records if r.value is not None)
        n = len(records)
        self.records += n
        self.bytes += nbytes
        self.interval["records"] += n
        self.interval["bytes"] += nbytes

    def _report_interval(self, tick: int) -> None:
        self.link.put("consumer", self.task.index, "progress", tick=tick, **self.interval,
                      run_records=self.tally.records if self.config.check else self.records,
                      latency=self.interval_latency.to_sparse())
        self.total_latency.merge(self.interval_latency)
        self.interval_latency.reset()
        self.interval = {"records": 0, "bytes": 0, "errors": 0}
