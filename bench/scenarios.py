"""The standard loadgen scenarios against a real broker, each figure beside its anchor.

Run with ``make bench`` (after the pytest-benchmark suite) or alone::

    .venv/bin/python -m bench.scenarios                  # scenarios 1-4, 3 runs each
    .venv/bin/python -m bench.scenarios --long           # also scenario 5 (>= 10 GB written)
    .venv/bin/python -m bench.scenarios --only 1,4 --repeat 5
    .venv/bin/python -m bench.scenarios --only 1,4 --idempotence-compare --repeat 5

A broker (``bench.brokers.running_broker``: ``hpbroker serve``, 2 workers, default settings) runs on
this machine beside loadgen, which drives it through the public client only.  Each run gets a
fresh topic, deleted afterwards.  The scenarios:

1. one producer, 100-byte random values, producer defaults (acks after the broker's fdatasync'd
   flush, linger 5 ms, 1 MiB batches), as fast as it goes;
2. the same with 1,000-byte values; with lz4 on JSON access-log values (100 and 1,000 bytes);
   bytes on disk per record read from the partition directories (segment files, and the
   indexes with them); 100-byte and 200-byte values in batches of exactly 50 records (the Kafka
   paper's setting), the first for the format's overhead per record;
3. one consumer reading 10 million 100-byte records from the start (2 partitions), checking every
   record (loadgen's default), and once more counting only (``check`` off);
4. end to end at a fixed rate of half scenario 1's median: linger 0, a topic that flushes every
   append at once without fdatasync (``flush_ms=0``, ``flush_fsync=false``); and the same rate
   with the topic's default flush policy (fdatasync, ``flush_ms=1``); and, for comparison, the
   first settings at 100,000 records/s;
5. (``--long``) one producer writing at least 10 GB of 1,000-byte values: the produce rate in the
   first and in the last tenth of the data, as fast as it goes, and paced at half of what the
   disk sustained at the end of a raw ``write`` + ``fdatasync`` loop of the same size in the same
   directory (at most 250 MB/s); the raw loop's own first and last tenth beside them.

``--idempotence-compare`` runs scenarios 1 and 4 (the only ones it changes) with the producer
idempotent and 5 requests in flight per partition (the client's default), idempotent with 1 in
flight, and not idempotent, interleaved (``bench.idempotence``: each round runs every variant once,
in an order rotated by one each round, so the shared machine's noise hits all alike; ``--repeat``
rounds; one untimed 2 s produce first warms the broker).  Scenario 1's row reports each side's
median and range, and the cost of idempotence: on's median against off's, in percent (target:
at most 3% slower), and the median and range of the per-round ratios.  Scenario 4 runs at half of
the idempotent side's median (and at 100,000 records/s); each row gives the three variants' p50
and p99: idempotence on with 1 in flight against off is what the idempotence costs in latency
(both send one request at a time per partition), 5 in flight against 1 answers whether
pipelining lowers the latency at high load.  A run that fails stops the comparison; the figures
measured so far are still written, marked as stopped early.  Every run's first batch of each
partition is read back: its attributes must say what the variant asked for.  Results go to
``scenarios-idempotence.{json,md}`` (the JSON's ``comparisons`` has the percent changes).

Results: ``bench/results/scenarios.json`` (every run's full loadgen report, and the summary) and
``bench/results/scenarios.md`` (the table, also printed).  The machine is shared and noisy:
figures are ranges over the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.brokers import running_broker
from bench.idempotence import (
    IDEMPOTENCE_OFF,
    IDEMPOTENCE_ON,
    IDEMPOTENCE_ON_1,
    interleave,
    relative_change,
    spread,
)
from hpbroker.client import Admin
from hpbroker.records import HEADER_SIZE, PRODUCER_IDENTITY_SIZE, build_batch, read_header
from loadgen.config import LoadConfig
from loadgen.payload import SizeSpec
from loadgen.runner import run

RESULTS = Path(__file__).resolve().parent / "results"
DURATION_S = 6.0
CONSUME_RECORDS = 10_000_000
LONG_BYTES = 10 * 10**9
LONG_RECORD_BYTES = 1000
# loadgen names its producers "loadgen-<8 hex digits>-<index>": 18 bytes of batch header for index < 10
PRODUCER_NAME_BYTES = len("loadgen-00000000-0")

KAFKA_PAPER = "Kafka paper"
KAFKA_2014 = "Kafka 2014"
ANCHORS = ("Anchors: *Kafka paper*: Kreps, Narkhede, Rao, \"Kafka: a Distributed Messaging System for Log "
           "Processing\" (NetDB 2011), two Linux machines with 8 cores at 2 GHz, 16 GB, 6 disks in RAID 10, "
           "1 Gb/s network. *Kafka 2014*: \"Benchmarking Apache Kafka: 2 Million Writes Per Second (On Three "
           "Cheap Machines)\" (LinkedIn, 2014), Kafka on three machines with 6 cores at 2.5 GHz, 32 GB, "
           "six 7200 RPM SATA drives, 1 Gb/s Ethernet, load from three more; producer "
           "and consumer figures without replication, latency with it.")


class Bench:
    """One broker, the runs made against it, and their summaries."""

    def __init__(self, root: Path, bootstrap: str, repeat: int, duration_s: float) -> None:
        self.root = root
        self.bootstrap = bootstrap
        self.repeat = repeat
        self.duration_s = duration_s
        self.runs: dict[str, list[dict]] = {}
        self.rows: list[dict] = []
        self.comparisons: list[dict] = []
        self._topics = 0

    def topic(self, name: str) -> str:
        self._topics += 1
        return f"{name}-{self._topics}"

    def run(self, name: str, **settings) -> dict:
        config = LoadConfig(bootstrap=self.bootstrap, progress="off", interval_s=0.5, **settings)
        started = time.monotonic()
        report = run(config)
        report["wall_s"] = round(time.monotonic() - started, 3)
        self.runs.setdefault(name, []).append(report)
        if report["failures"]:
            raise RuntimeError(f"{name}: workers failed: {report['failures']}")
        return report

    def disk_bytes(self, topic: str) -> tuple[int, int]:
        """``(segment .log bytes, all files' bytes)`` of the topic's partition directories."""
        logs = total = 0
        for directory in (self.root / "data").glob(f"{topic}-*"):
            for path in directory.iterdir():
                size = path.stat().st_size
                if path.suffix in (".log", ".index", ".timeindex"):
                    total += size
                if path.suffix == ".log":
                    logs += size
        return logs, total

    def delete(self, topic: str) -> None:
        with Admin(self.bootstrap) as admin:
            admin.delete_topic(topic)

    def idempotent_partitions(self, topic: str) -> list[bool]:
        """Per partition of ``topic`` that holds data, whether its first batch is idempotent
        (attributes bit 3): the producer sent what it was asked to."""
        found = []
        for directory in sorted((self.root / "data").glob(f"{topic}-*")):
            segments = sorted(directory.glob("*.log"))
            if segments and segments[0].stat().st_size >= HEADER_SIZE + PRODUCER_IDENTITY_SIZE:
                with open(segments[0], "rb") as f:
                    found.append(read_header(f.read(HEADER_SIZE + PRODUCER_IDENTITY_SIZE)).idempotent)
        return found

    def check_idempotence(self, name: str, topic: str, settings: dict) -> None:
        wanted = settings.get("enable_idempotence")
        if wanted is None:
            return
        found = self.idempotent_partitions(topic)
        if not found or any(flag != wanted for flag in found):
            raise RuntimeError(f"{name}: asked for enable_idempotence={wanted}, the partitions' first "
                               f"batches say idempotent={found}")

    def produce_once(self, name: str, *, partitions: int = 2, topic_configs: tuple = (), disk: bool = False,
                     **settings) -> dict:
        """One produce run into a fresh topic (deleted afterwards); its figures."""
        topic = self.topic(name)
        report = self.run(name, workload="produce", topic=topic, create_topic=True, partitions=partitions,
                          topic_configs=topic_configs, **settings)
        p = report["produce"]
        figures = {"records_per_s": p["records_per_s"], "mb_per_s": p["mb_per_s"],
                   "records": p["records"],
                   "value_bytes_per_record": p["bytes"] / max(1, p["records"]),
                   "ack_p50_ms": p["ack_latency_ms"]["p50"], "ack_p99_ms": p["ack_latency_ms"]["p99"],
                   "failed": p["failed"], "retries": p["retries"], "deduplicated": p.get("deduplicated")}
        if disk:
            logs, total = self.disk_bytes(topic)
            figures["log_bytes_per_record"] = logs / max(1, p["records"])
            figures["disk_bytes_per_record"] = total / max(1, p["records"])
        self.check_idempotence(name, topic, settings)
        self.delete(topic)
        _note(name, figures)
        return figures

    def produce(self, name: str, **settings) -> list[dict]:
        """``repeat`` produce runs, each into a fresh topic; per run, the figures."""
        return [self.produce_once(name, **settings) for _ in range(self.repeat)]

    def e2e_once(self, name: str, *, rate: float, topic_configs: tuple = (), **settings) -> dict:
        """One end-to-end run at ``rate`` (2 partitions, linger 0) into a fresh topic; its figures."""
        topic = self.topic(name)
        report = self.run(name, workload="e2e", topic=topic, create_topic=True, partitions=2,
                          topic_configs=topic_configs, rate=rate, linger_ms=0, duration_s=self.duration_s,
                          **settings)
        latency = report["consume"]["e2e_latency_ms"]
        if not report["check"]["ok"]:
            raise RuntimeError(f"{name}: the check failed: {report['check']}")
        p = report["produce"]
        figures = {"p50_ms": latency["p50"], "p99_ms": latency["p99"], "p999_ms": latency["p999"],
                   "records_per_s": p["records_per_s"], "retries": p["retries"],
                   "deduplicated": p.get("deduplicated"), "duplicates": report.get("duplicates")}
        self.check_idempotence(name, topic, settings)
        self.delete(topic)
        _note(name, figures)
        return figures


def _note(name: str, figures: dict) -> None:
    shown = ", ".join(f"{k} {v:,.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items())
    print(f"  {name}: {shown}", file=sys.stderr, flush=True)


def _span(values: list[float], fmt: str, scale: float = 1.0) -> str:
    values = [v * scale for v in values if v is not None]
    if not values:
        return "-"
    low, high = min(values), max(values)
    a, b = format(low, fmt), format(high, fmt)
    return a if a == b else f"{a}–{b}"


def batch_bytes_for(records: int, value_bytes: int) -> int:
    """The ``batch_bytes`` that makes the producer close a batch at exactly ``records`` records of
    ``value_bytes`` (no key, headers or timestamp spread): the size of such a batch."""
    return len(build_batch([b"v" * value_bytes] * records, producer="p" * PRODUCER_NAME_BYTES))


# --- the scenarios ------------------------------------------------------------------------------


SCENARIO_1 = "1-produce-100B"


def _scenario_1_row(rates: list[float], which: str = "") -> dict:
    return {"scenario": "1. one producer, 100 B random values, defaults (acks after the "
                        f"fdatasync'd flush, linger 5 ms, 1 MiB batches{which}), max rate",
            "measured": f"{_span(rates, ',.0f')} records/s ({_span(rates, '.0f', 1e-4)} MB/s)",
            "target": "≥ 2,000,000 records/s", "met": min(rates) >= 2e6,
            "anchor": f"{KAFKA_2014}: 821,557 records/s, one producer, 100 B, no replication; "
                      f"{KAFKA_PAPER}: 50,000 (batch 1) and 400,000 (batch 50) records/s, 200 B"}


def scenario_1(bench: Bench) -> float:
    runs = bench.produce(SCENARIO_1, duration_s=bench.duration_s)
    rates = [r["records_per_s"] for r in runs]
    bench.rows.append(_scenario_1_row(rates))
    return statistics.median(rates)


def scenario_2(bench: Bench) -> None:
    d = bench.duration_s
    kb = bench.produce("2a-produce-1KB", duration_s=d, record_size=SizeSpec("fixed", 1000), disk=True)
    bench.rows.append({"scenario": "2a. the same, 1,000 B random values",
                       "measured": f"{_span([r['records_per_s'] for r in kb], ',.0f')} records/s "
                                   f"({_span([r['mb_per_s'] for r in kb], ',.0f')} MB/s); on disk "
                                   f"{_span([r['disk_bytes_per_record'] for r in kb], '.1f')} B/record",
                       "target": "", "met": None, "anchor": ""})
    for size in (100, 1000):
        runs = bench.produce(f"2b-produce-{size}B-log-lz4", duration_s=d, record_size=SizeSpec("fixed", size),
                             payload="log", compression="lz4", disk=True)
        bench.rows.append({"scenario": f"2b. the same, {size:,} B JSON access-log values, lz4",
                           "measured": f"{_span([r['records_per_s'] for r in runs], ',.0f')} records/s "
                                       f"({_span([r['mb_per_s'] for r in runs], ',.0f')} MB/s of values); "
                                       f"on disk {_span([r['disk_bytes_per_record'] for r in runs], '.1f')} "
                                       f"B/record", "target": "", "met": None, "anchor": ""})
    for size in (100, 200):
        runs = bench.produce(f"2c-produce-{size}B-batches-of-50", records=1_000_000,
                             record_size=SizeSpec("fixed", size), batch_bytes=batch_bytes_for(50, size),
                             partitions=1, disk=True)
        overhead = [r["disk_bytes_per_record"] - size for r in runs]
        segment_overhead = [r["log_bytes_per_record"] - size for r in runs]
        rates = _span([r["records_per_s"] for r in runs], ",.0f")
        if size == 100:
            bench.rows.append({"scenario": "2c. 100 B random values in batches of exactly 50 records "
                                           "(1 partition): bytes on disk per record beyond the value",
                               "measured": f"{_span(overhead, '.2f')} B/record (segments alone: "
                                           f"{_span(segment_overhead, '.2f')}); {rates} records/s",
                               "target": "≤ 9 B", "met": max(overhead) <= 9,
                               "anchor": f"{KAFKA_PAPER}: 9 B of overhead per message"})
        else:
            bench.rows.append({"scenario": "2d. 200 B random values in batches of exactly 50 records "
                                           "(1 partition), max rate",
                               "measured": f"{rates} records/s", "target": "", "met": None,
                               "anchor": f"{KAFKA_PAPER}: 400,000 records/s (batch 50, 200 B)"})


def scenario_3(bench: Bench) -> None:
    topic = bench.topic("3-consume")
    fill = bench.run("3-fill", workload="produce", topic=topic, create_topic=True, partitions=2,
                     records=CONSUME_RECORDS)
    assert fill["produce"]["failed"] == 0, fill["produce"]
    for check, name in ((True, "3-consume-10M-checked"), (False, "3-consume-10M-counted")):
        rates = []
        for _ in range(bench.repeat):
            report = bench.run(name, workload="consume", topic=topic, records=CONSUME_RECORDS, check=check)
            c = report["consume"]
            assert c["records"] == CONSUME_RECORDS, c
            if check:
                assert report["check"]["ok"], report["check"]
            rates.append(c["records_per_s"])
            _note(name, {"records_per_s": c["records_per_s"], "mb_per_s": c["mb_per_s"]})
        what = ("every record's header parsed, tallied and checked (loadgen's default)" if check
                else "records counted only (--no-check)")
        bench.rows.append({"scenario": f"3. one consumer reading 10,000,000 records of 100 B from the start "
                                       f"(2 partitions), {what}",
                           "measured": f"{_span(rates, ',.0f')} records/s",
                           "target": "≥ 4,000,000 records/s", "met": min(rates) >= 4e6,
                           "anchor": f"{KAFKA_2014}: 940,521 records/s consumed; {KAFKA_PAPER}: 22,000 "
                                     "records/s consumed"})
    bench.delete(topic)


NO_FSYNC = (("flush_ms", "0"), ("flush_fsync", "false"))
NO_FSYNC_TEXT, FSYNC_TEXT = "topic flush_ms=0, flush_fsync=false", "topic defaults: flush_ms=1, fdatasync"
HALF = "half of scenario 1's median"
E2E_TARGET = "p50 ≤ 1 ms, p99 ≤ 3 ms"
E2E_ANCHOR = f"{KAFKA_2014}: 2 ms median, 3 ms p99, 14 ms p99.9 (replicated, no fsync)"


def _scenario_4_variants(max_rate: float) -> tuple:
    """``(name, rate, topic_configs, why, described)`` of each scenario 4 row."""
    half = round(max_rate / 2, -3)
    return (("4-e2e-no-fsync", half, NO_FSYNC, HALF, NO_FSYNC_TEXT),
            ("4-e2e-fsync", half, (), HALF, FSYNC_TEXT),
            ("4-e2e-no-fsync-100k", 100_000, NO_FSYNC, "for comparison", NO_FSYNC_TEXT))


def _scenario_4_text(rate: float, why: str, described: str) -> str:
    return (f"4. end to end at {rate:,.0f} records/s ({why}), 100 B, 1 producer, 1 consumer, 2 partitions, "
            f"producer linger_ms=0, {described}")


def scenario_4(bench: Bench, max_rate: float) -> None:
    for name, rate, topic_configs, why, described in _scenario_4_variants(max_rate):
        runs = [bench.e2e_once(name, rate=rate, topic_configs=topic_configs) for _ in range(bench.repeat)]
        p50, p99 = [r["p50_ms"] for r in runs], [r["p99_ms"] for r in runs]
        bench.rows.append({"scenario": _scenario_4_text(rate, why, described),
                           "measured": f"p50 {_span(p50, '.2f')} ms, p99 {_span(p99, '.2f')} ms, "
                                       f"p99.9 {_span([r['p999_ms'] for r in runs], '.2f')} ms "
                                       f"(at {_span([r['records_per_s'] for r in runs], ',.0f')} records/s)",
                           "target": E2E_TARGET, "met": max(p50) <= 1 and max(p99) <= 3,
                           "anchor": E2E_ANCHOR})


# --- idempotence on and off, interleaved (--idempotence-compare) -----------------------------------

IDEMPOTENCE_COST_TARGET_PERCENT = 3.0
WARM_UP_S = 2.0


def _median_range(values: list[float], fmt: str, unit: str = "") -> str:
    median, _, _ = spread(values)
    return f"{format(median, fmt)}{unit} ({_span(values, fmt)})"


def _change(change: dict) -> str:
    return (f"{change['of_medians']:+.1f}% (paired per round: median {change['paired_median']:+.1f}%, "
            f"{change['paired_low']:+.1f}% to {change['paired_high']:+.1f}%)")


def scenario_1_compare(bench: Bench) -> float:
    """Scenario 1 with idempotence on (the default, 5 in flight), on with 1 in flight, and off,
    interleaved; returns the median of the default's runs."""
    bench.run("warm-up", workload="produce", topic=bench.topic("warm-up"), create_topic=True, partitions=2,
              duration_s=WARM_UP_S, delete_topic=True)
    variants = (IDEMPOTENCE_ON, IDEMPOTENCE_ON_1, IDEMPOTENCE_OFF)
    results = interleave(variants, bench.repeat,
                         lambda v: bench.produce_once(f"{SCENARIO_1}-{v.slug}", duration_s=bench.duration_s,
                                                      **v.options))
    rates = {label: [r["records_per_s"] for r in runs] for label, runs in results.items()}
    on, on_1, off = (rates[v.label] for v in variants)
    bench.rows.append(_scenario_1_row(on, ", idempotent, 5 in flight"))
    change = relative_change(on, off)
    cost = -change["of_medians"]
    bench.comparisons.append({"scenario": SCENARIO_1, "variants": results, "cost_percent": cost,
                              "on_vs_off_percent": change, "on_1_vs_on_percent": relative_change(on_1, on)})
    bench.rows.append({"scenario": f"1. the same, idempotence on vs off, interleaved ({bench.repeat} "
                                   "rounds): records/s, median (range)",
                       "measured": f"on (5 in flight): {_median_range(on, ',.0f')}; on, 1 in flight: "
                                   f"{_median_range(on_1, ',.0f')}; off: {_median_range(off, ',.0f')}; "
                                   f"on against off: {_change(change)}",
                       "target": f"cost ≤ {IDEMPOTENCE_COST_TARGET_PERCENT:.0f}%",
                       "met": cost <= IDEMPOTENCE_COST_TARGET_PERCENT,
                       "anchor": "Kafka: the idempotent producer on by default since 3.0 (KIP-679)"})
    return statistics.median(on)


def scenario_4_compare(bench: Bench, max_rate: float) -> None:
    """Each scenario 4 row with idempotence on (5 in flight), on with 1 in flight, and off,
    interleaved: what idempotence costs in latency (on with 1 in flight against off, both one
    request at a time per partition), and whether pipelining lowers it (5 in flight against 1)."""
    for name, rate, topic_configs, why, described in _scenario_4_variants(max_rate):
        variants = (IDEMPOTENCE_ON, IDEMPOTENCE_ON_1, IDEMPOTENCE_OFF)
        results = interleave(variants, bench.repeat,
                             lambda v, n=name, r=rate, t=topic_configs:
                             bench.e2e_once(f"{n}-{v.slug}", rate=r, topic_configs=t, **v.options))
        shown, comparison = [], {"scenario": name, "rate": rate, "variants": results}
        for variant in variants:
            runs = results[variant.label]
            shown.append(f"{variant.label}: p50 {_median_range([r['p50_ms'] for r in runs], '.2f', ' ms')}, "
                         f"p99 {_median_range([r['p99_ms'] for r in runs], '.2f', ' ms')}")
        on = results[IDEMPOTENCE_ON.label]
        for other in variants[1:]:
            runs = results[other.label]
            comparison[f"{other.label} vs on, percent"] = {
                q: relative_change([r[q] for r in runs], [r[q] for r in on]) for q in ("p50_ms", "p99_ms")}
        achieved = [r["records_per_s"] for runs in results.values() for r in runs]
        bench.comparisons.append(comparison)
        bench.rows.append({"scenario": f"{_scenario_4_text(rate, why, described)}: idempotence on and off, "
                                       f"interleaved ({bench.repeat} rounds), median (range)",
                           "measured": "; ".join(shown) + f" (at {_span(achieved, ',.0f')} records/s)",
                           "target": E2E_TARGET, "met": None, "anchor": E2E_ANCHOR})


def _tenth_rates(report: dict) -> tuple[float, float]:
    """Records/s over the first and the last tenth of the records sent, from the timeline."""
    interval = report["settings"]["interval_s"]
    total = report["produce"]["records"]
    points = [(0.0, 0.0)]
    for row in report["timeline"]:
        points.append((row["t_s"], points[-1][1] + row["produced_per_s"] * interval))

    def time_at(count: float) -> float:
        for (t0, c0), (t1, c1) in zip(points, points[1:], strict=False):
            if c1 >= count:
                return t0 + (t1 - t0) * (count - c0) / max(c1 - c0, 1e-9)
        return points[-1][0]

    tenth = total / 10
    return tenth / time_at(tenth), tenth / (time_at(total) - time_at(total - tenth))


def _raw_write_tenths(directory: Path, total_bytes: int, chunk: int = 1 << 20) -> tuple[float, float]:
    """MB/s of a plain write + fdatasync loop (1 MiB writes, one fdatasync per 8 MiB) over the first
    and the last tenth of ``total_bytes``."""
    path = directory / "raw-write.bin"
    buffer = os.urandom(chunk)
    marks = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written, start = 0, time.monotonic()
        while written < total_bytes:
            written += os.write(fd, buffer)
            if written % (8 * chunk) == 0:
                os.fdatasync(fd)
                marks.append((time.monotonic() - start, written))
    finally:
        os.close(fd)
        path.unlink()

    def time_at(count: float) -> float:
        return next(t for t, w in marks if w >= count)

    tenth = total_bytes / 10
    first = tenth / time_at(tenth)
    last = tenth / (marks[-1][0] - time_at(total_bytes - tenth))
    return first / 1e6, last / 1e6


def scenario_5(bench: Bench) -> None:
    raw_first, raw_last = _raw_write_tenths(bench.root, LONG_BYTES)
    _note("5-raw-write-10GB", {"first_tenth_mb_s": raw_first, "last_tenth_mb_s": raw_last})
    raw = (f"a raw write + fdatasync loop of 10 GB in the same directory: {raw_first:,.0f} then "
           f"{raw_last:,.0f} MB/s ({raw_last / raw_first:.0%})")
    sustained = round(min(0.5 * raw_last * 1e6, 250e6) / LONG_RECORD_BYTES, -3)
    for name, rate, how in (("5a-produce-10GB-max", None, "max rate"),
                            ("5b-produce-10GB-paced", sustained,
                             f"paced at {sustained:,.0f} records/s (half the raw loop's last tenth, "
                             "at most 250 MB/s)")):
        topic = bench.topic(name)
        report = bench.run(name, workload="produce", topic=topic, create_topic=True, partitions=2,
                           records=LONG_BYTES // LONG_RECORD_BYTES, rate=rate,
                           record_size=SizeSpec("fixed", LONG_RECORD_BYTES), max_duration_s=600)
        first, last = _tenth_rates(report)
        logs, _ = bench.disk_bytes(topic)
        bench.delete(topic)
        p = report["produce"]
        _note(name, {"first_tenth": first, "last_tenth": last, "log_bytes": logs,
                     "duration_s": p["duration_s"], "ack_p99_ms": p["ack_latency_ms"]["p99"]})
        bench.rows.append({"scenario": f"5. one producer writing {logs / 1e9:.1f} GB of 1,000 B values "
                                       f"(2 partitions, defaults), {how}: produce rate in the first and the "
                                       "last tenth of the data",
                           "measured": f"{first:,.0f} then {last:,.0f} records/s ({last / first:.0%}), "
                                       f"{p['duration_s']:.0f} s in all; {raw}",
                           "target": "last ≥ 90% of first", "met": last >= 0.9 * first,
                           "anchor": f"{KAFKA_2014}: throughput flat as the log grows to TBs"})


# --- the table ------------------------------------------------------------------------------------


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores ({cpu}), {memory_gib:.0f} GiB, Linux {platform.release()}; "
            "broker and loadgen on the same machine")


