"""One loadgen run: the topic, the worker processes, the live display, the report and its files.

Order of events:

1. the topic: created if asked and missing (``hpbroker.client.Admin``), its partition count read;
2. consumer processes (each with its partitions, ``p mod consumers``), then producer processes,
   started with ``spawn``; each reports ready once its client is connected and positioned;
3. the start: ``t0`` written, the start event set; producers send, consumers read;
4. progress messages feed the :class:`~loadgen.report.Collector` and the live line on stderr;
5. e2e: once every producer is done, the consumers are stopped when they have read every record
   sent (or after ``drain_timeout_s``); consume: when they read ``records`` together;
6. every process is joined (terminated by PID if it overstays), the report built, the truth file,
   report file and plot written, the topic deleted if asked.

Ctrl-C sets the stop event: workers flush, report and end, and the report covers what was done.
Every wait here is bounded.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import queue
import secrets
import sys
import time
from typing import TextIO

from hpbroker.client import Admin
from hpbroker.errors import HPBrokerError
from loadgen.config import LoadConfig
from loadgen.consumer import ConsumerTask, consumer_main
from loadgen.producer import ProducerTask, producer_main
from loadgen.report import Collector, progress_line
from loadgen.truth import truth_document, write_truth
from loadgen.worker import WorkerLink

__all__ = ["LoadgenError", "run"]

_READY_TIMEOUT_S = 120.0
_JOIN_TIMEOUT_S = 15.0
_FINISH_GRACE_S = 180.0  # after the planned end: final flushes, reports


class LoadgenError(RuntimeError):
    """The run could not start (no broker, no topic, a worker that failed to boot)."""


def run(config: LoadConfig, *, stderr: TextIO | None = None) -> dict:
    """Run ``config``'s workload and return the report (also writing the files it names)."""
    stderr = sys.stderr if stderr is None else stderr
    run_id = secrets.randbits(32)
    seed = config.seed if config.seed is not None else secrets.randbits(31)
    partitions, created = _prepare_topic(config)
    collector = Collector(config, run_id)
    context = multiprocessing.get_context("spawn")
    link = WorkerLink(context.Queue(), context.Event(), context.Event(), context.Value("d", 0.0))
    processes: list = []
    consumers_started = 0
    try:
        if config.consuming:
            tasks = _consumer_tasks(config, run_id, partitions)
            consumers_started = len(tasks)
            processes += [context.Process(target=consumer_main, args=(task, link), daemon=True,
                                          name=f"loadgen-consumer-{task.index}") for task in tasks]
        if config.producing:
            processes += [context.Process(target=producer_main, args=(task, link), daemon=True,
                                          name=f"loadgen-producer-{task.index}")
                          for task in _producer_tasks(config, run_id, seed)]
        for process in processes:
            process.start()
        _wait_ready(link, collector, processes)
        link.t0.value = collector.t0 = time.time()
        link.start.set()
        _Monitor(config, link, collector, processes, consumers_started, stderr).watch()
    finally:
        link.stop.set()
        _join(processes)
        link.queue.close()
    report = collector.report(partitions=partitions, topic_created=created,
                              consumers_started=consumers_started)
    _write_outputs(config, report, collector, run_id)
    if config.delete_topic and created:
        with Admin(config.bootstrap, security=config.security()) as admin:
            admin.delete_topic(config.topic)
    return report


def _prepare_topic(config: LoadConfig) -> tuple[int, bool]:
    """``(partition count, created by this run)``."""
    try:
        admin = Admin(config.bootstrap, security=config.security())
    except Exception as e:
        raise LoadgenError(f"cannot reach the broker at {config.bootstrap}: {e}") from e
    with admin:
        try:
            created = False
            if config.topic not in admin.list_topics():
                if not config.create_topic:
                    raise LoadgenError(f"topic {config.topic!r} does not exist on {config.bootstrap} "
                                       "(--create-topic creates it)")
                admin.create_topic(config.topic, config.partitions, dict(config.topic_configs))
                created = True
            return len(admin.describe_topic(config.topic).partitions), created
        except HPBrokerError as e:  # a refused key or ACL above all: say so rather than a traceback
            raise LoadgenError(f"{config.bootstrap}: {e.message} ({type(e).__name__}, error {e.code})") from e


