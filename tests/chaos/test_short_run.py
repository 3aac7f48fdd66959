"""The short chaos campaign (``python -m chaos --short``, about three minutes): every nemesis at
least once alone and one mixed step, against a real cluster in network namespaces, then the
check.  It must exit 0 (verdict OK: no lost-write, unseen, inconsistent-offsets or poll-skip on
the acks=all topic, every fault verified and healed, the cluster back to full ISR after each
step, the drain complete) and leave its report, its faults and its histories behind.  Skipped,
with the machine's exact refusal, where namespaces, nftables, tmpfs, ZooKeeper or libfaketime
are not available."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.nemesis import NEMESES
from chaos.runner import unavailable

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper]

REPO_ROOT = Path(__file__).resolve().parents[2]
_CLEANUP_S = 180  # what a campaign told to stop gets to kill its clients, brokers, mounts, namespaces


def _run_campaign(argv, timeout_s):
    """``python -m chaos ARGV``; past ``timeout_s`` it is sent SIGTERM and given time to clean up
    (a SIGKILL would leave its namespaces, mounts and clients behind), killed only after that."""
    process = subprocess.Popen([sys.executable, "-m", "chaos", *argv], cwd=REPO_ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = process.communicate(timeout=_CLEANUP_S)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        pytest.fail(f"the campaign ran past {timeout_s} s and was stopped (exit {process.returncode})\n"
                    f"--- stdout:\n{stdout[-6000:]}\n--- stderr:\n{stderr[-4000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_the_short_campaign_hits_every_nemesis_and_finds_no_acks_all_anomaly(tmp_path):
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path / "out"
    run = _run_campaign(["--short", "--out", str(out)], timeout_s=900)
    shown = f"exit {run.returncode}\n--- stdout:\n{run.stdout[-6000:]}\n--- stderr:\n{run.stderr[-4000:]}"
    assert run.returncode == 0, shown
    assert "replay with: python -m chaos --seed" in run.stdout, shown
    for name in ("meta.json", "faults.jsonl", "report.md", "report.json", "throughput.svg"):
        assert (out / name).is_file(), f"{name} missing\n{shown}"
    faults = [json.loads(line) for line in (out / "faults.jsonl").read_text().splitlines()]
    assert {fault["nemesis"] for fault in faults} == set(NEMESES), shown
    assert all(fault["healed"] and fault["end"] >= fault["start"] for fault in faults), shown
    # every fault took effect, and the cluster was back to full ISR after each step
    assert all(fault["evidence"] and not fault["evidence"].startswith("NOT") for fault in faults), faults
    assert all(fault["recovered_s"] is not None for fault in faults), faults
    assert any(fault["mixed"] for fault in faults), "no mixed step ran"
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"]["verdict"] == "OK" and report["verdict"]["problems"] == [], shown
    # the final drain read every partition to its end: it, not the group, decided every loss
    assert all(topic["drained"] == list(range(topic["partitions"]))
               for topic in report["result"]["topics"].values()), report["result"]["topics"]
    acks_all = [topic for topic in report["result"]["topics"].values() if topic["acks"] == "all"]
    assert acks_all and all(topic["verified"] > 0 for topic in acks_all), shown
    assert sorted(p.name for p in (out / "history").iterdir())[0] == "c-chaos-all-0.history"
