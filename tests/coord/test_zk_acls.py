"""ZooKeeper ACLs with the cluster's credentials: every node a broker creates (registration,
topics, partition states, the controller's nodes, producer-id blocks, the chroot) carries the
cluster ACL; a process without the credentials reads what it may and writes nothing."""

from __future__ import annotations

import pytest
from harness import protected_znodes, wait_until
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import make_digest_acl_credential

from hpbroker.coord.controller import Controller
from hpbroker.coord.member import BrokerMember
from hpbroker.coord.partition_state import read_state
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.producer_ids import ZkBlockStore
from hpbroker.coord.registry import BrokerRegistration, TopicRegistration, TopicRegistry
from hpbroker.coord.session import Session
from hpbroker.coord.zk_security import (
    TOKEN_KEY_BYTES,
    ZkCredentials,
    cluster_acl,
    digest_id,
    get_or_create_token_key,
    world_writable,
)

pytestmark = pytest.mark.zookeeper

PATHS = ZkPaths()
CLUSTER = ZkCredentials("hpbroker", "s3cret:with-colon")
DEADLINE_S = 20.0


@pytest.fixture
def plain(zookeeper, chroot, secured):
    """A kazoo client without credentials in this test's chroot (made by a secured session)."""
    secured()
    client = KazooClient(zookeeper.connect_string + chroot)
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def secured(zk_connect):
    """``open()`` -> a started Session with the cluster's credentials; all closed at the end."""
    opened: list[Session] = []

    def open_session(**options) -> Session:
        session = Session(zk_connect, session_timeout_s=5.0, credentials=CLUSTER, **options).start()
        opened.append(session)
        return session

    yield open_session
    for session in opened:
        session.close()


def test_digest_id_is_zookeepers():
    assert digest_id("hpbroker", "pw") == make_digest_acl_credential("hpbroker", "pw")
    assert CLUSTER.id == make_digest_acl_credential(CLUSTER.user, CLUSTER.password)
    assert "s3cret" not in repr(CLUSTER)


def test_every_node_a_broker_creates_carries_the_cluster_acl(zookeeper, zk_connect, chroot, secured,
                                                              plain):
    member = BrokerMember(zk_connect, session_timeout_s=5, credentials=CLUSTER)
    replicated = TopicRegistration("orders", 2, {}, created_by=0, replicas={0: (0,), 1: (0,)})
    broker = BrokerRegistration(0, "127.0.0.1", 9092, (9093,), {"orders": (0, 1), "logs": (0,)})
    member.start(broker, {"orders": replicated, "logs": TopicRegistration("logs", 1, {}, created_by=0)})
    controller = Controller(member.session, PATHS, 0)
    try:
        controller.start()
        wait_until(lambda: controller.is_active, DEADLINE_S, what="the controller to be elected")
        wait_until(lambda: all(read_state(member.session, PATHS, "orders", p) for p in (0, 1)), DEADLINE_S,
                   what="the partition states to be created")
        ZkBlockStore(member.session.client, PATHS.producer_id_block).allocate(0, 1000)
        key = get_or_create_token_key(member.session, PATHS)
        assert len(key) == TOKEN_KEY_BYTES
        assert get_or_create_token_key(secured(), PATHS) == key  # every broker reads the same key

        admin = secured()
        nodes = protected_znodes(admin.client)
        for expected in (PATHS.broker(0), PATHS.topic("orders"), PATHS.topic("logs"), PATHS.controller,
                         PATHS.controller_epoch, PATHS.partition_state("orders", 1),
                         PATHS.producer_id_block, PATHS.token_key):
            assert expected in nodes
        for path, acl in nodes.items():
            if path != PATHS.token_key:
                assert sorted(acl) == sorted(cluster_acl(CLUSTER)), path
        # the chroot itself, seen from outside it
        outside = KazooClient(zookeeper.connect_string, auth_data=[CLUSTER.auth_data])
        outside.start(timeout=10)
        try:
            assert sorted(outside.get_acls(chroot)[0]) == sorted(cluster_acl(CLUSTER))
        finally:
            outside.stop()
            outside.close()

        # without credentials: read, never write
        assert plain.get(PATHS.topic("orders"))[0]
        for attempt in (lambda: plain.set(PATHS.topic("orders"), b"{}"),
                        lambda: plain.delete(PATHS.topic("logs")),
                        lambda: plain.set(PATHS.broker(0), b"{}"),
                        lambda: plain.create(PATHS.broker(7), b"{}", ephemeral=True),
                        lambda: plain.create(PATHS.topic("mine"), b"{}"),
                        lambda: plain.set(PATHS.partition_state("orders", 0), b"{}"),
                        lambda: plain.set(PATHS.controller_epoch, b"{}"),
                        lambda: plain.set(PATHS.producer_id_block, b"{}"),
                        lambda: plain.create(PATHS.consumers, b"")):
            with pytest.raises(NoAuthError):
                attempt()
        with pytest.raises(NoAuthError):
            plain.get(PATHS.token_key)  # the token key cannot even be read
    finally:
        controller.close()
        member.close()


def test_without_credentials_nodes_stay_world_writable_as_before(sessions):
    session, other = sessions(), sessions()
    TopicRegistry(session).publish(TopicRegistration("logs", 1, {}, created_by=0))
    assert world_writable(other.client.get_acls(PATHS.topic("logs"))[0])
    other.client.set(PATHS.topic("logs"), other.client.get(PATHS.topic("logs"))[0])
