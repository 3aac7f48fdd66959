"""The broker and topic registries: their JSON, and their nodes in a real ZooKeeper (ephemeral
brokers that vanish with their session and come back after an expiry, persistent topics), and
watches that re-arm."""

from __future__ import annotations

import json
import queue

import pytest
from harness import wait_until

from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.registry import (
    BrokerRegistration,
    BrokerRegistry,
    TopicRegistration,
    TopicRegistry,
    decode_broker,
    decode_topic,
    encode_broker,
    encode_topic,
)
from hpbroker.errors import CoordinationError

BROKER = BrokerRegistration(0, "127.0.0.1", 9092, (9093, 9094), {"orders": (0, 1, 2, 3)}, timestamp_ms=1234)
TOPIC = TopicRegistration("orders", 4, {"retention_ms": 86_400_000, "flush_fsync": False}, created_by=0)


def test_broker_registration_json_is_the_documented_one():
    assert json.loads(encode_broker(BROKER)) == {
        "version": 1, "broker_id": 0, "host": "127.0.0.1", "port": 9092, "data_ports": [9093, 9094],
        "topics": {"orders": [0, 1, 2, 3]}, "timestamp_ms": 1234}
    assert decode_broker(encode_broker(BROKER)) == BROKER


def test_topic_metadata_json_is_the_documented_one():
    assert json.loads(encode_topic(TOPIC)) == {
        "version": 1, "partitions": 4, "config": {"retention_ms": 86_400_000, "flush_fsync": False},
        "created_by": 0}
    assert decode_topic("orders", encode_topic(TOPIC)) == TOPIC


def test_readers_ignore_unknown_fields_and_refuse_unknown_versions():
    document = json.loads(encode_broker(BROKER))
    assert decode_broker(json.dumps({**document, "rack": "r1"}).encode()) == BROKER
    with pytest.raises(CoordinationError, match="format version 2"):
        decode_broker(json.dumps({**document, "version": 2}).encode())


@pytest.mark.parametrize("data", [b"", b"[]", b'{"version": 1}', b'{"version": 1, "broker_id": 0, "host": 1}',
                                  b"\xff"])
def test_malformed_broker_data_is_a_coordination_error(data):
    with pytest.raises(CoordinationError, match="broker registration"):
        decode_broker(data)


# --- in ZooKeeper ---------------------------------------------------------------------------------

needs_zookeeper = pytest.mark.zookeeper


@needs_zookeeper
def test_registered_broker_is_listed_and_vanishes_with_its_session(sessions, zk):
    owner = sessions()
    BrokerRegistry(owner).register(BROKER)
    BrokerRegistry(owner).register(BrokerRegistration(5, "127.0.0.1", 9192, (9193,)))
    readers = BrokerRegistry(zk)
    assert readers.ids() == [0, 5]
    assert readers.get(0) == BROKER
    assert set(readers.brokers()) == {0, 5}
    owner.close()
    assert readers.ids() == [] and readers.get(0) is None


@needs_zookeeper
def test_broker_is_registered_again_after_its_session_expires(sessions, zk, expire_session):
    owner = sessions()
    registry = BrokerRegistry(owner)
    registry.register(BROKER)
    updated = BrokerRegistration(0, "127.0.0.1", 9092, (9093, 9094), {"orders": (0, 1, 2, 3), "logs": (0,)})
    registry.register(updated)
    expire_session(owner)
    wait_until(lambda: (stat := zk.client.exists(ZkPaths().broker(0))) is not None
               and stat.ephemeralOwner == owner.session_id, 10, what="the broker registered again")
    assert BrokerRegistry(zk).get(0) == updated


@needs_zookeeper
def test_restarted_broker_replaces_its_previous_incarnation_but_not_another_broker(sessions, zk):
    before_restart, after_restart = sessions(), sessions()
    BrokerRegistry(before_restart).register(BROKER)  # as if killed: its session is still alive
    BrokerRegistry(after_restart).register(BROKER)
    assert zk.client.exists(ZkPaths().broker(0)).ephemeralOwner == after_restart.session_id
    impostor = BrokerRegistration(0, "10.0.0.9", 9092, (9093,))
    with pytest.raises(CoordinationError, match="/hpbroker/brokers/ids/0 is held by session"):
        BrokerRegistry(sessions()).register(impostor)