def _shares(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` integers that differ by one at most."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _producer_tasks(config: LoadConfig, run_id: int, seed: int) -> list[ProducerTask]:
    n = config.producers
    limits = _shares(config.records, n) if config.records is not None else [None] * n
    rate = None if config.rate is None else config.rate / n
    return [ProducerTask(i, f"loadgen-{run_id:08x}-{i}", run_id, config, rate, limits[i], seed + 7919 * i)
            for i in range(n)]


def _consumer_tasks(config: LoadConfig, run_id: int, partitions: int) -> list[ConsumerTask]:
    count = min(config.consumers, partitions)  # a consumer without partitions would idle
    limit = config.records if config.workload == "consume" else None
    return [ConsumerTask(i, run_id, config, tuple(p for p in range(partitions) if p % count == i), limit)
            for i in range(count)]


def _wait_ready(link: WorkerLink, collector: Collector, processes: list) -> None:
    ready: set[tuple[str, int]] = set()
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while len(ready) < len(processes):
        try:
            message = link.queue.get(timeout=0.2)
        except queue.Empty:
            dead = [p.name for p in processes if p.exitcode is not None]
            if dead or time.monotonic() > deadline:
                raise LoadgenError(f"workers did not start: {dead or 'timed out'}") from None
            continue
        if message["kind"] == "ready":
            ready.add((message["role"], message["index"]))
        elif message["kind"] == "failed":
            raise LoadgenError(f"{message['role']} {message['index']} failed to start: {message['error']}")
        else:
            collector.add(message)


class _Monitor:
    """The runner's loop after the start: messages in, live line out, stop decisions."""

    def __init__(self, config: LoadConfig, link: WorkerLink, collector: Collector, processes: list,
                 consumers: int, stderr: TextIO) -> None:
        self.config = config
        self.link = link
        self.collector = collector
        self.processes = processes
        self.producers = config.producers if config.producing else 0
        self.consumers = consumers
        self.stderr = stderr
        tty = getattr(stderr, "isatty", lambda: False)()
        self.live = config.progress == "lines" or (config.progress == "auto" and tty)
        self.refresh = config.progress == "auto" and tty
        self.shown_tick = 0
        self.producers_done_at: float | None = None

    def watch(self) -> None:
        config = self.config
        planned = config.effective_duration_s or config.max_duration_s
        hard_deadline = time.monotonic() + planned + config.drain_timeout_s + _FINISH_GRACE_S
        interrupted_at: float | None = None
        while self._finished() < len(self.processes) and time.monotonic() < hard_deadline:
            try:
                self._step()
            except KeyboardInterrupt:
                if interrupted_at is not None:
                    break  # a second Ctrl-C: stop waiting
                interrupted_at = time.monotonic()
                hard_deadline = min(hard_deadline, interrupted_at + 30.0)
                self.link.stop.set()
            if all(p.exitcode is not None for p in self.processes):
                self._drain_queue()
                break
        if self.refresh:
            self.stderr.write("\n")
            self.stderr.flush()

    def _finished(self) -> int:
        return len(self.collector.done) + len(self.collector.failed)

    def _step(self) -> None:
        with contextlib.suppress(queue.Empty):
            self.collector.add(self.link.queue.get(timeout=0.1))
        self._decide_stop()
        self._show()

    def _drain_queue(self) -> None:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                self.collector.add(self.link.queue.get(timeout=0.1))
            except queue.Empty:
                return

    def _decide_stop(self) -> None:
        config, collector = self.config, self.collector
        if self.link.stop.is_set() or not self.consumers:
            return
        if config.workload == "consume":
            if config.records is not None and sum(collector.consumed_records.values()) >= config.records:
                self.link.stop.set()
            return
        finished = [*collector.done, *collector.failed]
        producers_finished = sum(1 for (role, _) in finished if role == "producer")
        if producers_finished < self.producers:
            return
        now = time.monotonic()
        if self.producers_done_at is None:
            self.producers_done_at = now
        sent = sum(m["records"] for m in collector.finals("producer"))
        drained = sum(collector.run_records.values()) >= sent
        if drained or now - self.producers_done_at > config.drain_timeout_s:
            self.link.stop.set()

    def _show(self) -> None:
        if not self.live or self.collector.t0 is None:
            return
        elapsed = time.time() - self.collector.t0
        tick = int(elapsed / self.config.interval_s - 0.3)  # every worker has reported it by now
        if tick <= self.shown_tick or tick not in self.collector.ticks:
            return
        self.shown_tick = tick
        rows = {int(round(r["t_s"] / self.config.interval_s)): r for r in self.collector.timeline()}
        line = progress_line(rows[tick], self.config.workload, tick * self.config.interval_s)
        if self.refresh:
            self.stderr.write("\r" + line + "\x1b[K")
        else:
            self.stderr.write(line + "\n")
        self.stderr.flush()


def _join(processes: list) -> None:
    deadline = time.monotonic() + _JOIN_TIMEOUT_S
    for process in processes:
        if process.pid is None:
            continue
        process.join(max(0.1, deadline - time.monotonic()))
    for process in processes:
        if process.pid is not None and process.exitcode is None:
            process.terminate()  # our own child, by PID
            process.join(5.0)
            if process.exitcode is None:
                process.kill()
                process.join(5.0)


def _write_outputs(config: LoadConfig, report: dict, collector: Collector, run_id: int) -> None:
    producers = collector.finals("producer")
    if config.truth_path and config.producing:
        rows = [row for m in producers for row in m["truth"]]
        summaries = [{"producer": m["name"], "index": m["index"], "records": m["records"],
                      "bytes": m["bytes"], "failed": m["failed"]} for m in producers]
        write_truth(config.truth_path, truth_document(run_id, config.window_ms, summaries, rows))
        report["truth_file"] = config.truth_path
    if config.plot_path:
        from loadgen.plot import write_plot

        write_plot(config.plot_path, report)
        report["plot_file"] = config.plot_path
    if config.report_path:
        with open(config.report_path, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
