"""Topic ids (KIP-516) and the ownership of a replicated topic's node, against a real ZooKeeper:
a replicated topic created through a broker gets a random ``topic_id`` (another one when the same
name is created again; nodes without one keep their bytes), and no broker's unreplicated topic of
the same name ever overwrites or removes a replicated topic's node."""

from __future__ import annotations

import json
import logging
import re

import pytest
from harness import wait_until
from test_controller import PATHS, FakeBrokers

from hpbroker.coord.broker_replication import BrokerReplication, Done
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.registry import TopicRegistration, TopicRegistry, decode_topic, encode_topic

REPLICATED = TopicRegistration("orders", 2, {"min_insync_replicas": 2}, created_by=1,
                               replicas={0: (1, 2, 0), 1: (2, 0, 1)},
                               topic_id="0123456789abcdef0123456789abcdef")


# --- encoding ---------------------------------------------------------------------------------------

def test_topic_id_is_written_and_read_back():
    document = json.loads(encode_topic(REPLICATED))
    assert document["topic_id"] == "0123456789abcdef0123456789abcdef"
    assert decode_topic("orders", encode_topic(REPLICATED)) == REPLICATED


def test_a_node_without_topic_id_keeps_its_bytes_and_reads_as_an_empty_id():
    legacy = TopicRegistration("orders", 1, {}, created_by=1, replicas={0: (1, 2)})
    assert encode_topic(legacy) == (b'{"config":{},"created_by":1,"partitions":1,"replicas":{"0":[1,2]},'
                                    b'"version":1}')
    assert decode_topic("orders", encode_topic(legacy)).topic_id == ""


def test_topics_differing_only_in_their_id_are_different_topics():
    import dataclasses

    assert dataclasses.replace(REPLICATED, topic_id="ff" * 16) != REPLICATED


def test_a_topic_id_that_is_not_a_string_is_refused():
    from hpbroker.errors import CoordinationError

    document = {"version": 1, "partitions": 1, "config": {}, "created_by": 1, "replicas": {"0": [1]},
                "topic_id": 7}
    with pytest.raises(CoordinationError, match="topic 'orders' metadata"):
        decode_topic("orders", json.dumps(document).encode())


# --- the registry's rules -----------------------------------------------------------------------------

needs_zookeeper = pytest.mark.zookeeper


@needs_zookeeper
def test_an_unreplicated_topic_never_overwrites_a_replicated_node(zk, caplog):
    topics = TopicRegistry(zk)
    assert topics.publish(REPLICATED)
    same_name = TopicRegistration("orders", 2, {"retention_ms": 1000}, created_by=0)
    with caplog.at_level(logging.WARNING, logger="hpbroker.coord.registry"):
        assert topics.publish(same_name) is False
    assert topics.get("orders") == REPLICATED
    assert "not publishing unreplicated topic orders of broker 0" in caplog.text
    # another partition count changes nothing either (and raises nothing)
    assert topics.publish(TopicRegistration("orders", 5, {}, created_by=1)) is False
    assert topics.get("orders") == REPLICATED


@needs_zookeeper
def test_a_replicated_node_is_never_removed_on_behalf_of_a_broker(zk, caplog):
    topics = TopicRegistry(zk)
    topics.publish(REPLICATED)
    zk.client.create(ZkPaths().partition_state("orders", 0), b"{}", makepath=True)
    with caplog.at_level(logging.WARNING, logger="hpbroker.coord.registry"):
        assert topics.remove("orders", created_by=1) is False  # even the broker that created it
    assert "not removing topic orders for broker 1" in caplog.text
    assert topics.remove("orders", created_by=7) is False
    assert topics.get("orders") == REPLICATED
    assert zk.client.exists(ZkPaths().partition_state("orders", 0)) is not None
    assert topics.remove("orders")  # the cluster-wide delete
    assert topics.get("orders") is None


@needs_zookeeper
def test_an_unreplicated_node_is_still_published_over_and_removed_by_its_broker(zk):
    topics = TopicRegistry(zk)
    assert topics.publish(TopicRegistration("plain", 2, {}, created_by=0))
    assert topics.publish(TopicRegistration("plain", 2, {"retention_ms": 1000}, created_by=0))
    assert topics.get("plain") == TopicRegistration("plain", 2, {"retention_ms": 1000}, created_by=0)
    assert topics.remove("plain", created_by=0)


# --- creation through a broker ------------------------------------------------------------------------

def _done(replication: BrokerReplication, request_id: int) -> Done:
    found: list[Done] = []

    def arrived():
        found.extend(e for e in replication.take_events()
                     if isinstance(e, Done) and e.request_id == request_id)
        return found
    wait_until(arrived, 20, what=f"request {request_id} done")
    return found[0]


@needs_zookeeper
def test_a_topic_created_again_under_the_same_name_gets_another_random_id(zk, agent):
    FakeBrokers(zk).up(1, 2)
    replication = agent(1)
    topics = TopicRegistry(zk, PATHS)
    ids = []
    for round_ in range(2):
        replication.create_topic(2 * round_, "again", 1, 2, {})
        assert _done(replication, 2 * round_).error is None
        created = topics.get("again")
        assert created is not None and re.fullmatch(r"[0-9a-f]{32}", created.topic_id), created
        ids.append(created.topic_id)
        replication.delete_topic(2 * round_ + 1, "again")
        assert _done(replication, 2 * round_ + 1).error is None
    assert ids[0] != ids[1]
