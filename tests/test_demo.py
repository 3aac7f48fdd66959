"""``make demo`` (examples/demo.py) runs its whole tour: stack up, topic, loadgen, the Spark audit
with every window in order, metrics, stack down."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.zookeeper]

ROOT = Path(__file__).resolve().parents[1]


def test_the_demo_runs_every_step_and_the_audit_matches(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--rate", "20000",
                             "--duration", "2"], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "stack up" in output and "check: OK" in output, output[-4000:]
    assert "audit OK" in output and " mismatched" in output, output[-4000:]
    assert "hpbroker_produced_records_total" in output, output[-4000:]
    assert (tmp_path / "demo-output" / "loadgen.html").is_file()
    assert list((tmp_path / "demo-output" / "audit").glob("*.csv"))
