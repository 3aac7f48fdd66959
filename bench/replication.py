"""Replication on one machine: replicated produce against unreplicated produce, and failover times.

Run with ``make bench`` (after the scenarios), alone with ``make bench-replication``, or::

    .venv/bin/python -m bench.replication                          # 3 rounds, 3 failovers per event
    .venv/bin/python -m bench.replication --rounds 1 --repeat 1 --kill-sessions 2000

Everything runs on this machine, in a temporary directory removed at the end: a ZooKeeper of its
own (``hpbroker.coord.server.ZooKeeperServer``) and, per ZooKeeper session timeout measured, a
cluster of three brokers (``hpbroker serve --workers 1`` each: three brokers on two cores, one
worker apiece; ``bench.cluster``), each in its own chroot.  Producers and consumers are the public
client, in this process.

**Produce.**  The first cluster runs, in ``--rounds`` interleaved rounds (``bench.idempotence``:
each round runs both sides once, in an order rotated by one each round, after an untimed warm-up),
one producer sending ``--value-bytes`` values (100) as fast as it goes for ``--duration`` seconds
into a fresh one-partition topic, deleted afterwards:

- *unreplicated*: a topic created without a replication factor (stored whole on broker 0),
  ``acks=1``;
- *replicated*: the same with ``--replication-factor 3`` and ``min_insync_replicas`` 2,
  ``acks="all"`` (answered once all three replicas have the records fdatasync'd).

Same producer settings on both sides (the client's defaults: idempotent, linger 5 ms, 1 MiB
batches, 5 requests in flight; ``send_many`` chunks of 1,000 values, the last of each chunk sent
with a callback for the ack latency).  A side's rate is the records acknowledged over the time
from the first send to the end of the final ``flush``.  The figure: replicated / unreplicated,
from the medians and per round (target >= 0.5).

**Failover.**  A topic of one partition, R = 3, ``min_insync_replicas`` 2.  Each repetition
waits until the partition is led by its preferred replica with all three in the ISR, starts an
``acks="all"`` producer (one 100-byte record every 2 ms, linger 0, client defaults otherwise)
and a consumer reading the partition's tail, both bootstrapped on the two other brokers, then
takes the leader away and times, from that moment:

- *elected*: the partition's state node names a new leader (a ZooKeeper watch of this process);
- *acknowledged*: the first ``acks=all`` write the new leader acknowledged: an acknowledgement
  received after the old leader was gone whose offset is at or past the start of the new leader
  epoch (read from the new leader's ``leader-epoch-checkpoint``), or that the new leader
  deduplicated, or that arrived once the old leader's process had exited;
- *read*: the first record the consumer got from the new leader (same rule, without dedup).

Events: the leader's broker SIGTERM'd (a graceful stop, which closes its ZooKeeper session) on
the first cluster, and SIGKILL'd (arbiter and workers at once: a machine gone) on each cluster
(``--kill-sessions``, default 6000 and 2000 ms of ``zookeeper_session_timeout_ms``).  Then the
broker is started again; once it is back in the ISR the controller moves leadership back to it
(``auto_leader_rebalance``, checked every 5 s): *move back* times that controlled move, from the
state node naming it leader again to the first write it acknowledged and the first record read
from it.  Each figure: median and max over ``--repeat`` repetitions.

Results: ``bench/results/replication.{json,md}`` (the table, also printed).  The machine is
shared: each figure is a median and a range.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from kazoo.client import KazooClient
from kazoo.recipe.watchers import DataWatch

from bench.cluster import LocalCluster
from bench.idempotence import Variant, interleave, relative_change, spread
from bench.scenarios import machine
from hpbroker.client import Admin, Consumer, Producer, TopicPartition
from hpbroker.coord.partition_state import PartitionState, decode_state
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.server import ZooKeeperServer
from hpbroker.io.leader_epochs import LEADER_EPOCH_FILE_NAME

__all__ = ["main"]

RESULTS = Path(__file__).resolve().parent / "results"
BROKERS = (0, 1, 2)
RATIO_TARGET = 0.5
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
FAILOVER_TOPIC = "failover"
CHUNK_RECORDS = 1000
FLUSH_TIMEOUT_S = 120.0
WAIT_S = 90.0  # the longest any one step of a failover may take before the run fails
WRITE_INTERVAL_S = 0.002
# ``audit_topic`` None: no monitoring events, only the measured records (both sides alike).
PRODUCER_SETTINGS = {"audit_topic": None}

UNREPLICATED = Variant("unreplicated, acks=1", "r1-acks1", (("replication_factor", None), ("acks", 1)))
REPLICATED = Variant("R=3, min_insync_replicas 2, acks=all", "r3-acksall",
                     (("replication_factor", 3), ("acks", "all")))


@dataclass(frozen=True, slots=True)
class Settings:
    rounds: int
    duration_s: float
    max_records: int
    value_bytes: int
    repeat: int
    kill_sessions_ms: tuple[int, ...]


# --- produce: replicated against unreplicated ------------------------------------------------------


def _wait(predicate: Callable[[], object], timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.05)


def create_topic(cluster: LocalCluster, name: str, replication_factor: int | None) -> None:
    """Create ``name`` (one partition) through broker 0; return once it has a leader (and, when
    replicated, every replica in its ISR)."""
    with Admin(cluster.bootstrap(0)) as admin:
        if replication_factor is None:
            admin.create_topic(name, 1)
        else:
            admin.create_topic(name, 1, {"min_insync_replicas": 2}, replication_factor=replication_factor)

        def ready() -> bool:
            partition = admin.describe_topic(name).partitions[0]
            wanted = 1 if replication_factor is None else replication_factor
            return partition.leader >= 0 and len(partition.isr or [partition.leader]) == wanted
        _wait(ready, 60, f"a leader and a full ISR for {name}")


def produce_once(bootstrap: str, topic: str, acks: int | str, settings: Settings, duration_s: float) -> dict:
    """One producer as fast as it goes for ``duration_s`` (at most ``max_records``); its figures."""
    shape = (CHUNK_RECORDS - 1, settings.value_bytes)
    values = np.random.default_rng().integers(0, 256, shape, dtype=np.uint8)
    last = bytes(settings.value_bytes)
    latencies_ms: list[float] = []
    errors: list[BaseException] = []

    def acknowledged(sent_ns: int, metadata: object, error: BaseException | None) -> None:
        if error is not None:
            errors.append(error)
        else:
            latencies_ms.append((time.perf_counter_ns() - sent_ns) / 1e6)

    with Producer(bootstrap, acks=acks, **PRODUCER_SETTINGS) as producer:
        started = time.perf_counter()
        sent = 0
        while sent < settings.max_records and time.perf_counter() - started < duration_s:
            sent += producer.send_many(topic, values, partition=0)
            sent_ns = time.perf_counter_ns()
            producer.send(topic, last, partition=0,
                          callback=lambda m, e, s=sent_ns: acknowledged(s, m, e))
            sent += 1
        producer.flush(FLUSH_TIMEOUT_S)
        elapsed = time.perf_counter() - started
        metrics = producer.metrics
    if errors:
        raise RuntimeError(f"produce to {topic}: {len(errors)} chunks failed, first: {errors[0]!r}")
    acked = metrics.get("records_acknowledged", sent)
    latencies = sorted(latencies_ms) or [0.0]
    return {"records": acked, "seconds": round(elapsed, 3), "records_per_s": acked / elapsed,
            "mb_per_s": acked * settings.value_bytes / elapsed / 1e6,
            "ack_p50_ms": latencies[len(latencies) // 2],
            "ack_p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
            "retries": metrics.get("retries")}


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def cpu_by_process(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds so far of this process (the clients) and of each broker (arbiter and workers)."""
    used = {"clients": _cpu_seconds(os.getpid())}
    for broker_id, node in sorted(cluster.nodes.items()):
        pids = (node.process.pid, *node.worker_pids())
        used[f"broker {broker_id}"] = sum(_cpu_seconds(pid) for pid in pids)
    return used


