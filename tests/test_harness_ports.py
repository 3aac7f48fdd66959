"""The test harness's broker start (tests/harness.py): ports it chose but another process took
before the broker bound them make it start the broker again on fresh ones, not fail the test."""

from __future__ import annotations

import socket

import harness
from harness import start_broker


def test_start_broker_takes_fresh_ports_when_one_it_chose_was_taken_meanwhile(tmp_path, monkeypatch):
    real_free_ports = harness.free_ports
    taken = socket.create_server(("127.0.0.1", 0))  # held: the data port of the first range offered
    first = taken.getsockname()[1] - 1
    offered = []

    def free_ports(count):
        offered.append(first if not offered else real_free_ports(count))
        return offered[-1]

    monkeypatch.setattr(harness, "free_ports", free_ports)
    try:
        broker, port = start_broker(tmp_path / "data", tmp_path / "broker.log", workers=1)
        try:
            assert len(offered) == 2 and port == offered[1] != first
            with socket.create_connection(("127.0.0.1", port + 1), timeout=10):
                pass  # its data port
        finally:
            assert broker.stop() == 0, broker.log()
    finally:
        taken.close()
