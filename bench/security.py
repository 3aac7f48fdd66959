"""What CurveZMQ costs: scenarios 1 and 3 against a broker with ``security = "curve"`` beside one
without, in the same run, and scenario 3 once more on the secured broker with the fetch path
encrypted too (``fetch_via = "frontend"``).

Run with ``make bench-security`` or::

    .venv/bin/python -m bench.security                      # 3 rounds
    .venv/bin/python -m bench.security --rounds 5 --duration 6

Two brokers (``bench.brokers.running_broker``: 2 workers each, default settings) run on this
machine: one without security, one with ``security = "curve"`` whose allowlist holds the bench's
key, a super-user (so every request also passes the ACL check: the full path a secured client
takes).  Each round runs, on each broker, in an order that alternates from round to round so the
shared machine's noise hits both alike:

1. scenario 1: one producer, 100-byte random values, producer defaults, as fast as it goes, for
   ``--duration`` seconds, into a fresh topic of 2 partitions (deleted afterwards).  Secured, every
   produce request travels CURVE-encrypted (libzmq's crypto_box per message) and is checked
   against the ACLs;
2. scenario 3: one consumer reading ``--consume-records`` 100-byte records (10 million by
   default) of 2 partitions from the start, checking every record.  Secured, the consumer gets a
   fetch token on the (encrypted) front-end and presents it once per data-port connection; the
   records themselves still go out with ``sendfile`` in the clear (docs/SECURITY.md);
3. scenario 3 on the secured broker only, with the consumer's ``fetch_via = "frontend"``: the
   same records fetched through the CurveZMQ front-end, encrypted, without ``sendfile`` (the
   worker reads each response into memory, the arbiter relays it, libzmq encrypts it and the
   consumer decrypts it).  Its row compares it with the unsecured broker's data-port read, and
   says what it is of the secured data-port read too.

The scenario 3 reads of a round run in an order that rotates from round to round.  Each row gives
both sides' median and range and the ratio of the medians (secured / not), and the range of the
per-round ratios.  Results: ``bench/results/security.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.brokers import running_broker
from bench.scenarios import RESULTS, Bench, machine
from hpbroker.client import ClientSecurity
from hpbroker.security.keys import allow_key, generate_key_pair

DURATION_S = 6.0
CONSUME_RECORDS = 10_000_000
_CLIENT_VARIABLES = ("HPBROKER_CLIENT_KEY_FILE", "HPBROKER_CLIENT_SERVER_KEY_FILE")


def secured_config(keys: Path, allowlist: Path) -> str:
    """The broker.toml of the secured broker: the bench's key ``loader`` is a super-user."""
    return (f'[broker]\nsecurity = "curve"\nserver_key_file = "{keys / "broker.key_secret"}"\n'
            f'allowlist_dir = "{allowlist}"\nsuper_users = "loader"\n')


@contextmanager
def client_environment(keys: Path | None) -> Iterator[None]:
    """loadgen's producers, consumers and admin (and their worker processes) take their keys from
    the environment: set for the secured broker, cleared for the other."""
    saved = {name: os.environ.pop(name, None) for name in _CLIENT_VARIABLES}
    if keys is not None:
        os.environ["HPBROKER_CLIENT_KEY_FILE"] = str(keys / "loader.key_secret")
        os.environ["HPBROKER_CLIENT_SERVER_KEY_FILE"] = str(keys / "broker.key")
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


class Side:
    """One broker of the comparison: its bench, and the keys its clients use (None: plain)."""

    def __init__(self, name: str, bench: Bench, keys: Path | None) -> None:
        self.name = name
        self.bench = bench
        self.keys = keys
        self.produce: list[float] = []
        self.consume: list[float] = []
        self.consume_frontend: list[float] = []  # scenario 3 with fetch_via "frontend"
        self.consume_topic = ""

    def fill(self, records: int) -> None:
        with client_environment(self.keys):
            self.consume_topic = self.bench.topic("3-consume")
            report = self.bench.run(f"{self.name}-fill", workload="produce", topic=self.consume_topic,
                                    create_topic=True, partitions=2, records=records)
        if report["produce"]["failed"]:
            raise RuntimeError(f"{self.name}: filling failed: {report['produce']}")

    def scenario_1(self) -> float:
        with client_environment(self.keys):
            figures = self.bench.produce_once(f"{self.name}-1-produce-100B", duration_s=self.bench.duration_s)
        self.produce.append(figures["records_per_s"])
        return figures["records_per_s"]

    def scenario_3(self, records: int, fetch_via: str = "data_port") -> float:
        name = f"{self.name}-3-consume" + ("-frontend" if fetch_via == "frontend" else "")
        with client_environment(self.keys):
            report = self.bench.run(name, workload="consume", topic=self.consume_topic, records=records,
                                    check=True, fetch_via=fetch_via)
        consume = report["consume"]
        if consume["records"] != records or not report["check"]["ok"]:
            raise RuntimeError(f"{name}: scenario 3 read {consume['records']} of {records}: "
                               f"{report['check']}")
        (self.consume_frontend if fetch_via == "frontend" else self.consume).append(consume["records_per_s"])
        print(f"  {name}: records_per_s {consume['records_per_s']:,.0f}", file=sys.stderr, flush=True)
        return consume["records_per_s"]


