"""A topic node's replica assignment: written only for replicated topics (old nodes keep their
bytes), read back strictly, never overwritten by a broker's unreplicated topic of the same name
(tests/coord/test_topic_ids.py)."""

from __future__ import annotations

import json

import pytest

from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.registry import TopicRegistration, TopicRegistry, decode_topic, encode_topic
from hpbroker.errors import CoordinationError

REPLICATED = TopicRegistration("orders", 2, {"min_insync_replicas": 2}, created_by=1,
                               replicas={0: (1, 2, 0), 1: (2, 0, 1)})


def test_unreplicated_topic_node_keeps_its_bytes():
    plain = TopicRegistration("orders", 4, {"retention_ms": 86_400_000}, created_by=0)
    assert encode_topic(plain) == (b'{"config":{"retention_ms":86400000},"created_by":0,"partitions":4,'
                                   b'"version":1}')
    assert plain.replicas == {} and plain.replication_factor == 1 and not plain.replicated
    assert decode_topic("orders", encode_topic(plain)) == plain


def test_replicated_topic_json_is_the_documented_one():
    assert json.loads(encode_topic(REPLICATED)) == {
        "version": 1, "partitions": 2, "config": {"min_insync_replicas": 2}, "created_by": 1,
        "replicas": {"0": [1, 2, 0], "1": [2, 0, 1]}}
    assert decode_topic("orders", encode_topic(REPLICATED)) == REPLICATED
    assert REPLICATED.replication_factor == 3 and REPLICATED.replicated


def test_replicas_given_as_lists_compare_equal_to_tuples():
    assert TopicRegistration("orders", 1, replicas={0: [3, 1]}).replicas == {0: (3, 1)}


def test_replica_assignment_encodes_to_the_same_bytes_whatever_the_mapping_order():
    ordered = TopicRegistration("t", 12, replicas={p: (p % 3, (p + 1) % 3) for p in range(12)})
    reversed_ = TopicRegistration("t", 12, replicas={p: (p % 3, (p + 1) % 3) for p in reversed(range(12))})
    assert encode_topic(ordered) == encode_topic(reversed_)
    assert decode_topic("t", encode_topic(reversed_)) == ordered


@pytest.mark.parametrize("replicas", [
    {"0": [1, 2]},                                   # partition 1 missing
    {"0": [1, 2], "1": [2, 1], "2": [0, 1]},         # a partition too many
    {"0": [1, 2], "1": []},                          # no replica
    {"0": [1, 1], "1": [2, 1]},                      # a broker twice
    {"0": [1, 2], "01": [2, 1]},                     # not a partition number
    {"0": [1, 2], "-1": [2, 1]},
    {"0": [1, 2], "1": [2, "1"]},                    # not a broker id
    {"0": [1, 2], "1": [2, -1]},
    {"0": [1, 2], "1": [2, True]},
    {"0": [1, 2], "1": 2},
    [[1, 2], [2, 1]],                                # not an object
])
def test_bad_replicas_are_refused(replicas):
    document = {"version": 1, "partitions": 2, "config": {}, "created_by": 1, "replicas": replicas}
    with pytest.raises(CoordinationError, match="topic 'orders' metadata"):
        decode_topic("orders", json.dumps(document).encode())


@pytest.mark.parametrize("replicas", [{0: (1,)}, {0: (), 1: ()}, {0: (1, 1), 1: (1, 2)}, {1: (1,), 2: (2,)}])
def test_bad_replicas_are_refused_on_construction(replicas):
    with pytest.raises(ValueError, match="replicas|partition"):
        TopicRegistration("orders", 2, replicas=replicas)


def test_partitions_may_hold_different_numbers_of_replicas_while_a_reassignment_moves_some():
    moving = TopicRegistration("orders", 2, replicas={0: (1, 2, 3), 1: (2, 1)})
    assert decode_topic("orders", encode_topic(moving)) == moving


# --- in ZooKeeper ---------------------------------------------------------------------------------

needs_zookeeper = pytest.mark.zookeeper


@needs_zookeeper
def test_a_registration_without_replicas_leaves_the_assignment_alone(zk):
    topics = TopicRegistry(zk)
    assert topics.publish(REPLICATED)
    assert not topics.publish(TopicRegistration("orders", 2, {"retention_ms": 1000}, created_by=1))
    assert topics.get("orders") == REPLICATED


@needs_zookeeper
def test_new_assignment_replaces_the_old_one(zk):
    topics = TopicRegistry(zk)
    topics.publish(REPLICATED)
    moved = TopicRegistration("orders", 2, REPLICATED.config, 1, {0: (3, 2, 0), 1: (2, 0, 3)})
    assert topics.publish(moved)
    assert topics.get("orders") == moved


@needs_zookeeper
def test_replicated_topic_is_removed_with_its_whole_subtree(zk):
    topics = TopicRegistry(zk)
    topics.publish(REPLICATED)
    zk.client.create(ZkPaths().partition_state("orders", 0), b"{}", makepath=True)
    zk.client.create(ZkPaths().topic_partition("orders", 1), b"", makepath=True)
    assert not topics.remove("orders", created_by=1)  # the cluster's, not a broker's, to remove
    assert topics.remove("orders")
    assert topics.get("orders") is None and not topics.remove("orders")
