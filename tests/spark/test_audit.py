"""The audit job against a real broker: loadgen's producers audit clean, then exactly the windows hit
by a real loss (retention), a stored duplicate, records nobody announced and a false event are
flagged.  The second test changes the data the first one audits: they run in file order."""

from __future__ import annotations

import collections
import csv
import json
import runpy
import sys
import time
from pathlib import Path
from unittest import mock

import pyarrow.parquet as pq
import pytest
from harness import wait_until
from topic_data import reference

from hpbroker import protocol
from hpbroker.audit.events import AUDIT_TOPIC, MonitoringEvent, encode_event, window_start
from hpbroker.cli import main as hpbroker_main
from hpbroker.client import Admin, Consumer, Producer, TopicPartition
from hpbroker.client.connection import BrokerConnection, parse_bootstrap
from hpbroker.records import build_batch, decode_records, scan_batches
from hpbroker.spark.audit import AuditConfig, run_audit
from loadgen.config import LoadConfig
from loadgen.runner import run as loadgen_run

pytestmark = pytest.mark.spark

REPO_ROOT = Path(__file__).resolve().parents[2]
NOW_MS = int(time.time() * 1000)
CLICKS_BASE_MS = NOW_MS - NOW_MS % 1000 - 60_000  # five 1-second windows a minute ago


@pytest.fixture(scope="module")
def produced(bootstrap, tmp_path_factory):
    """loadgen (2 producers, 3 partitions, 10 s windows) into ``orders``, and a producer with
    1 s windows into ``clicks``: the records every (topic, producer, window) should hold."""
    truth_path = tmp_path_factory.mktemp("truth") / "truth.json"
    report = loadgen_run(LoadConfig(workload="produce", bootstrap=bootstrap, topic="orders",
                                    create_topic=True, partitions=3, producers=2, records=40_000,
                                    payload="log", compression="lz4", chunk_records=500, window_ms=10_000,
                                    truth_path=str(truth_path), seed=3, progress="off"))
    assert report["produce"]["failed"] == 0 and report["failures"] == []
    expected = collections.Counter()
    for row in json.loads(truth_path.read_text())["windows"]:
        expected[row["topic"], row["producer"], row["window_start_ms"]] += row["records"]
    with Admin(bootstrap) as admin:
        admin.create_topic("clicks", 2)
    with Producer(bootstrap, name="clicker", audit_window_ms=1000) as producer:
        for i in range(500):
            producer.send("clicks", b"click %d" % i, timestamp=CLICKS_BASE_MS + 10 * i)
    for i in range(5):
        expected["clicks", "clicker", CLICKS_BASE_MS + 1000 * i] = 100
    return expected


def test_the_producers_records_match_their_events_window_by_window(spark, bootstrap, produced, tmp_path,
                                                                   capsys):
    out = tmp_path / "windows"
    assert hpbroker_main(["audit", "--bootstrap", bootstrap, "--output", str(out), "--all-windows"]) == 0
    printed = capsys.readouterr().out
    windows = len(produced)
    assert f"audit OK: {windows} windows checked, {windows} matching, 0 mismatched; 40500 records counted, " \
           f"40500 announced (topics: clicks, orders;" in printed
    table = pq.read_table(out).to_pylist()
    assert {(r["topic"], r["producer"], r["window_start_ms"]): r["consumed"] for r in table} == produced
    assert {r["verdict"] for r in table} == {"ok"} and all(r["announced"] == r["consumed"] for r in table)
    assert {r["window_ms"] for r in table if r["topic"] == "clicks"} == {1000}
    assert {r["window_ms"] for r in table if r["topic"] == "orders"} == {10_000}

    recent = run_audit(spark, AuditConfig(bootstrap, grace_ms=10 * 86_400_000))
    assert (recent.windows_checked, recent.open_windows, recent.ok) == (0, windows, True)
    clicks = run_audit(spark, AuditConfig(bootstrap, from_ms=CLICKS_BASE_MS + 1000,
                                          to_ms=CLICKS_BASE_MS + 4000))
    assert (clicks.windows_checked, clicks.records_counted, clicks.ok) == (3, 300, True)

    # The spark-submit script, in this process (spark-submit would start a JVM of its own).
    script = REPO_ROOT / "spark" / "audit_job.py"
    with mock.patch.object(sys, "argv", [str(script), "--bootstrap", bootstrap, "--topic", "orders"]), \
            pytest.raises(SystemExit) as exited:
        runpy.run_path(str(script), run_name="__main__")
    assert exited.value.code == 0
    assert "(topics: orders;" in capsys.readouterr().out


def _duplicate_a_stored_batch(bootstrap: str) -> collections.Counter:
    """Fetch the first batch of orders-0 and produce its records again as a plain batch (no
    producer identity, which an idempotent producer's batch has and a broker would recognise):
    they are stored twice.  Returns how many records that adds per (topic, producer, window)."""
    connection = BrokerConnection(parse_bootstrap(bootstrap)[0])
    try:
        fetched = connection.call(protocol.FetchRequest("orders", 0, 0, max_bytes=1))
        first = scan_batches(fetched.payload)
        records = decode_records(bytes(fetched.payload[:first.sizes[0]]))
        copy = build_batch([r.value for r in records], keys=[r.key for r in records],
                           timestamps=[r.timestamp for r in records],
                           headers=[list(r.headers) for r in records], producer=records[0].producer)
        connection.call(protocol.ProduceRequest("orders", 0, payload=copy))
    finally:
        connection.close()
    added = collections.Counter()
    for record in records:
        added["orders", record.producer, window_start(record.timestamp, 10_000)] += 1
    return added