def table(rows: list[dict]) -> str:
    lines = ["| scenario | hpbroker (this machine) | target | met | anchor |", "|---|---|---|---|---|"]
    for row in rows:
        met = "" if row["met"] is None else ("yes" if row["met"] else "**no**")
        lines.append(f"| {row['scenario']} | {row['measured']} | {row['target']} | {met} | {row['anchor']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scenarios", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="1,2,3,4", help="scenarios to run, e.g. 1,4 (default 1,2,3,4)")
    parser.add_argument("--long", action="store_true", help="also scenario 5 (>= 10 GB written)")
    parser.add_argument("--repeat", type=int, default=int(os.environ.get("SCENARIO_REPEAT", "3")))
    parser.add_argument("--duration", type=float, default=DURATION_S, help="seconds per timed run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--idempotence-compare", action="store_true",
                        help="scenarios 1 and 4 with idempotence on (5 in flight, the default), on with 1 in "
                             "flight, and off, interleaved; --repeat rounds")
    args = parser.parse_args(argv)
    chosen = {s.strip() for s in args.only.split(",") if s.strip()} | ({"5"} if args.long else set())
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    bench, failure = None, None
    try:
        with tempfile.TemporaryDirectory(prefix="hpbroker-scenarios-") as tmp:
            root = Path(tmp)
            with running_broker(root) as port:
                bench = Bench(root, f"127.0.0.1:{port}", args.repeat, args.duration)
                _run_scenarios(bench, chosen, args.idempotence_compare)
    except Exception as e:
        failure = f"{type(e).__name__}: {e}"
        if bench is None:
            raise
        print(f"stopped by {failure}; the figures so far follow", file=sys.stderr)
    runs = f"{args.repeat} rounds of interleaved runs" if args.idempotence_compare else f"{args.repeat} runs"
    text = (f"Machine: {machine()}. {runs} per figure, {time.time() - started:.0f} s in all"
            f"{'' if failure is None else f'; STOPPED EARLY by {failure}'}.\n\n"
            + table(bench.rows) + "\n\n" + ANCHORS + "\n")
    name = ("scenarios-long" if chosen == {"5"} else "scenarios-idempotence" if args.idempotence_compare
            else "scenarios")
    (args.out / f"{name}.md").write_text(text)
    with open(args.out / f"{name}.json", "w") as f:
        json.dump({"machine": machine(), "started_at": started, "repeat": args.repeat, "failure": failure,
                   "rows": bench.rows, "comparisons": bench.comparisons, "runs": bench.runs}, f, indent=1)
        f.write("\n")
    print(text)
    return 0 if failure is None else 1


def _run_scenarios(bench: Bench, chosen: set[str], idempotence_compare: bool) -> None:
    max_rate = None
    if ("1" in chosen or "4" in chosen) and idempotence_compare:
        max_rate = scenario_1_compare(bench)
    elif "1" in chosen or "4" in chosen:
        max_rate = scenario_1(bench)
    if "2" in chosen:
        scenario_2(bench)
    if "3" in chosen:
        scenario_3(bench)
    if "4" in chosen and idempotence_compare:
        scenario_4_compare(bench, max_rate)
    elif "4" in chosen:
        scenario_4(bench, max_rate)
    if "5" in chosen:
        scenario_5(bench)


if __name__ == "__main__":
    sys.exit(main())
