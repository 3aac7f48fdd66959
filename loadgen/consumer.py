"""A consumer process: reads its partitions, tallies every record, measures end-to-end latency.

It is assigned partitions ``p`` with ``p mod consumers == index`` (the runner lists them), seeks
each to the start or the end, and polls.  The consumer is made with ``columns=("value",)``: each
poll hands out a partition's records as columns (``hpbroker.client.columns``), decoded in
compiled code without a Python object per record.  The 24-byte headers at the start of the values
are gathered with numpy into one array (:data:`loadgen.payload.HEADER_DTYPE`), which feeds the
:class:`~loadgen.tally.Tally` and, in the e2e workload, the latency histogram: ``now -
send_time_ns``, with ``now`` the wall clock when ``poll`` returned.  Nothing is done per record
in Python.

With ``check`` off it only counts records and value bytes (a consumer's raw speed).

It stops at the deadline, at its record limit (the run's ``records``: exact with one consumer),
when ``until_end`` and every partition reached the end offset it had at the start, or on the
runner's stop event (checked at every tick and after every poll).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from hpbroker import Consumer, RecordColumns, TopicPartition
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


def parse_headers(records: RecordColumns, count: int) -> tuple[np.ndarray, int]:
    """``(headers, records without one)`` of the first ``count`` records, in offset order: the
    first :data:`HEADER_BYTES` of every value at least that long (a null value has none)."""
    values = records.values
    assert values is not None, "the consumer decodes the value column"
    offsets = values.offsets[:count + 1]
    lengths = np.diff(offsets)
    size = int(lengths[0]) if count else 0
    if size >= HEADER_BYTES and (lengths == size).all():  # one size (loadgen's default): a 2-D view
        base = int(offsets[0])
        rows = values.data[base:base + count * size].reshape(count, size)[:, :HEADER_BYTES]
        return np.ascontiguousarray(rows).view(HEADER_DTYPE).reshape(count), 0
    kept = lengths >= HEADER_BYTES
    starts = offsets[:-1][kept]
    rows = values.data[starts[:, None] + np.arange(HEADER_BYTES, dtype=starts.dtype)]
    return rows.view(HEADER_DTYPE).reshape(len(starts)), count - len(starts)


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
        consumer = Consumer(config.bootstrap, auto_offset_reset=config.consumer_start, columns=("value",),
                            fetch_max_wait_ms=config.fetch_max_wait_ms,
                            max_partition_fetch_bytes=config.max_partition_fetch_bytes,
                            fetch_via=config.fetch_via,
                            client_id=f"loadgen-consumer-{task.index}", security=config.security())
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
                self._handle(tp.partition, records, now_ns, limit)

    def _handle(self, partition: int, records: RecordColumns, now_ns: int, limit: int | None) -> None:
        n = len(records) if limit is None else min(len(records), limit - self.records)
        if n <= 0:
            return
        if self.first_record_wall is None:
            self.first_record_wall = now_ns / 1e9
        self.last_record_wall = time.time()
        values = records.values
        assert values is not None, "the consumer decodes the value column"
        nbytes = int(values.offsets[n] - values.offsets[0])
        if self.config.check:
            headers, headerless = parse_headers(records, n)
            self.tally.foreign += headerless
            self.tally.add(partition, headers)
            if self.e2e and headers.size:
                mine = (headers["magic"] == MAGIC_U16) & (headers["run_id"] == self.task.run_id)
                if not mine.all():
                    headers = headers[mine]
                self.interval_latency.record_array(now_ns - headers["send_time_ns"].astype(np.int64))
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

