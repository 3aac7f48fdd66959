"""BrokerMember: what the arbiter uses to keep its broker's nodes in ZooKeeper in step with its
topic store, off the arbiter's thread."""

from __future__ import annotations

import socket
import threading

import pytest
from harness import wait_until

from hpbroker.coord.member import BrokerMember
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.registry import BrokerRegistration, BrokerRegistry, TopicRegistration, TopicRegistry
from hpbroker.errors import CoordinationError

pytestmark = pytest.mark.zookeeper


def snapshot(**partitions: int) -> tuple[BrokerRegistration, dict[str, TopicRegistration]]:
    """The arbiter's view of broker 0 storing topics of the given partition counts."""
    broker = BrokerRegistration(0, "127.0.0.1", 9092, (9093, 9094),
                                {name: tuple(range(count)) for name, count in partitions.items()})
    topics = {name: TopicRegistration(name, count, {}, created_by=0) for name, count in partitions.items()}
    return broker, topics


@pytest.fixture
def member(zk_connect):
    made = []

    def make() -> BrokerMember:
        made.append(BrokerMember(zk_connect, session_timeout_s=5))
        return made[-1]

    yield make
    for m in made:
        m.close()


def test_start_registers_the_broker_and_publishes_its_topics(member, zk):
    member().start(*snapshot(orders=4, logs=1))
    assert BrokerRegistry(zk).get(0) == snapshot(orders=4, logs=1)[0]
    assert TopicRegistry(zk).topics() == snapshot(orders=4, logs=1)[1]


def test_updates_reach_zookeeper_without_blocking_the_caller(member, zk):
    m = member()
    m.start(*snapshot(orders=4, logs=1))
    m.update(*snapshot(orders=4, metrics=2))  # logs deleted, metrics created
    wait_until(lambda: BrokerRegistry(zk).get(0) == snapshot(orders=4, metrics=2)[0], 10,
               what="the registration to list the new topics")
    wait_until(lambda: TopicRegistry(zk).names() == ["metrics", "orders"], 10, what="logs removed")


def test_start_removes_its_own_stale_topics_and_keeps_other_brokers(member, zk):
    topics = TopicRegistry(zk)
    topics.publish(TopicRegistration("gone", 1, {}, created_by=0))  # deleted while ZooKeeper was away
    topics.publish(TopicRegistration("theirs", 1, {}, created_by=7))
    member().start(*snapshot(orders=1))
    assert topics.names() == ["orders", "theirs"]


def test_registration_comes_back_with_the_latest_snapshot_after_session_expiry(member, zk, expire_session):
    m = member()
    m.start(*snapshot(orders=4))
    m.update(*snapshot(orders=4, logs=1))
    wait_until(lambda: BrokerRegistry(zk).get(0) == snapshot(orders=4, logs=1)[0], 10, what="the update")
    expire_session(m.session)
    m.update(*snapshot(orders=4, logs=1, metrics=3))  # a change while the session is being replaced
    wait_until(lambda: BrokerRegistry(zk).get(0) == snapshot(orders=4, logs=1, metrics=3)[0]
               and zk.client.exists(ZkPaths().broker(0)).ephemeralOwner == m.session.session_id, 10,
               what="the broker registered again, up to date")
    assert TopicRegistry(zk).names() == ["logs", "metrics", "orders"]


def test_close_removes_the_registration_at_once_and_keeps_topics(member, zk):
    m = member()
    m.start(*snapshot(orders=2))
    m.close()
    assert BrokerRegistry(zk).ids() == []
    assert TopicRegistry(zk).names() == ["orders"]


def test_a_broker_id_held_by_another_broker_fails_the_start(member, zk, sessions):
    BrokerRegistry(sessions()).register(BrokerRegistration(0, "10.0.0.9", 9092, (9093,)))
    with pytest.raises(CoordinationError, match="held by session"):
        member().start(*snapshot(orders=1))
    assert TopicRegistry(zk).names() == []  # nothing written before the conflict


def test_start_without_a_server_fails_and_leaves_no_thread():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    before = threading.active_count()
    m = BrokerMember(f"127.0.0.1:{port}", session_timeout_s=5, connect_timeout_s=0.3)
    with pytest.raises(CoordinationError, match="cannot reach ZooKeeper"):
        m.start(*snapshot())
    m.close()
    wait_until(lambda: threading.active_count() <= before, 5, what="kazoo's threads to end")
