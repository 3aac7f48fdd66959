"""The hpbroker tour in about a minute (``make demo``): every step is a command a user could type.

1. ``hpbroker up``: a local stack (a ZooKeeper of its own and a broker registered in it), data
   under ``demo-output/data``, on ports of its own so it runs beside ``make run``;
2. ``hpbroker topics create``: a topic for access logs;
3. ``loadgen e2e``: producers send JSON access-log records at a steady rate while a consumer
   reads them, with live progress, a loss/duplication check and a chart;
4. ``hpbroker audit``: the Spark job counts the stored records per producer and window and
   compares them with the producers' monitoring events; its table is printed;
5. ``curl``-like: a few lines of the broker's Prometheus metrics;
6. the stack is stopped (Ctrl-C stops it at any point too).

Outputs stay in ``demo-output/``: the chart (``loadgen.html``), loadgen's report
(``loadgen.json``), the audit of every window (``audit/``, CSV).  Exit status 0 when every step
succeeded and the audit found every window in order.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent
OUTPUT = Path("demo-output")
TOPIC = "access-logs"


def step(title: str) -> None:
    print(f"\n\033[1m== {title}\033[0m", flush=True)


def run(*argv: str) -> int:
    print("$ " + " ".join(argv), flush=True)
    return subprocess.call([str(BIN / argv[0]), *argv[1:]])


class Stack:
    """``hpbroker up`` in the background; its output is echoed, and ``ready`` set once it is up."""

    def __init__(self, port: int, metrics_port: int) -> None:
        self.port, self.metrics_port = port, metrics_port
        self.ready = threading.Event()
        argv = [str(BIN / "hpbroker"), "up", "--data-dir", str(OUTPUT / "data"), "--zookeeper-port", "0",
                "--port", str(port), "--fetch-port", str(port + 1), "--workers", "2",
                "--metrics-port", str(metrics_port), "--log-level", "WARNING"]
        print("$ " + " ".join(["hpbroker", *argv[1:]]) + " &", flush=True)
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        threading.Thread(target=self._echo, daemon=True).start()

    def _echo(self) -> None:
        for line in self.process.stdout:
            print("  | " + line.rstrip(), flush=True)
            if "stack up" in line:
                self.ready.set()

    def wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(0.2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                return False
        time.sleep(0.5)  # the announcement lists the registration; let the workers finish serving
        return True

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                return self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


def ports_free(*ports: int) -> bool:
    for port in ports:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def choose_ports(first: int) -> tuple[int, int]:
    """``(front-end port, metrics port)``: the first of ``first``, ``first + 100`` ... whose
    front-end, two data ports and metrics port (front-end + 312) are free."""
    for base in range(first, first + 2000, 100):
        if ports_free(base, base + 1, base + 2, base + 312):
            return base, base + 312
    raise SystemExit(f"no free ports from {first} on; pass --port")


def show_audit_table(directory: Path) -> None:
    """The audit's per-window rows (its CSV output) as a table."""
    rows = [row for path in sorted(directory.glob("*.csv")) for row in csv.DictReader(path.open())]
    columns = ("topic", "producer", "window_start", "announced", "consumed", "difference", "verdict")
    widths = [max([len(c), *(len(row[c]) for row in rows)]) for c in columns]
    for cells in (columns, *([row[c] for c in columns] for row in rows)):
        print("  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)))


def show_metrics(port: int, topic: str) -> None:
    """A few lines of the broker's Prometheus metrics about ``topic``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError as e:
        print(f"(metrics not available: {e})")
        return
    shown = [line for line in text.splitlines()
             if f'topic="{topic}"' in line and "_bucket" not in line and "records" in line]
    print("\n".join(shown[:8]) or "(no per-topic series)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=19092, help="the demo broker's front-end, or the next "
                        "free one 100 ports up (default 19092; its data ports follow it, metrics at +312)")
    parser.add_argument("--rate", default="200000", help="records/s of all producers (default 200000)")
    parser.add_argument("--duration", default="10", help="seconds of load (default 10)")
    args = parser.parse_args()
    port, metrics_port = choose_ports(args.port)
    bootstrap = f"127.0.0.1:{port}"
    shutil.rmtree(OUTPUT, ignore_errors=True)
    OUTPUT.mkdir()
    os.environ["HPBROKER_BOOTSTRAP"] = bootstrap

    step("1. start the local stack: ZooKeeper and a broker with 2 I/O workers")
    stack = Stack(port, metrics_port)
    try:
        if not stack.wait_ready(90):
            print("the stack did not come up (ports in use? try --port)", file=sys.stderr)
            return 1
        step("2. create a topic for access logs, 4 partitions")
        if run("hpbroker", "topics", "create", TOPIC, "--partitions", "4") != 0:
            return 1
        step(f"3. loadgen: 2 producers at {args.rate} records/s of JSON access-log lines for "
             f"{args.duration} s, 1 consumer, end to end")
        status = run("loadgen", "e2e", "--bootstrap", bootstrap, "--topic", TOPIC, "--producers", "2",
                     "--rate", args.rate, "--duration", args.duration, "--payload", "log",
                     "--record-size", "normal:200:40", "--keys", "zipf:1000", "--progress", "lines",
                     "--interval", "2", "--plot", str(OUTPUT / "loadgen.html"),
                     "--report", str(OUTPUT / "loadgen.json"))
        if status != 0:
            return 1
        step("4. the audit on Spark (local mode): stored records per producer and window against the "
             "producers' monitoring events")
        audit_status = run("hpbroker", "audit", "--bootstrap", bootstrap, "--topic", TOPIC,
                           "--output", str(OUTPUT / "audit"), "--format", "csv", "--all-windows")
        show_audit_table(OUTPUT / "audit")
        step("5. the broker's Prometheus metrics (a few lines)")
        show_metrics(metrics_port, TOPIC)
    finally:
        step("6. stop the stack")
        stack.stop()
    print(f"\nchart: {OUTPUT / 'loadgen.html'}\nloadgen report: {OUTPUT / 'loadgen.json'}\n"
          f"audit of every window: {OUTPUT / 'audit'}/ (CSV)")
    return 0 if audit_status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
