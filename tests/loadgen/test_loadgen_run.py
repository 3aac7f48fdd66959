"""Short real runs against a real broker: the report's counts, the check, the ground truth."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from loadgen.config import LoadConfig
from loadgen.payload import KeySpec, SizeSpec
from loadgen.runner import LoadgenError, run


@pytest.mark.parametrize("record_size", ["uniform:24:200", "150"])  # lists of values; one array per chunk
def test_e2e_run_consumes_exactly_what_it_sent(bootstrap, tmp_path, record_size):
    truth_path = tmp_path / "truth.json"
    config = LoadConfig(workload="e2e", bootstrap=bootstrap, topic=f"e2e-{record_size.replace(':', '-')}",
                        create_topic=True, partitions=3, producers=2, consumers=2, records=30_000,
                        record_size=SizeSpec.parse(record_size), payload="log",
                        keys=KeySpec.parse("uniform:50"), compression="lz4", linger_ms=1,
                        chunk_records=500, interval_s=0.25, window_ms=1000, truth_path=str(truth_path),
                        report_path=str(tmp_path / "report.json"), plot_path=str(tmp_path / "plot.svg"),
                        progress="off", seed=5)
    report = run(config)
    assert report["failures"] == []
    produce, consume, check = report["produce"], report["consume"], report["check"]
    assert produce["records"] == 30_000 and produce["failed"] == 0
    assert consume["records"] == 30_000 and consume["bytes"] == produce["bytes"]
    assert check["ok"], check
    counts = ("sent", "distinct", "missing", "duplicated", "out_of_order")
    assert [check[name] for name in counts] == [30_000, 30_000, 0, 0, 0]
    assert sorted(row["sent"] for row in check["per_producer"]) == [15_000, 15_000]
    assert sum(c["records"] for c in check["per_partition"].values()) == 30_000
    assert produce["ack_latency_ms"]["count"] > 0 and consume["e2e_latency_ms"]["count"] == 30_000
    truth = json.loads(truth_path.read_text())
    assert truth["total_records"] == 30_000 and truth["total_bytes"] == produce["bytes"]
    for producer in truth["producers"]:
        windows = [w for w in truth["windows"] if w["producer"] == producer["producer"]]
        assert sum(w["records"] for w in windows) == producer["records"] == 15_000
        assert all(w["window_start_ms"] % 1000 == 0 and w["topic"] == config.topic for w in windows)
    assert json.loads((tmp_path / "report.json").read_text())["run_id"] == report["run_id"]
    assert (tmp_path / "plot.svg").read_text().startswith("<svg")


def test_produce_then_consume_until_the_end_checks_the_earlier_run(bootstrap, tmp_path):
    common = {"bootstrap": bootstrap, "topic": "later", "progress": "off", "interval_s": 0.25}
    produced = run(LoadConfig(workload="produce", create_topic=True, partitions=2, records=8_000, rate=40_000,
                              truth_path=str(tmp_path / "truth.csv"), **common))
    assert produced["produce"]["records"] == 8_000 and "consume" not in produced
    with open(tmp_path / "truth.csv", newline="") as f:
        assert sum(int(row["records"]) for row in csv.DictReader(f)) == 8_000
    consumed = run(LoadConfig(workload="consume", until_end=True, consumers=2, **common))
    check = consumed["check"]
    assert consumed["consume"]["records"] == 8_000
    assert check["ok"] and (check["received"], check["missing"], check["duplicated"]) == (8_000, 0, 0)


def test_command_line_run_prints_json_and_exits_zero(bootstrap):
    result = subprocess.run(
        [sys.executable, "-m", "loadgen", "e2e", "--bootstrap", bootstrap, "--topic", "cli", "--create-topic",
         "--records", "3000", "--rate", "20k", "--linger-ms", "0", "--interval", "0.25", "--json",
         "--delete-topic"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["produce"]["records"] == report["consume"]["records"] == 3000
    assert report["check"]["ok"]


def test_a_missing_topic_is_a_clear_error(bootstrap):
    with pytest.raises(LoadgenError, match="does not exist"):
        run(LoadConfig(workload="produce", bootstrap=bootstrap, topic="absent", records=10, progress="off"))
