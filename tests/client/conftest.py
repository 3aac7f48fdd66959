"""Client tests run against a real ``hpbroker serve`` on loopback."""

from __future__ import annotations

import itertools

import pytest
from harness import start_broker


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A real broker with 2 workers, shared by a test module: ``(process, port)``.  Tests create
    their own topics (see ``topic``)."""
    root = tmp_path_factory.mktemp("broker")
    process, port = start_broker(root / "data", root / "broker.log")
    try:
        yield process, port
    finally:
        status = process.stop()
        assert status == 0, process.log()


_topic_names = itertools.count()


@pytest.fixture
def topic_name():
    """A fresh topic name per test (the broker is shared by the module)."""
    return f"t{next(_topic_names)}"
