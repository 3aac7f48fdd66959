"""loadgen ``--fetch-via frontend``: its consumers fetch through the broker's ZeroMQ front-end
(the consumer's ``fetch_via``) and read back exactly what its producers sent."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from loadgen.cli import build_parser, config_from_args
from loadgen.config import LoadConfig


def test_an_end_to_end_run_through_the_frontend_checks_every_record(bootstrap):
    result = subprocess.run(
        [sys.executable, "-m", "loadgen", "e2e", "--bootstrap", bootstrap, "--topic", "via-frontend",
         "--create-topic", "--partitions", "2", "--consumers", "2", "--records", "6000", "--rate", "30k",
         "--linger-ms", "0", "--interval", "0.25", "--fetch-via", "frontend", "--json", "--delete-topic"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["produce"]["records"] == report["consume"]["records"] == 6000
    check = report["check"]
    assert check["ok"] and (check["received"], check["missing"], check["duplicated"]) == (6000, 0, 0)


def test_fetch_via_is_parsed_and_checked():
    args = build_parser().parse_args(["consume", "--topic", "t", "--fetch-via", "frontend"])
    assert config_from_args(args).fetch_via == "frontend"
    assert config_from_args(build_parser().parse_args(["consume", "--topic", "t"])).fetch_via == "data_port"
    with pytest.raises(ValueError, match="fetch_via"):
        LoadConfig(workload="consume", topic="t", fetch_via="tcp")
