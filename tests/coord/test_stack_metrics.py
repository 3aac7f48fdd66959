"""``hpbroker up --metrics-port N`` passes the port to its broker and says where the metrics are."""

from __future__ import annotations

import signal
import sys

import pytest
from harness import BrokerProcess, free_ports, wait_until
from scrape import scrape

pytestmark = pytest.mark.zookeeper


def test_up_serves_the_broker_metrics_on_the_port_given(tmp_path, zk_connect):
    port = free_ports(4)
    argv = [sys.executable, "-m", "hpbroker.cli", "up", "--data-dir", str(tmp_path / "stack"),
            "--zookeeper", zk_connect, "--port", str(port), "--fetch-port", str(port + 1), "--workers", "2",
            "--host", "127.0.0.1", "--metrics-port", str(port + 3)]
    stack = BrokerProcess(argv, tmp_path / "stack.log", {"HPBROKER_HEARTBEAT_INTERVAL_MS": "50",
                                                           "HPBROKER_GRACEFUL_TIMEOUT_MS": "5000"})
    try:
        stack.wait_for_log(r"Ctrl-C or SIGTERM stops both", timeout_s=40)
        assert f"  metrics    http://127.0.0.1:{port + 3}/metrics (Prometheus)\n" in stack.log()
        wait_until(lambda: scrape(port + 3).value("hpbroker_workers", state="serving") == 2,
                   what="both workers serving")  # the stack is up once the broker registered
        stack.process.send_signal(signal.SIGTERM)
        assert stack.wait_exit(30) == 0, stack.log()
    finally:
        stack.stop()
