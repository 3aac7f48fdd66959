"""Fixtures of the consumer-group tests, loaded by a test module with
``pytest_plugins = ["group_fixtures"]``: one ZooKeeper for the session, a broker registered in it
per module, a session for looking at the registries."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
from group_harness import start_registered_broker

from hpbroker.coord.server import ZooKeeperServer
from hpbroker.coord.session import connect


@pytest.fixture(scope="session")
def group_zookeeper(tmp_path_factory):
    """A real standalone ZooKeeper for the test session."""
    server = ZooKeeperServer(tmp_path_factory.mktemp("group-zookeeper"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass(frozen=True)
class GroupCluster:
    """A broker registered in ZooKeeper under a chroot of its own."""

    zk_connect: str
    port: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def group_cluster(group_zookeeper, tmp_path_factory):
    """A real broker (2 workers) registered in ZooKeeper, for a test module; tests make their own
    topics and groups (``unique_name``)."""
    connect_string = f"{group_zookeeper.connect_string}/groups-{uuid.uuid4().hex[:10]}"
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


