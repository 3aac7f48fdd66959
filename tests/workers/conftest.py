"""Fixtures for the worker tests: a fake arbiter and worker processes (helpers in worker_harness.py)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from worker_harness import FakeArbiter, WorkerProcess


@pytest.fixture
def run_dir():
    """A short directory for the ipc:// socket (its path must stay under ~100 bytes)."""
    path = tempfile.mkdtemp(prefix="hpbw-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def arbiter(run_dir):
    fake = FakeArbiter(run_dir)
    yield fake
    fake.close()


@pytest.fixture
def data_dir(tmp_path) -> str:
    return os.path.join(tmp_path, "data")


@pytest.fixture
def start_worker(arbiter, data_dir):
    """``start_worker(**options)``: a worker process (see WorkerProcess), killed at teardown."""
    workers: list[WorkerProcess] = []

    def start(*, wait_ready: bool = True, **options) -> WorkerProcess:
        worker = WorkerProcess(arbiter, options.pop("data_dir", data_dir), **options)
        workers.append(worker)
        return worker.start(wait_ready=wait_ready)

    yield start
    for worker in workers:
        worker.close()


@pytest.fixture
def brokers(tmp_path):
    """``brokers(n, **config)``: n started replication test brokers 0..n-1
    (``replication_harness.ReplicaBroker``), each serving orders-0; closed at teardown."""
    from replication_harness import TOPIC, ReplicaBroker

    made: list[ReplicaBroker] = []

    def make(count: int, **config) -> list[ReplicaBroker]:
        for broker_id in range(count):
            broker = ReplicaBroker(broker_id, str(tmp_path), partitions=[(TOPIC, 0)], **config)
            made.append(broker)
            broker.start()
        return made[-count:]

    yield make
    for broker in made:
        broker.close()