def _median_range(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})"


def comparison_rows(plain: Side, curve: Side) -> list[dict]:
    rows = []
    encrypted = statistics.median(curve.consume_frontend) / statistics.median(curve.consume)
    for what, off, on in (("1. one producer, 100 B random values, defaults, max rate (records/s)",
                           plain.produce, curve.produce),
                          ("3. one consumer reading 100 B records of 2 partitions from the start, "
                           "every record checked (records/s); secured: fetch token, data ports "
                           "(sendfile, records in the clear)", plain.consume, curve.consume),
                          ("3, fetch path encrypted: the same read on the secured broker with "
                           'fetch_via = "frontend" (CurveZMQ front-end, no sendfile) (records/s); '
                           f"{encrypted:.2f} of the secured data-port read", plain.consume,
                           curve.consume_frontend)):
        ratios = [b / a for a, b in zip(off, on, strict=True) if a]
        rows.append({"scenario": what, "off": _median_range(off), "curve": _median_range(on),
                     "ratio": round(statistics.median(on) / statistics.median(off), 3),
                     "round_ratios": f"{min(ratios):.2f}–{max(ratios):.2f}"})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| scenario | security off: median (range) | curve: median (range) | curve / off (medians) "
             "| per-round ratios |", "|---|---|---|---|---|"]
    lines += [f"| {r['scenario']} | {r['off']} | {r['curve']} | {r['ratio']:.2f} | {r['round_ratios']} |"
              for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.security", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=DURATION_S, help="seconds per produce run")
    parser.add_argument("--consume-records", type=int, default=CONSUME_RECORDS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.duration <= 0 or args.consume_records < 1:
        parser.error("--rounds, --duration and --consume-records must be positive")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="hpbroker-security-bench-") as tmp:
        root = Path(tmp)
        keys, allowlist = root / "keys", root / "allowlist"
        for name in ("broker", "loader"):
            generate_key_pair(keys, name)
            allow_key(keys / f"{name}.key", allowlist)
        (root / "plain").mkdir()
        (root / "curve").mkdir()
        security = ClientSecurity.from_files(keys / "loader.key_secret", keys / "broker.key")
        with running_broker(root / "plain") as plain_port, \
                running_broker(root / "curve", config_toml=secured_config(keys, allowlist),
                               security=security) as curve_port:
            plain = Side("off", Bench(root / "plain", f"127.0.0.1:{plain_port}", 1, args.duration), None)
            curve = Side("curve", Bench(root / "curve", f"127.0.0.1:{curve_port}", 1, args.duration), keys)
            for side in (plain, curve):
                side.fill(args.consume_records)
            reads = [(plain, "data_port"), (curve, "data_port"), (curve, "frontend")]
            for round_number in range(args.rounds):
                order = (plain, curve) if round_number % 2 == 0 else (curve, plain)
                for side in order:
                    side.scenario_1()
                shift = round_number % len(reads)
                for side, fetch_via in reads[shift:] + reads[:shift]:
                    side.scenario_3(args.consume_records, fetch_via)
    rows = comparison_rows(plain, curve)
    text = (f"Machine: {machine()}. {args.rounds} rounds: scenario 1 on each side once per round in "
            f"alternating order, the three scenario 3 reads in an order rotating from round to round; "
            f"{args.duration:g} s per produce run, {args.consume_records:,} records per consume run; "
            f"{time.time() - started:.0f} s in all.\n\n" + table(rows) + "\n")
    (args.out / "security.md").write_text(text)
    with open(args.out / "security.json", "w") as f:
        json.dump({"machine": machine(), "started_at": started, "rounds": args.rounds, "rows": rows,
                   "produce": {"off": plain.produce, "curve": curve.produce},
                   "consume": {"off": plain.consume, "curve": curve.consume,
                               "curve_frontend": curve.consume_frontend}}, f, indent=1)
        f.write("\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
