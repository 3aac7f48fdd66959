"""``bench.security`` (``make bench-security``) runs end to end with tiny counts: a broker with
CurveZMQ beside one without, scenarios 1 and 3 on each, scenario 3 on the secured one through the
encrypted front-end too (``fetch_via = "frontend"``), and its table and JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_the_security_bench_compares_curve_with_plain(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bench.security", "--rounds", "2", "--duration", "0.5",
                             "--consume-records", "50000", "--out", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    report = json.loads((tmp_path / "security.json").read_text())
    assert set(report["consume"]) == {"off", "curve", "curve_frontend"}
    for runs in (*report["produce"].values(), *report["consume"].values()):
        assert len(runs) == 2 and all(rate > 0 for rate in runs)
    assert [row["ratio"] > 0 for row in report["rows"]] == [True, True, True]
    text = (tmp_path / "security.md").read_text()
    assert "curve / off" in text and 'fetch_via = "frontend"' in text
