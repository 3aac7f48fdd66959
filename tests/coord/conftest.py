"""ZooKeeper for the coordination tests: the session's real server (``zookeeper``, in
tests/conftest.py), and a chroot per test so that tests never see each other's nodes."""

from __future__ import annotations

import pytest
from harness import wait_until
from kazoo.client import KazooClient

from hpbroker.coord.session import Session, connect


@pytest.fixture
def zk_connect(zookeeper, chroot) -> str:
    """The connect string of this test's chroot: ``127.0.0.1:<port>/test-...``."""
    return zookeeper.connect_string + chroot


@pytest.fixture
def sessions(zk_connect):
    """``open()`` -> a started Session in this test's chroot; all closed at the end."""
    opened: list[Session] = []

    def open_session(**options) -> Session:
        session = connect(zk_connect, **{"session_timeout_s": 5.0, **options})
        opened.append(session)
        return session

    yield open_session
    for session in opened:
        session.close()


@pytest.fixture
def zk(sessions) -> Session:
    """A session in this test's chroot for looking at what the code under test wrote."""
    return sessions()


@pytest.fixture
def expire_session(zookeeper):
    """``expire(session)``: make ZooKeeper expire ``session`` now, the way a long partition from
    the server would, and wait until kazoo has established a new one.  A second client attaches
    to the same session (id and password) and closes it: the server ends the session, deleting
    its ephemeral nodes, and the first client's next contact is answered "session expired"."""

    def expire(session: Session, timeout_s: float = 10.0) -> int:
        old = session.session_id
        thief = KazooClient(zookeeper.connect_string, client_id=session.client.client_id)
        thief.start(timeout=timeout_s)
        thief.stop()
        thief.close()
        wait_until(lambda: session.session_id not in (None, old) and session.client.connected, timeout_s,
                   what="a new session after the forced expiry")
        return old

    return expire


@pytest.fixture
def agent(sessions):
    """``agent(broker_id)`` -> a started BrokerReplication (a broker's replication work, with its
    controller) on a session of its own, in this test's chroot; all closed at the end."""
    from hpbroker.coord.broker_replication import BrokerReplication
    from hpbroker.coord.paths import ZkPaths

    made = []

    def start(broker_id: int) -> BrokerReplication:
        replication = BrokerReplication(sessions(), ZkPaths(), broker_id, wake=lambda: None,
                                        unclean_leader_election=lambda topic: False,
                                        auto_leader_rebalance=False)
        replication.start()
        made.append(replication)
        return replication

    yield start
    for replication in made:
        replication.close()
