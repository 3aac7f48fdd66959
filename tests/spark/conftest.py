"""Spark tests: one local Spark session for the whole test session, real brokers per module.

A Spark session takes seconds to start (a JVM, then Python workers that import hpbroker), so every
test that needs Spark shares :func:`spark`; it starts only when a test asks for it.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import NamedTuple

import pytest
from harness import BrokerProcess, start_broker

# Workers check retention every 100 ms, so a test can watch segments go.
BROKER_ENV = {"HPBROKER_RETENTION_CHECK_INTERVAL_MS": "100"}


@pytest.fixture(scope="session")
def spark():
    """The shared local Spark session (``local[2]``), the hpbroker source registered."""
    from hpbroker.spark import session

    spark = session("local[2]", app_name="hpbroker-tests")
    yield spark
    spark.stop()


class Broker(NamedTuple):
    process: BrokerProcess
    bootstrap: str
    data_dir: Path


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A real broker with 2 workers for the module."""
    root = tmp_path_factory.mktemp("broker")
    process, port = start_broker(root / "data", root / "broker.log", env=BROKER_ENV)
    try:
        yield Broker(process, f"127.0.0.1:{port}", root / "data")
    finally:
        assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def bootstrap(broker):
    return broker.bootstrap


_names = itertools.count()


@pytest.fixture
def topic_name():
    """A fresh topic name per test (brokers are shared by a module)."""
    return f"s{next(_names)}"