def disk_ceiling(directory: Path, seconds: float = 2.0, chunk_bytes: int = 4 << 20) -> dict:
    """MB/s of ``write`` + ``fdatasync`` of ``chunk_bytes`` chunks in ``directory``: one writer
    (what an unreplicated leader needs), then three at once (what R = 3 on one machine needs:
    every replica fdatasyncs every record, so one disk takes three times the bytes)."""
    chunk = os.urandom(chunk_bytes)

    def write(index: int, results: list[float]) -> None:
        path = directory / f"disk-probe-{index}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            started, written = time.perf_counter(), 0
            while time.perf_counter() - started < seconds:
                os.write(fd, chunk)
                os.fdatasync(fd)
                written += chunk_bytes
            results.append(written / (time.perf_counter() - started) / 1e6)
        finally:
            os.close(fd)
            path.unlink()

    figures = {}
    for writers in (1, 3):
        results: list[float] = []
        threads = [threading.Thread(target=write, args=(i, results)) for i in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        figures[f"{writers}_writers_mb_per_s"] = sum(results)
    return figures


def produce_comparison(cluster: LocalCluster, settings: Settings) -> dict:
    """Both sides, interleaved over ``rounds`` rounds after an untimed warm-up of each."""
    count = iter(range(1, 1_000_000))

    def measure(variant: Variant, duration_s: float = settings.duration_s) -> dict:
        options = variant.options
        topic = f"produce-{variant.slug}-{next(count)}"
        create_topic(cluster, topic, options["replication_factor"])
        before = cpu_by_process(cluster)
        figures = produce_once(cluster.bootstrap(0, 1, 2), topic, options["acks"], settings, duration_s)
        after = cpu_by_process(cluster)
        millions = max(figures["records"], 1) / 1e6
        used = {name: after[name] - before.get(name, 0.0) for name in after}
        figures["cpu_s_per_million"] = {name: seconds / millions for name, seconds in used.items()}
        figures["cpu_cores"] = sum(used.values()) / figures["seconds"]
        stored = sum(path.stat().st_size for path in cluster.root.glob(f"data-*/**/{topic}-0/*.log"))
        figures["stored_bytes_per_record"] = stored / max(figures["records"], 1)
        with Admin(cluster.bootstrap(0)) as admin:
            admin.delete_topic(topic)
        _note(f"produce {variant.label}", figures)
        return figures

    disk = disk_ceiling(cluster.root)
    _note("disk", disk)
    for variant in (UNREPLICATED, REPLICATED):
        measure(variant, min(2.0, settings.duration_s))
    results = interleave((UNREPLICATED, REPLICATED), settings.rounds, measure)
    plain = [r["records_per_s"] for r in results[UNREPLICATED.label]]
    replicated = [r["records_per_s"] for r in results[REPLICATED.label]]
    change = relative_change(replicated, plain)
    ratio = statistics.median(replicated) / statistics.median(plain)
    stored = statistics.median(r["stored_bytes_per_record"] for r in results[REPLICATED.label])
    stored_plain = statistics.median(r["stored_bytes_per_record"] for r in results[UNREPLICATED.label])
    ceiling_records = disk["3_writers_mb_per_s"] * 1e6 / max(stored, 1.0)
    ceiling = {"replicated_mb_per_s": statistics.median(replicated) * stored / 1e6,
               "unreplicated_mb_per_s": statistics.median(plain) * stored_plain / 1e6,
               "records_per_s": ceiling_records, "ratio": ceiling_records / statistics.median(plain)}
    return {"variants": results, "ratio_of_medians": ratio, "disk_ceiling": ceiling,
            "ratio_per_round": [r / p for r, p in zip(replicated, plain, strict=True)],
            "percent_change": change, "target": RATIO_TARGET, "met": ratio >= RATIO_TARGET, "disk": disk}


# --- failover ------------------------------------------------------------------------------------


class StateWatch:
    """Every state the partition's state node took, with the monotonic time this process saw it."""

    def __init__(self, client: KazooClient, paths: ZkPaths, topic: str, partition: int) -> None:
        self.changes: list[tuple[float, PartitionState]] = []
        self._condition = threading.Condition()
        DataWatch(client, paths.partition_state(topic, partition), self._changed)

    def _changed(self, data: bytes | None, stat: object) -> None:
        if data:
            with self._condition:
                self.changes.append((time.monotonic(), decode_state(data)))
                self._condition.notify_all()

    def wait(self, predicate: Callable[[PartitionState], bool], *, after: float = 0.0,
             timeout_s: float = WAIT_S, what: str = "a partition state") -> tuple[float, PartitionState]:
        """The first ``(seen_at, state)`` seen at or after ``after`` that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout_s
        with self._condition:
            while True:
                found = next(((t, s) for t, s in self.changes if t >= after and predicate(s)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}; states "
                                       f"seen: {[s for _, s in self.changes[-5:]]}")
                self._condition.wait(left)


class Timeline(threading.Thread):
    """A client in a thread of its own, noting ``(monotonic time, offset, deduplicated)`` of
    every record acknowledged (writer) or read (reader) until :meth:`finish`."""

    def __init__(self, bootstrap: str, topic: str, *, writer: bool) -> None:
        super().__init__(daemon=True, name=f"bench-{'writer' if writer else 'reader'}")
        self.bootstrap, self.topic, self.writer = bootstrap, topic, writer
        self.events: list[tuple[float, int, bool]] = []
        self.errors: list[str] = []
        self._finishing = threading.Event()

    def run(self) -> None:
        try:
            self._write() if self.writer else self._read()
        except BaseException as e:  # reported by finish()
            self.errors.append(repr(e))

    def _acknowledged(self, metadata: object, error: BaseException | None) -> None:
        if error is not None:
            self.errors.append(repr(error))
        else:
            self.events.append((time.monotonic(), metadata.offset, metadata.deduplicated))

    def _write(self) -> None:
        value = bytes(100)
        with Producer(self.bootstrap, acks="all", linger_ms=0, **PRODUCER_SETTINGS) as producer:
            while not self._finishing.wait(WRITE_INTERVAL_S):
                producer.send(self.topic, value, partition=0, callback=self._acknowledged)
            producer.flush(FLUSH_TIMEOUT_S)

    def _read(self) -> None:
        tp = TopicPartition(self.topic, 0)
        with Consumer(self.bootstrap, fetch_max_wait_ms=100) as consumer:
            consumer.assign([tp])
            consumer.seek_to_end(tp)
            while not self._finishing.is_set():
                for records in consumer.poll(100).values():
                    now = time.monotonic()
                    self.events.extend((now, record.offset, False) for record in records)

    def first(self, accept: Callable[[float, int, bool], bool]) -> float | None:
        return next((t for t, offset, dedup in list(self.events) if accept(t, offset, dedup)), None)

    def finish(self) -> list[str]:
        self._finishing.set()
        self.join(FLUSH_TIMEOUT_S + 10)
        return self.errors


def epoch_start(directory: Path, epoch: int, timeout_s: float = WAIT_S) -> int:
    """The offset where ``epoch`` began in the replica whose partition directory is ``directory``
    (its ``leader-epoch-checkpoint``: version, count, then ``epoch start_offset`` lines)."""
    path = directory / LEADER_EPOCH_FILE_NAME

    def read() -> int | None:
        try:
            lines = path.read_text().split("\n")[2:]
        except OSError:
            return None
        for line in lines:
            fields = line.split()
            if len(fields) == 2 and int(fields[0]) == epoch:
                return int(fields[1]) + 1  # + 1: never 0, so that the wait ends (undone below)
        return None
    return _wait(read, timeout_s, f"leader epoch {epoch} in {path}") - 1


def failover_once(cluster: LocalCluster, watch: StateWatch, preferred: int, event: str) -> dict:
    """One failover (``event``: "sigterm" or "kill") of the partition led by broker ``preferred``,
    then the move back to it; figures in seconds."""
    _, state = watch.wait(lambda s: s.leader == preferred and len(s.isr) == 3,
                          timeout_s=WAIT_S, what="the preferred leader with a full ISR")
    old = state.leader
    survivors = [b for b in BROKERS if b != old]
    bootstrap = cluster.bootstrap(*survivors, old)
    writer = Timeline(bootstrap, FAILOVER_TOPIC, writer=True)
    reader = Timeline(bootstrap, FAILOVER_TOPIC, writer=False)
    writer.start()
    reader.start()
    try:
        _wait(lambda: len(writer.events) >= 100 and reader.events or writer.errors or reader.errors,
              WAIT_S, "records acknowledged and read before the leader goes")
        exited: list[float] = []
        gone_at = time.monotonic()
        node = cluster.terminate(old) if event == "sigterm" else cluster.kill(old)
        threading.Thread(target=lambda n=node: (n.wait(), exited.append(time.monotonic())),
                         daemon=True).start()
        elected_at, state = watch.wait(lambda s: s.leader not in (old, -1), after=gone_at,
                                       what="a new leader")
        start = epoch_start(cluster.data_dir(state.leader) / f"{FAILOVER_TOPIC}-0", state.leader_epoch)

        def from_new_leader(t: float, offset: int, dedup: bool) -> bool:
            return t > gone_at and (offset >= start or dedup or bool(exited) and t > exited[0])
        acked_at = _wait(lambda: writer.first(from_new_leader) or writer.errors, WAIT_S,
                         "an acknowledgement from the new leader")
        read_at = _wait(lambda: reader.first(lambda t, o, _d: from_new_leader(t, o, False)) or reader.errors,
                        WAIT_S, "a record read from the new leader")
        _wait(lambda: exited, WAIT_S, "the old leader's exit")
        figures = {"event": event, "old_leader": old, "new_leader": state.leader,
                   "leader_epoch": state.leader_epoch, "elected_s": elected_at - gone_at,
                   "acked_s": acked_at - gone_at if not writer.errors else None,
                   "read_s": read_at - gone_at if not reader.errors else None}
        figures.update(_move_back(cluster, watch, old, writer, reader))
    finally:
        figures_errors = {"writer_errors": writer.finish(), "reader_errors": reader.finish()}
    figures.update(figures_errors)
    if figures["writer_errors"]:
        raise RuntimeError(f"{event}: the acks=all producer failed: {figures['writer_errors'][:3]}")
    _note(event, figures)
    return figures


def _move_back(cluster: LocalCluster, watch: StateWatch, broker_id: int, writer: Timeline,
               reader: Timeline) -> dict:
    """Start ``broker_id`` again and time the controller's move of leadership back to it."""
    restarted_at = time.monotonic()
    cluster.start(broker_id)
    moved_at, state = watch.wait(lambda s: s.leader == broker_id, after=restarted_at,
                                 what=f"leadership back on broker {broker_id}")
    start = epoch_start(cluster.data_dir(broker_id) / f"{FAILOVER_TOPIC}-0", state.leader_epoch)
    acked_at = _wait(lambda: writer.first(lambda t, o, _d: t >= moved_at and o >= start) or writer.errors,
                     WAIT_S, "an acknowledgement from the preferred leader")
    read_at = None
    if not reader.errors:  # a consumer that gave up earlier reads nothing more
        read_at = _wait(lambda: reader.first(lambda t, o, _d: t >= moved_at and o >= start) or reader.errors,
                        WAIT_S, "a record read from the preferred leader")
    return {"restart_to_move_s": moved_at - restarted_at,
            "move_acked_s": acked_at - moved_at if not writer.errors else None,
            "move_read_s": read_at - moved_at if read_at is not None and not reader.errors else None}


def failovers(cluster: LocalCluster, client: KazooClient, events: tuple[str, ...], repeat: int) -> dict:
    """``repeat`` failovers per event on the failover topic (created here)."""
    create_topic(cluster, FAILOVER_TOPIC, 3)
    with Admin(cluster.bootstrap(0)) as admin:
        preferred = admin.describe_topic(FAILOVER_TOPIC).partitions[0].replicas[0]
    watch = StateWatch(client, ZkPaths(), FAILOVER_TOPIC, 0)
    return {event: [failover_once(cluster, watch, preferred, event) for _ in range(repeat)]
            for event in events}


# --- the run -------------------------------------------------------------------------------------


def run_cluster(root: Path, zookeeper: ZooKeeperServer, session_ms: int, *, produce: Settings | None,
                events: tuple[str, ...], repeat: int) -> dict:
    chroot = f"/bench-{session_ms}-{uuid.uuid4().hex[:8]}"
    setup = KazooClient(zookeeper.connect_string)
    setup.start(timeout=30)
    setup.ensure_path(chroot)
    setup.stop()
    setup.close()
    directory = root / f"cluster-{session_ms}"
    directory.mkdir()
    cluster = LocalCluster(directory, zookeeper.connect_string + chroot,
                           {"zookeeper_session_timeout_ms": session_ms}, workers=1)
    client = KazooClient(zookeeper.connect_string + chroot)
    client.start(timeout=30)
    try:
        for broker_id in BROKERS:
            cluster.start(broker_id)
        result: dict = {"zookeeper_session_timeout_ms": session_ms}
        if produce is not None:
            result["produce"] = produce_comparison(cluster, produce)
        result["failovers"] = failovers(cluster, client, events, repeat) if repeat else {}
        return result
    finally:
        client.stop()
        client.close()
        cluster.close()


def _note(name: str, figures: dict) -> None:
    shown = ", ".join(f"{k} {v:,.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()
                      if not isinstance(v, list) or v)
    print(f"  {name}: {shown}", file=sys.stderr, flush=True)


def _median_max(values: list[float | None]) -> str:
    """``median s (max m)`` of the measured values, and how many runs measured nothing."""
    measured = [v for v in values if v is not None]
    missing = len(values) - len(measured)
    text = f"{statistics.median(measured):.2f} s (max {max(measured):.2f})" if measured else "none"
    return text + (f"; {missing} of {len(values)} never (the client gave up)" if missing else "")


def _median_range(values: list[float], fmt: str) -> str:
    median, low, high = spread(values)
    return f"{format(median, fmt)} ({format(low, fmt)}–{format(high, fmt)})"


def _where_the_time_goes(produce: dict) -> list[str]:
    """CPU per million records of each process, and the disk's fdatasync ceiling."""
    lines = ["CPU seconds per million records acknowledged (median over the rounds), CPU cores busy, "
             "and bytes stored per record (all replicas together):", "",
             "| what | clients | broker 0 | broker 1 | broker 2 | cores busy (of 2) | bytes stored per "
             "record |",
             "|---|---|---|---|---|---|---|"]
    for label, runs in produce["variants"].items():
        names = ("clients", "broker 0", "broker 1", "broker 2")
        cells = [f"{statistics.median(r['cpu_s_per_million'].get(n, 0.0) for r in runs):.3f}" for n in names]
        cores = statistics.median(r["cpu_cores"] for r in runs)
        stored = statistics.median(r["stored_bytes_per_record"] for r in runs)
        lines.append(f"| {label} | {' | '.join(cells)} | {cores:.2f} | {stored:.0f} |")
    disk = produce.get("disk")
    if disk:
        ceiling = produce.get("disk_ceiling", {})
        lines += ["", f"Disk (write + fdatasync of 4 MiB chunks, in the brokers' directory): one writer "
                      f"{disk['1_writers_mb_per_s']:,.0f} MB/s, three at once "
                      f"{disk['3_writers_mb_per_s']:,.0f} MB/s in all."]
        if ceiling:
            lines += [f"Replicated produce wrote {ceiling['replicated_mb_per_s']:,.0f} MB/s in all (three "
                      f"replicas), unreplicated {ceiling['unreplicated_mb_per_s']:,.0f} MB/s; at three "
                      f"writers' rate R = 3 would reach at most {ceiling['records_per_s']:,.0f} records/s, "
                      f"a ratio of {ceiling['ratio']:.2f}."]
    return [*lines, ""]


def table(clusters: list[dict], settings: Settings) -> str:
    lines = []
    produce = next((c["produce"] for c in clusters if "produce" in c), None)
    if produce is not None:
        plain = [r["records_per_s"] for r in produce["variants"][UNREPLICATED.label]]
        replicated = [r["records_per_s"] for r in produce["variants"][REPLICATED.label]]
        p99 = {label: [r["ack_p99_ms"] for r in runs] for label, runs in produce["variants"].items()}
        per_round = produce["ratio_per_round"]
        lines += [f"Produce, one producer, {settings.value_bytes} B values, {settings.rounds} interleaved "
                  f"rounds of {settings.duration_s:g} s, median (range):", "",
                  "| what | records/s | ack p99, ms |", "|---|---|---|",
                  f"| {UNREPLICATED.label} | {_median_range(plain, ',.0f')} | "
                  f"{_median_range(p99[UNREPLICATED.label], '.1f')} |",
                  f"| {REPLICATED.label} | {_median_range(replicated, ',.0f')} | "
                  f"{_median_range(p99[REPLICATED.label], '.1f')} |",
                  f"| ratio replicated / unreplicated (target ≥ {RATIO_TARGET}) | "
                  f"{produce['ratio_of_medians']:.2f} of medians, per round {min(per_round):.2f}–"
                  f"{max(per_round):.2f}: {'met' if produce['met'] else 'MISSED'} | |", ""]
        lines += _where_the_time_goes(produce)
    if not any(c["failovers"] for c in clusters):
        return "\n".join(lines)
    lines += [f"Failover, one partition, R = 3, min_insync_replicas 2, acks=all; {settings.repeat} "
              "repetitions each, median (max), from the leader gone (the signal sent):", "",
              "| event | zookeeper_session_timeout_ms | new leader elected | first acks=all write "
              "acknowledged by the new leader | consumer reading from the new leader |",
              "|---|---|---|---|---|"]
    names = {"sigterm": "leader's broker stopped (SIGTERM)", "kill": "leader's broker killed (kill -9)"}
    moves = []
    for cluster in clusters:
        session = cluster["zookeeper_session_timeout_ms"]
        for event, runs in cluster["failovers"].items():
            lines.append(f"| {names[event]} | {session} | {_median_max([r['elected_s'] for r in runs])} | "
                         f"{_median_max([r['acked_s'] for r in runs])} | "
                         f"{_median_max([r['read_s'] for r in runs])} |")
            moves += runs
    lines.append(f"| move back to the preferred leader (from the state naming it; {len(moves)} moves) "
                 "| any | "
                 "– | " + _median_max([r["move_acked_s"] for r in moves]) + " | "
                 + _median_max([r["move_read_s"] for r in moves]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replication", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved produce rounds (default 3)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per produce run (default 5)")
    parser.add_argument("--max-records", type=int, default=50_000_000, help="records per produce run at most")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3,
                        help="failovers per event (default 3; 0: the produce comparison only)")
    parser.add_argument("--kill-sessions", default="6000,2000",
                        help="zookeeper_session_timeout_ms of each cluster, comma-separated; the first "
                             "cluster also runs the produce comparison and the SIGTERM failovers")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    sessions = tuple(int(s) for s in args.kill_sessions.split(",") if s.strip())
    if not sessions or args.rounds < 1 or args.repeat < 0 or args.duration <= 0:
        parser.error("need at least one session timeout, one round, repetitions >= 0 and a duration > 0")
    if args.repeat == 0:
        sessions = sessions[:1]
    settings = Settings(args.rounds, args.duration, args.max_records, args.value_bytes, args.repeat, sessions)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    clusters: list[dict] = []
    failure = None
    try:
        with tempfile.TemporaryDirectory(prefix="hpbroker-replication-") as tmp:
            root = Path(tmp)
            with ZooKeeperServer(root / "zookeeper") as zookeeper:
                for index, session_ms in enumerate(sessions):
                    clusters.append(run_cluster(root, zookeeper, session_ms,
                                                produce=settings if index == 0 else None,
                                                events=("sigterm", "kill") if index == 0 else ("kill",),
                                                repeat=settings.repeat))
    except Exception as e:
        failure = f"{type(e).__name__}: {e}"
        print(f"stopped by {failure}; the figures so far follow", file=sys.stderr)
    where = machine().replace("broker and loadgen",
                              "three brokers (1 worker each), ZooKeeper and the clients")
    text = (f"Machine: {where}. {time.time() - started:.0f} s in all"
            f"{'' if failure is None else f'; STOPPED EARLY by {failure}'}.\n\n"
            + (table(clusters, settings) if clusters else "") + "\n")
    (args.out / "replication.md").write_text(text)
    with open(args.out / "replication.json", "w") as f:
        json.dump({"machine": machine(), "started_at": started, "settings": dataclasses.asdict(settings),
                   "failure": failure, "clusters": clusters}, f, indent=1)
        f.write("\n")
    print(text)
    return 0 if failure is None else 1


if __name__ == "__main__":
    sys.exit(main())
