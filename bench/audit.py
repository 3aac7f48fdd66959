"""The audit of 10 million records on Spark in local mode, beside a plain Python count.

Run with ``make bench-audit`` or::

    .venv/bin/python -m bench.audit                       # 10 M records, 2 audits, 1 baseline
    .venv/bin/python -m bench.audit --records 2M --repeat 1

A broker (``bench.brokers.running_broker``: 2 workers, default settings) runs on this machine in a
temporary directory, removed at the end with everything written to it.  loadgen's producers
(``--producers``, 100-byte random values, as fast as they go) write ``--records`` records into a
topic of ``--partitions`` partitions and announce them in monitoring events (10 s windows).  Then:

- **the audit** (``hpbroker.spark.audit.run_audit``, ``local[*]``): reads the topic and the
  audit topic through the data source, counts per (topic, producer, window) and joins; timed from
  the call to the report, ``--repeat`` times in one Spark session (the first run also starts the
  session's Python workers; the session's own start is timed apart);
- **a scan**: the data source's read alone, ``count()`` of the topic's ``producer`` and
  ``timestamp`` columns;
- **the baseline**: one Python process, the hpbroker Consumer iterating every record and
  counting ``(topic, producer, window)`` in a dict (``collections.Counter``), then the events
  read and summed the same way.

Results: ``bench/results/audit.json`` and a table on stdout.  The machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from bench.brokers import running_broker
from hpbroker.audit.events import AUDIT_TOPIC, DEFAULT_WINDOW_MS, decode_event
from hpbroker.client import Consumer, TopicPartition
from loadgen.config import LoadConfig
from loadgen.runner import run as loadgen_run

RESULTS = Path(__file__).resolve().parent / "results"
TOPIC = "audited"


def _count(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def produce(bootstrap: str, records: int, partitions: int, producers: int) -> dict:
    started = time.monotonic()
    report = loadgen_run(LoadConfig(workload="produce", bootstrap=bootstrap, topic=TOPIC, create_topic=True,
                                    partitions=partitions, producers=producers, records=records,
                                    progress="off", seed=1))
    if report["failures"] or report["produce"]["failed"]:
        raise RuntimeError(f"loadgen failed: {report['failures'] or report['produce']['first_error']}")
    return {"records": report["produce"]["records"], "records_per_s": report["produce"]["records_per_s"],
            "wall_s": round(time.monotonic() - started, 2)}


def _records(bootstrap: str, topic: str):
    """Every record of ``topic`` up to its end offsets now, through the Consumer."""
    with Consumer(bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5000) as consumer:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        left = sum(consumer.end_offsets(tps).values())
        for record in consumer:
            yield record
            left -= 1
            if not left:
                return


def baseline(bootstrap: str) -> dict:
    """The plain Python count: every record through the Consumer, then the events."""
    started = time.perf_counter()
    counts: collections.Counter = collections.Counter()
    window = DEFAULT_WINDOW_MS  # loadgen's producers announce 10 s windows
    for record in _records(bootstrap, TOPIC):
        timestamp = record.timestamp
        counts[record.topic, record.producer, timestamp - timestamp % window] += 1
    counted = time.perf_counter()
    announced: collections.Counter = collections.Counter()
    for record in _records(bootstrap, AUDIT_TOPIC):
        event = decode_event(record.producer, record.value)
        announced[event.topic, event.producer, event.window_start_ms] += event.record_count
    elapsed = time.perf_counter() - started
    records = sum(counts.values())
    return {"records": records, "seconds": round(elapsed, 2), "records_per_s": round(records / elapsed),
            "count_seconds": round(counted - started, 2), "windows": len(counts),
            "matching": counts == announced}


def audits(bootstrap: str, repeat: int, master: str) -> dict:
    from hpbroker.spark import session
    from hpbroker.spark.audit import AuditConfig, run_audit

    started = time.perf_counter()
    spark = session(master, app_name="bench-audit")
    out: dict = {"session_start_s": round(time.perf_counter() - started, 2), "master": master,
                 "cores": spark.sparkContext.defaultParallelism, "runs": []}
    for _ in range(repeat):
        started = time.perf_counter()
        report = run_audit(spark, AuditConfig(bootstrap, topics=(TOPIC,)))
        elapsed = time.perf_counter() - started
        out["runs"].append({"seconds": round(elapsed, 2), "records": report.records_counted,
                            "records_per_s": round(report.records_counted / elapsed),
                            "windows": report.windows_checked, "ok": report.ok})
        print(f"  audit: {elapsed:.2f} s, {report.summary()}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    scanned = (spark.read.format("hpbroker").option("bootstrap", bootstrap).option("topic", TOPIC)
               .option("columns", "producer,timestamp").load().count())
    elapsed = time.perf_counter() - started
    out["scan"] = {"seconds": round(elapsed, 2), "records": scanned,
                   "records_per_s": round(scanned / elapsed)}
    spark.stop()
    return out


def table(results: dict) -> str:
    runs = results["spark"]["runs"]
    base, scan = results["baseline"], results["spark"]["scan"]
    lines = ["| what | time | records/s |", "|---|---|---|"]
    for i, run in enumerate(runs, 1):
        verdict = "OK" if run["ok"] else "FAILED"
        lines.append(f"| audit on Spark, {results['spark']['master']}, run {i} of one session "
                     f"({run['records']:,} records, {run['windows']} windows, {verdict}) "
                     f"| {run['seconds']:.1f} s | {run['records_per_s'] / 1e6:.2f} M |")
    lines.append(f"| the data source's scan alone (producer, timestamp; count) | {scan['seconds']:.1f} s | "
                 f"{scan['records_per_s'] / 1e6:.2f} M |")
    matching = "matching" if base["matching"] else "NOT matching"
    lines.append(f"| baseline: one Python process, Consumer + Counter ({base['windows']} windows, "
                 f"{matching} the events) | {base['seconds']:.1f} s | {base['records_per_s'] / 1e6:.2f} M |")
    lines.append(f"| (Spark session start, not in the runs) | {results['spark']['session_start_s']:.1f} s "
                 "| |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=_count, default=10_000_000, help="records to audit (10M)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2, help="audits in one Spark session (2)")
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args(argv)
    command = " ".join([Path(sys.executable).name, "-m", "bench.audit", *(argv or sys.argv[1:])])
    results: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
                     "command": command}
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as directory, \
            running_broker(Path(directory)) as port:
        bootstrap = f"127.0.0.1:{port}"
        print(f"producing {args.records:,} records ...", file=sys.stderr, flush=True)
        results["produce"] = produce(bootstrap, args.records, args.partitions, args.producers)
        print("auditing on Spark ...", file=sys.stderr, flush=True)
        results["spark"] = audits(bootstrap, args.repeat, args.master)
        print("counting in plain Python ...", file=sys.stderr, flush=True)
        results["baseline"] = baseline(bootstrap)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "audit.json").write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))
    return 0 if all(run["ok"] for run in results["spark"]["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