@needs_zookeeper
def test_stray_children_of_the_broker_ids_are_ignored(sessions, zk):
    BrokerRegistry(sessions()).register(BROKER)
    zk.client.create(ZkPaths().broker_ids + "/not-a-broker", b"")
    assert BrokerRegistry(zk).ids() == [0]


@needs_zookeeper
def test_topic_metadata_is_published_overwritten_and_removed(zk):
    topics = TopicRegistry(zk)
    assert topics.names() == [] and topics.get("orders") is None
    assert topics.publish(TOPIC) is True
    assert topics.publish(TOPIC) is False  # already so
    wider = TopicRegistration("orders", 8, {}, created_by=0)
    assert topics.publish(wider) is True
    assert topics.get("orders") == wider
    assert topics.topics() == {"orders": wider}
    assert topics.remove("orders", created_by=1) is False  # another broker's: left alone
    assert topics.remove("orders", created_by=0) is True
    assert topics.remove("orders") is False
    assert topics.names() == []


@needs_zookeeper
def test_topic_metadata_survives_the_session_that_wrote_it(sessions, zk):
    writer = sessions()
    TopicRegistry(writer).publish(TOPIC)
    writer.close()
    assert TopicRegistry(zk).get("orders") == TOPIC


# --- watches --------------------------------------------------------------------------------------

def _next(events: queue.Queue, timeout_s: float = 10.0):
    return events.get(timeout=timeout_s)


@needs_zookeeper
def test_broker_ids_watch_sees_brokers_come_and_go(sessions, zk):
    events: queue.Queue = queue.Queue()
    BrokerRegistry(zk).watch_ids(events.put)
    assert _next(events) == []  # the first call, at once
    first = sessions()
    BrokerRegistry(first).register(BROKER)
    assert _next(events) == [0]
    BrokerRegistry(sessions()).register(BrokerRegistration(3, "127.0.0.1", 9292, (9293,)))
    assert _next(events) == [0, 3]
    first.close()
    assert _next(events) == [3]


@needs_zookeeper
def test_topic_watch_sees_every_change_and_deletion(zk, sessions):
    events: queue.Queue = queue.Queue()
    topics = TopicRegistry(sessions())
    TopicRegistry(zk).watch("orders", events.put)
    assert _next(events) is None
    topics.publish(TOPIC)
    assert _next(events) == TOPIC
    topics.publish(TopicRegistration("orders", 5, {}, 0))
    assert _next(events).partitions == 5
    topics.remove("orders")
    assert _next(events) is None


@needs_zookeeper
def test_topic_names_watch_and_cancel(zk, sessions):
    events: queue.Queue = queue.Queue()
    topics = TopicRegistry(sessions())
    watch = TopicRegistry(zk).watch_names(events.put)
    assert _next(events) == []
    topics.publish(TOPIC)
    assert _next(events) == ["orders"]
    watch.cancel()
    topics.publish(TopicRegistration("logs", 1, {}, 0))
    topics.publish(TopicRegistration("metrics", 1, {}, 0))
    with pytest.raises(queue.Empty):
        events.get(timeout=0.5)


@needs_zookeeper
def test_watches_keep_firing_after_the_watching_session_expires(zk, sessions, expire_session):
    events: queue.Queue = queue.Queue()
    watcher = sessions()
    TopicRegistry(watcher).watch_names(events.put)
    assert _next(events) == []
    expire_session(watcher)
    TopicRegistry(zk).publish(TOPIC)
    wait_until(lambda: events.qsize() and list(events.queue)[-1] == ["orders"], 10,
               what="the re-armed watch to report the new topic")


@needs_zookeeper
def test_a_failing_callback_does_not_stop_the_watch(zk, sessions):
    calls: queue.Queue = queue.Queue()

    def callback(names):
        calls.put(names)
        raise RuntimeError("a bug in the callback")

    TopicRegistry(zk).watch_names(callback)
    assert _next(calls) == []
    TopicRegistry(sessions()).publish(TOPIC)
    assert _next(calls) == ["orders"]
    TopicRegistry(sessions()).remove("orders")
    assert _next(calls) == []
