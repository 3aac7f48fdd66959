"""Fixtures for the storage tests (helpers live in storage_helpers.py)."""

from __future__ import annotations

import os

import pytest
from storage_helpers import TEST_CONFIG, Clock, DiskEvents

from hpbroker.io import PartitionLog


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def disk_events(monkeypatch):
    """Every write, sync, rename, unlink and mkdir storage makes from now on, in order (the
    native flush jobs' writev and fdatasync included)."""
    events = DiskEvents().install(monkeypatch)
    yield events
    events.uninstall()


@pytest.fixture
def log_dir(tmp_path) -> str:
    return os.path.join(tmp_path, "orders-3")


@pytest.fixture
def open_log(log_dir, clock):
    """``open_log(**config_changes)``: a PartitionLog on ``log_dir``, closed at teardown."""
    opened: list[PartitionLog] = []

    def open_log(**changes) -> PartitionLog:
        log = PartitionLog(log_dir, TEST_CONFIG.replace(**changes), clock=clock, monotonic_clock=clock)
        opened.append(log)
        return log

    yield open_log
    for log in opened:
        log.close()  # idempotent; an offline or abandoned log only releases descriptors
