"""Fixtures of the consumer-group tests, loaded by a test module with
``pytest_plugins = ["group_fixtures"]``: a broker registered in the session's ZooKeeper
(``zookeeper``, tests/conftest.py) per module, a session for looking at the registries."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
from group_harness import start_registered_broker

from hpbroker.coord.session import connect


@dataclass(frozen=True)
class GroupCluster:
    """A broker registered in ZooKeeper under a chroot of its own."""

    zk_connect: str
    port: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def group_cluster(zookeeper, tmp_path_factory):
    """A real broker (2 workers) registered in ZooKeeper, for a test module; tests make their own
    topics and groups (``unique_name``)."""
    connect_string = f"{zookeeper.connect_string}/groups-{uuid.uuid4().hex[:10]}"
    broker, port = start_registered_broker(tmp_path_factory.mktemp("group-broker"), connect_string)
    try:
        yield GroupCluster(connect_string, port)
    finally:
        status = broker.stop()
        assert status == 0, broker.log()


@pytest.fixture
def group_zk(group_cluster):
    """A session in the cluster's chroot for looking at the group registries."""
    session = connect(group_cluster.zk_connect, session_timeout_s=5.0)
    yield session
    session.close()


