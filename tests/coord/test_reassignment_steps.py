"""The reassignment's steps against a real ZooKeeper, without brokers: the last step (the target
replicas alone) is written only while every state is still the one seen caught up."""

from __future__ import annotations

import pytest
from test_controller import PATHS, FakeBrokers, create_topic

from hpbroker.coord.partition_state import PartitionState, create_states, read_state, update_state
from hpbroker.coord.reassignment import Reassignment, parse_targets
from hpbroker.coord.registry import TopicRegistry
from hpbroker.errors import InvalidRequestError

pytestmark = pytest.mark.zookeeper


def _replicas(zk, topic):
    return dict(TopicRegistry(zk).get(topic).replicas)


def test_the_last_step_is_refused_when_a_state_changed_since_it_was_seen(zk):
    FakeBrokers(zk).up(1, 2, 3)
    create_topic(zk, "moving", {0: [1, 2]})
    create_states(zk, PATHS, "moving", {0: PartitionState(1, 0, (1, 2, 3), 0)})
    reassignment = Reassignment(zk, PATHS, "moving", {0: (3, 1)}, progress=lambda line: None)
    assert reassignment._write(lambda current, target: (*target, *(b for b in current if b not in target)))
    assert _replicas(zk, "moving") == {0: (3, 1, 2)}
    seen = reassignment._wait(float("inf"), "caught up", reassignment._caught_up)
    # broker 3 drops out of the ISR before the last step
    state, version = read_state(zk, PATHS, "moving", 0)
    update_state(zk, PATHS, "moving", 0, PartitionState(1, 0, (1, 2), 0), expected_version=version)
    assert not reassignment._write(lambda current, target: target, states=seen)
    assert _replicas(zk, "moving") == {0: (3, 1, 2)}  # the old replicas stay
    seen = {0: read_state(zk, PATHS, "moving", 0)[1]}
    assert reassignment._write(lambda current, target: target, states=seen)
    assert _replicas(zk, "moving") == {0: (3, 1)}


def test_targets_parse_and_bad_ones_are_refused():
    assert parse_targets("0=1,2,3; 1=2,3,1") == {0: (1, 2, 3), 1: (2, 3, 1)}
    for bad in ("", "0", "0=1,x", "0=1;0=2", "x=1"):
        with pytest.raises(InvalidRequestError):
            parse_targets(bad)
