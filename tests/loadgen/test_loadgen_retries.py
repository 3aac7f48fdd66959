"""Retries against a slow flush: with idempotence, loadgen reads back exactly one copy of each
record (duplicates 0) though its producers sent every request again."""

from __future__ import annotations

import json
import subprocess
import sys

from loadgen.report import format_report


def test_retries_against_a_slow_flush_store_one_copy_with_idempotence(bootstrap):
    """A topic that flushes every 3 s and producers whose requests time out after 1 s: requests
    are sent again while their first copy waits for the flush (without idempotence, each retry
    is stored again).  With idempotence on and 5 requests in flight the broker keeps one copy:
    nothing failed, nothing missing or out of order, duplicates 0, though the producers retried."""
    result = subprocess.run(
        [sys.executable, "-m", "loadgen", "e2e", "--bootstrap", bootstrap, "--topic", "slow-flush",
         "--create-topic", "--partitions", "2", "--topic-config", "flush_ms=3000",
         "--topic-config", "flush_messages=1000000", "--producers", "2", "--consumers", "2",
         "--records", "600", "--rate", "300", "--chunk-records", "50", "--linger-ms", "0",
         "--idempotence", "on", "--max-in-flight", "5", "--request-timeout-ms", "1000",
         "--drain-timeout", "60", "--interval", "0.25", "--seed", "11", "--progress", "off", "--json"],
        capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)
    settings, produce, check = report["settings"], report["produce"], report["check"]
    assert (settings["enable_idempotence"], settings["max_in_flight"], settings["request_timeout_ms"]) == (
        True, 5, 1000)
    assert report["failures"] == []
    assert produce["retries"] > 0, "no request timed out: the case did not arise"
    assert (produce["records"], produce["acked"], produce["failed"]) == (600, 600, 0)
    assert report["duplicates"] == check["duplicated"] == 0
    assert (check["received"], check["distinct"], check["missing"], check["out_of_order"]) == (600, 600, 0, 0)
    assert check["ok"] and "duplicates: 0 " in format_report(report)
