"""A wall-clock step neither aborts the broker's workers nor hides a hung one: worker liveness is
measured on the monotonic clock.

The broker runs under libfaketime, which moves the process's wall clock (read from a file at
every call) but neither its monotonic clock nor the kernel's file times: as an NTP step, or an
operator setting the date, moves it."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from harness import BrokerProcess, free_ports, pid_alive, wait_until

from chaos import faketime
from hpbroker.client import Admin, Consumer, Producer, TopicPartition

TOPIC = "clock"
WORKERS = 2
TIMEOUT_MS = 1000  # worker_timeout_ms: a step of an hour is 3600 times that

pytestmark = pytest.mark.skipif(faketime.library() is None,
                                reason="needs libfaketime (apt-get install faketime)")


class FakeClock:
    """The broker's wall-clock offset from the host's, in seconds (libfaketime's timestamp file)."""

    def __init__(self, path) -> None:
        self.path = path
        self.set(0)

    def set(self, seconds: int) -> None:
        faketime.set_offset(self.path, seconds)  # libfaketime reads the old offset or the new one


@pytest.fixture
def broker(tmp_path):
    clock = FakeClock(tmp_path / "faketime")
    port = free_ports(WORKERS + 1)
    argv = [sys.executable, "-m", "hpbroker.cli", "serve", "--port", str(port), "--fetch-port", str(port + 1),
            "--workers", str(WORKERS), "--data-dir", str(tmp_path / "data"), "--host", "127.0.0.1"]
    env = {"HPBROKER_HEARTBEAT_INTERVAL_MS": "50", "HPBROKER_WORKER_TIMEOUT_MS": str(TIMEOUT_MS),
           "HPBROKER_GRACEFUL_TIMEOUT_MS": "5000"}
    env = faketime.environment(tmp_path / "site", clock.path, base=env)
    process = BrokerProcess(argv, tmp_path / "broker.log", env)
    try:
        process.wait_for_log(rf"all {WORKERS} workers serving", timeout_s=30)
        yield process, clock, f"127.0.0.1:{port}"
    finally:
        for pid in process.worker_pids().values():  # a worker this test stopped must be able to go
            if pid_alive(pid):
                os.kill(pid, signal.SIGCONT)
        process.stop()


def _produce_and_fetch(bootstrap: str, values: list[bytes]) -> None:
    """Produce ``values`` to every partition (acks=1) and read each back at its offset."""
    acked: dict[tuple[int, int], bytes] = {}
    with Producer(bootstrap, acks=1, request_timeout_ms=5000, delivery_timeout_ms=30_000,
                  audit_topic=None) as producer:
        futures = [(p, v, producer.send_future(TOPIC, v, partition=p))
                   for p in range(WORKERS) for v in values]
        for partition, value, future in futures:
            acked[(partition, future.result(30).offset)] = value
    with Consumer(bootstrap, consumer_timeout_ms=2000) as consumer:
        for partition in range(WORKERS):
            tp = TopicPartition(TOPIC, partition)
            consumer.assign([tp])
            wanted = {o: v for (p, o), v in acked.items() if p == partition}
            consumer.seek(tp, min(wanted))
            read: dict[int, bytes] = {}
            deadline = time.monotonic() + 30
            while not wanted.items() <= read.items() and time.monotonic() < deadline:
                for record in consumer:
                    read[record.offset] = record.value
                    if wanted.items() <= read.items():
                        break
            assert wanted.items() <= read.items(), \
                f"partition {partition}: read {read}, acknowledged {wanted}"


def _settle(broker: BrokerProcess, seconds: float) -> None:
    """Let the arbiter check its workers' heartbeats for ``seconds`` (several worker timeouts)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert broker.process.poll() is None, broker.log()
        time.sleep(0.1)


def test_wall_clock_steps_abort_no_worker_and_a_hung_one_is_still_caught(broker):
    process, clock, bootstrap = broker
    with Admin(bootstrap) as admin:
        admin.create_topic(TOPIC, WORKERS)
    _produce_and_fetch(bootstrap, [b"before %d" % i for i in range(20)])
    pids = process.worker_pids()

    for step, name in ((3600, "forward"), (-3600, "backward")):
        clock.set(step)
        _settle(process, 4 * TIMEOUT_MS / 1000)
        log = process.log()
        assert "no heartbeat" not in log and "SIGABRT" not in log, f"a step {name} aborted a worker:\n{log}"
        assert process.worker_pids() == pids, "no worker was forked again"
        _produce_and_fetch(bootstrap, [b"%s %d" % (name.encode(), i) for i in range(20)])

    # An hour behind now: a worker that hangs is still aborted within its timeout, and replaced.
    hung = pids[1]
    os.kill(hung, signal.SIGSTOP)
    stopped_at = time.monotonic()
    process.wait_for_log(rf"worker slot=1 pid={hung} no heartbeat for [\d.]+ s: SIGABRT", timeout_s=10)
    caught_s = time.monotonic() - stopped_at
    assert caught_s < 3 * TIMEOUT_MS / 1000 + 1, f"the hung worker was caught after {caught_s:.1f} s"
    process.wait_for_log(rf"worker slot=1 pid={hung} still running: SIGKILL", timeout_s=10)
    wait_until(lambda: process.worker_pids()[1] != hung, 10, what="slot 1 forked again")
    process.wait_for_log(rf"worker slot=1 pid={process.worker_pids()[1]} serving", timeout_s=30)
    assert not pid_alive(hung)
    assert process.worker_pids()[0] == pids[0], "the other worker was left alone"
    _produce_and_fetch(bootstrap, [b"after %d" % i for i in range(20)])
