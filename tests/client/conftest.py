"""Client tests run against a real ``hpbroker serve`` on loopback."""

from __future__ import annotations

import itertools

import pytest
from harness import start_broker

from hpbroker.client.connection import BrokerAddress, BrokerConnection


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


@pytest.fixture
def connection(broker):
    """A protocol-level connection to the module's broker (for set-up and checks)."""
    _process, port = broker
    connection = BrokerConnection(BrokerAddress("127.0.0.1", port))
    yield connection
    connection.close()


@pytest.fixture
def bootstrap(broker):
    """The module's broker as a client's ``bootstrap`` string."""
    return f"127.0.0.1:{broker[1]}"


@pytest.fixture
def stand_ins():
    """``make(kind, handler)``: a stand-in broker (``standins``) closed after the test."""
    made = []

    def make(kind, handler):
        made.append(kind(handler))
        return made[-1]

    yield make
    for stand_in in made:
        stand_in.close()
