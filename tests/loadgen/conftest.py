"""loadgen tests run against a real ``hpbroker serve`` on loopback."""

from __future__ import annotations

import pytest
from harness import start_broker


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    """A real broker with 2 workers, one per test module, as a ``bootstrap`` string."""
    root = tmp_path_factory.mktemp("broker")
    process, port = start_broker(root / "data", root / "broker.log")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        assert process.stop() == 0, process.log()
