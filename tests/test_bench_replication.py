"""``bench.replication`` (``make bench-replication``) runs end to end with tiny counts: three
brokers and a ZooKeeper of its own, the produce comparison, a SIGTERM and a kill -9 failover with
the move back, and its table and JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.replication import main

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper]

ROOT = Path(__file__).resolve().parents[1]


def test_the_replication_bench_measures_produce_and_failovers(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bench.replication", "--rounds", "1", "--duration", "0.3",
                             "--max-records", "200000", "--repeat", "1", "--kill-sessions", "2000",
                             "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=400)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    report = json.loads((tmp_path / "replication.json").read_text())
    assert report["failure"] is None
    (cluster,) = report["clusters"]
    assert cluster["zookeeper_session_timeout_ms"] == 2000
    produce = cluster["produce"]
    assert produce["ratio_of_medians"] > 0
    for runs in produce["variants"].values():
        assert [run["records"] for run in runs] and all(run["records"] > 0 for run in runs)
        for run in runs:  # where the time goes: CPU per million records of each process, bytes stored
            assert set(run["cpu_s_per_million"]) == {"clients", "broker 0", "broker 1", "broker 2"}
            assert run["cpu_cores"] > 0 and run["stored_bytes_per_record"] > 0
    assert produce["disk"]["1_writers_mb_per_s"] > 0 and produce["disk"]["3_writers_mb_per_s"] > 0
    assert produce["disk_ceiling"]["ratio"] > 0
    assert set(cluster["failovers"]) == {"sigterm", "kill"}
    for event, (run,) in cluster["failovers"].items():
        assert run["new_leader"] != run["old_leader"], event
        assert 0 < run["elected_s"] <= run["acked_s"] < 90, (event, run)
        assert 0 < run["move_acked_s"] < 90, (event, run)
        assert not run["writer_errors"], (event, run)
    table = (tmp_path / "replication.md").read_text()
    assert "ratio replicated / unreplicated" in table and "kill -9" in table and "SIGTERM" in table
    assert "CPU seconds per million records" in table and "three at once" in table
    assert table in result.stdout


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--repeat", "-1"])
    assert "repetitions >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--kill-sessions", ""])
    assert "at least one session timeout" in capsys.readouterr().err
