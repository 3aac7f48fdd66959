"""A step of the wall clock delays neither a group commit nor the acknowledgement waiting on it:
the worker's flush deadline is on the monotonic clock, and so is its poll timeout.

The broker runs under libfaketime, which moves the process's wall clock (read from a file at
every call) but not its monotonic clock: as an NTP step, or an operator setting the date, does.
The topic flushes after ``flush_ms`` only (``flush_messages`` is never reached), and one record
is pending when the wall clock steps back an hour."""

from __future__ import annotations

import os
import sys
import time

import pytest
from harness import BrokerProcess, free_ports

from chaos import faketime
from hpbroker.client import Admin, Producer

TOPIC = "steps"
FLUSH_MS = 3000  # long enough to step the clock while the record is pending
STEP_S = -3600

pytestmark = pytest.mark.skipif(faketime.library() is None,
                                reason="needs libfaketime (apt-get install faketime)")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def broker(tmp_path):
    offset_file = tmp_path / "faketime"
    faketime.set_offset(offset_file, 0)
    port = free_ports(2)
    argv = [sys.executable, "-m", "hpbroker.cli", "serve", "--port", str(port), "--fetch-port", str(port + 1),
            "--workers", "1", "--data-dir", str(tmp_path / "data"), "--host", "127.0.0.1"]
    env = {"HPBROKER_HEARTBEAT_INTERVAL_MS": "50", "HPBROKER_WORKER_TIMEOUT_MS": "3000",
           "HPBROKER_GRACEFUL_TIMEOUT_MS": "5000"}
    env = faketime.environment(tmp_path / "site", offset_file, base=env)
    process = BrokerProcess(argv, tmp_path / "broker.log", env)
    try:
        process.wait_for_log(r"all 1 workers serving", timeout_s=30)
        yield process, offset_file, f"127.0.0.1:{port}"
    finally:
        process.stop()


def test_a_record_pending_when_the_wall_clock_steps_back_is_acknowledged_after_flush_ms(broker):
    process, offset_file, bootstrap = broker
    with Admin(bootstrap) as admin:
        admin.create_topic(TOPIC, 1, {"flush_ms": FLUSH_MS, "flush_messages": 1_000_000})
    worker = process.worker_pids()[0]
    with Producer(bootstrap, acks=1, linger_ms=0, request_timeout_ms=60_000, delivery_timeout_ms=120_000,
                  audit_topic=None) as producer:
        producer.send_future(TOPIC, b"warm-up", partition=0).result(30)  # metadata known, connection up
        sent = time.monotonic()
        future = producer.send_future(TOPIC, b"pending at the step", partition=0)
        time.sleep(FLUSH_MS / 3000)  # the record reaches the worker and waits for its flush
        faketime.set_offset(offset_file, STEP_S)
        cpu_before, cpu_from = _cpu_s(worker), time.monotonic()
        try:
            metadata = future.result(FLUSH_MS / 1000 + 15)  # generous; before the fix: an hour
        except TimeoutError:
            pytest.fail(f"not acknowledged within {FLUSH_MS / 1000 + 15} s of a wall-clock step of {STEP_S}")
        acked_s = time.monotonic() - sent
        cpu_s, window_s = _cpu_s(worker) - cpu_before, time.monotonic() - cpu_from
    assert metadata.offset == 1
    assert acked_s < FLUSH_MS / 1000 + 15
    # The worker slept until the flush deadline instead of spinning on a poll timeout of 0.
    assert cpu_s < 0.5 * window_s + 0.2, f"the worker used {cpu_s:.2f} s of CPU in {window_s:.2f} s"
    assert process.process.poll() is None, process.log()
