"""``bench.scaling`` (``make bench-scaling``) runs end to end with tiny counts: a broker per worker
count, a produce run and a consume run that reads back everything produced, and its table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_the_scaling_bench_measures_each_worker_count(tmp_path):
    argv = [sys.executable, "-m", "bench.scaling", "--workers", "1,2", "--partitions", "4",
            "--producers", "2", "--consumers", "2", "--duration", "0.5", "--out", str(tmp_path)]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    report = json.loads((tmp_path / "scaling.json").read_text())
    assert [row["workers"] for row in report["rows"]] == [1, 2]
    for row in report["rows"]:
        assert row["records"] > 0 and row["produce_records_per_s"] > 0 and row["consume_records_per_s"] > 0
    assert "| workers |" in (tmp_path / "scaling.md").read_text()


def test_bad_worker_counts_are_a_usage_error(tmp_path):
    argv = [sys.executable, "-m", "bench.scaling", "--workers", "1,x", "--out", str(tmp_path)]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--workers" in result.stderr