def _lose_records_to_retention(bootstrap: str) -> collections.Counter:
    """``expiring``: 120 records stamped two hours ago in 1 s windows, then 30 recent ones, all
    announced by their producer; retention (1 h) deletes the old segments.  Returns, per window,
    the records stored minus the records announced (what the audit must find)."""
    with Admin(bootstrap) as admin:
        admin.create_topic("expiring", 1, {"segment_bytes": 1024, "retention_ms": 3_600_000})
    old_ms = NOW_MS - NOW_MS % 1000 - 2 * 3_600_000
    announced = collections.Counter()
    with Producer(bootstrap, name="expirer", audit_window_ms=1000, batch_bytes=1024, linger_ms=0) as producer:
        for i in range(150):
            timestamp = old_ms + 25 * i if i < 120 else NOW_MS - 5_000
            producer.send("expiring", b"expiring record %03d" % i, timestamp=timestamp)
            announced["expiring", "expirer", window_start(timestamp, 1000)] += 1
            if i % 10 == 9:
                producer.flush()
    with Consumer(bootstrap) as consumer:
        tp = TopicPartition("expiring", 0)
        starts = [0]

        def settled() -> bool:  # retention ran (every 100 ms) and deleted all it will
            time.sleep(0.5)
            starts.append(consumer.beginning_offsets([tp])[tp])
            return starts[-1] > 0 and starts[-1] == starts[-2]

        wait_until(settled, timeout_s=20, what="retention")
    stored = collections.Counter(("expiring", row[4], window_start(row[3], 1000))
                                 for row in reference(bootstrap, "expiring").values())
    lost = {key: stored[key] - count for key, count in announced.items() if stored[key] != count}
    assert lost and all(difference < 0 for difference in lost.values())
    return collections.Counter(lost)


def test_the_audit_flags_exactly_the_windows_that_lost_or_gained_records(spark, broker, bootstrap, produced,
                                                                        tmp_path, capsys):
    expected: dict[tuple[str, str, int], tuple[str, int]] = {}
    for key, difference in _lose_records_to_retention(bootstrap).items():
        expected[key] = ("missing", difference)
    for key, added in _duplicate_a_stored_batch(bootstrap).items():
        expected[key] = ("duplicate", added)
    rogue_ms = NOW_MS - 30_000
    connection = BrokerConnection(parse_bootstrap(bootstrap)[0])
    try:  # records no producer announces
        rogue = build_batch([b"rogue %d" % i for i in range(7)], producer="rogue", timestamps=rogue_ms)
        connection.call(protocol.ProduceRequest("orders", 1, payload=rogue))
    finally:
        connection.close()
    expected["orders", "rogue", window_start(rogue_ms, 10_000)] = ("unannounced", 7)
    # A false event: the clicker claims 5 records more in its third window than it ever sent.  It
    # is stored twice under one number, as an event sent again after an unknown outcome would be:
    # counted once.
    with Producer(bootstrap, name="clicker", audit_topic=None) as impostor:
        event = MonitoringEvent("clicker", "clicks", CLICKS_BASE_MS + 2000, 1000, 5, instance=1, sequence=0)
        key, value = encode_event(event)
        impostor.send(AUDIT_TOPIC, value, key=key)
        impostor.send(AUDIT_TOPIC, value, key=key)
    expected["clicks", "clicker", CLICKS_BASE_MS + 2000] = ("missing", -5)

    out = tmp_path / "mismatches"
    status = hpbroker_main(["audit", "--bootstrap", bootstrap, "--output", str(out), "--format", "csv"])
    printed = capsys.readouterr().out
    assert status == 1, printed
    (part,) = [p for p in out.iterdir() if p.name.endswith(".csv")]
    with open(part, newline="") as f:
        rows = list(csv.DictReader(f))
    assert {(r["topic"], r["producer"], int(r["window_start_ms"])): (r["verdict"], int(r["difference"]))
            for r in rows} == expected
    assert all(int(r["consumed"]) - int(r["announced"]) == int(r["difference"]) for r in rows)
    assert all(int(r["duplicates"]) + int(r["unannounced"]) - int(r["missing"]) == int(r["difference"])
               for r in rows)
    assert {int(r["duplicates"]) for r in rows if r["verdict"] == "duplicate"} == set(
        v[1] for v in expected.values() if v[0] == "duplicate")
    assert printed.splitlines()[0].split() == ["topic", "producer", "window", "start", "window", "ms",
                                               "announced", "consumed", "difference", "duplicates",
                                               "unannounced", "missing", "verdict"]
    assert "audit FAILED: " in printed and f" {len(expected)} mismatched (" in printed
