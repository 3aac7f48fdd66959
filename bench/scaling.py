"""How produce and consume throughput grow with the broker's I/O worker processes.

Run with ``make bench-scaling`` or::

    .venv/bin/python -m bench.scaling                                   # workers 1,2,4,8
    .venv/bin/python -m bench.scaling --workers 1,2,4,8,16 --producers 8 --duration 5

For each worker count W, a fresh broker (``bench.brokers.running_broker``: ``hpbroker serve
--workers W``, default settings, fdatasync'd flushes) on this machine, a topic of
``--partitions`` partitions (spread over the W workers by the broker's ownership rule), then:

1. produce: ``--producers`` loadgen producer processes, 100-byte random values, producer
   defaults (acks after the flush), as fast as they go for ``--duration`` seconds;
2. consume: ``--consumers`` loadgen consumer processes reading everything produced from the
   start, counting only (``check`` off), over the data ports.

The clients run on the same machine and take cores too: the figures say how far the pre-forked
workers carry the load on a machine of this many cores, not what a broker alone could do.
Results: ``bench/results/scaling.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.brokers import running_broker
from bench.scenarios import RESULTS, machine
from loadgen.config import LoadConfig
from loadgen.runner import run


def measure(workers: int, *, partitions: int, producers: int, consumers: int, duration_s: float,
            root: Path) -> dict:
    """One broker of ``workers`` workers: its produce and consume figures."""
    (root / f"w{workers}").mkdir()
    with running_broker(root / f"w{workers}", workers=workers) as port:
        common = {"bootstrap": f"127.0.0.1:{port}", "topic": "scaling", "progress": "off", "interval_s": 0.5}
        produced = run(LoadConfig(workload="produce", create_topic=True, partitions=partitions,
                                  producers=producers, duration_s=duration_s, **common))
        p = produced["produce"]
        if produced["failures"] or p["failed"]:
            raise RuntimeError(f"{workers} workers: produce failed: {produced['failures']} {p['failed']}")
        consumed = run(LoadConfig(workload="consume", until_end=True, consumers=consumers, check=False,
                                  **common))
        c = consumed["consume"]
        if consumed["failures"] or c["records"] != p["records"]:
            raise RuntimeError(f"{workers} workers: read {c['records']} of {p['records']}: "
                               f"{consumed['failures']}")
    figures = {"workers": workers, "produce_records_per_s": p["records_per_s"],
               "produce_mb_per_s": p["mb_per_s"], "ack_p50_ms": p["ack_latency_ms"]["p50"],
               "ack_p99_ms": p["ack_latency_ms"]["p99"], "consume_records_per_s": c["records_per_s"],
               "records": p["records"]}
    print(f"  {workers} workers: produce {p['records_per_s']:,.0f} records/s, consume "
          f"{c['records_per_s']:,.0f} records/s", file=sys.stderr, flush=True)
    return figures


def table(rows: list[dict]) -> str:
    base = rows[0]
    lines = ["| workers | produce records/s | × first | ack p50 / p99 ms | consume records/s | × first |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['workers']} | {r['produce_records_per_s']:,.0f} | "
                     f"{r['produce_records_per_s'] / base['produce_records_per_s']:.2f} | "
                     f"{r['ack_p50_ms']:.1f} / {r['ack_p99_ms']:.1f} | {r['consume_records_per_s']:,.0f} | "
                     f"{r['consume_records_per_s'] / base['consume_records_per_s']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4,8", help="worker counts, e.g. 1,2,4,8 (default)")
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--consumers", type=int, default=8)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per produce run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    try:
        counts = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        parser.error(f"--workers {args.workers!r}: a comma-separated list of integers")
    if not counts or min(counts) < 1 or min(args.partitions, args.producers, args.consumers) < 1 \
            or args.duration <= 0:
        parser.error("worker counts, --partitions, --producers, --consumers and --duration must be positive")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="hpbroker-scaling-") as tmp:
        rows = [measure(w, partitions=args.partitions, producers=args.producers, consumers=args.consumers,
                        duration_s=args.duration, root=Path(tmp)) for w in counts]
    text = (f"Machine: {machine()}. {args.partitions} partitions, {args.producers} producer and "
            f"{args.consumers} consumer processes (100 B values, client defaults), {args.duration:g} s "
            f"of producing per worker count; {time.time() - started:.0f} s in all.\n\n" + table(rows) + "\n")
    (args.out / "scaling.md").write_text(text)
    with open(args.out / "scaling.json", "w") as f:
        json.dump({"machine": machine(), "cpu_count": os.cpu_count(), "started_at": started, "rows": rows,
                   "settings": vars(args) | {"out": str(args.out)}}, f, indent=1)
        f.write("\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
