"""Partition states carry the topic id of their topic (absent: unknown, as written before topic
ids).  The controller writes it and every writer keeps it; a broker ignores a state of another
topic id than the topic it holds under that name (a topic deleted and created again that it has
not taken yet), and a leader's ISR proposal never changes another topic's state."""

from __future__ import annotations

import json

import pytest
from harness import wait_until
from test_controller import PATHS, Controllers, FakeBrokers, active, leadership

from hpbroker.coord.partition_state import (
    PartitionState,
    create_states,
    decode_state,
    encode_state,
    read_state,
)
from hpbroker.coord.registry import TopicRegistration, TopicRegistry

OLD, NEW = "a" * 32, "b" * 32


def test_the_topic_id_round_trips_and_is_absent_when_unknown():
    plain = PartitionState(1, 3, (1, 2), 7)
    assert json.loads(encode_state(plain)) == {"version": 1, "leader": 1, "leader_epoch": 3, "isr": [1, 2],
                                               "controller_epoch": 7}
    assert decode_state(encode_state(plain)) == plain and plain.topic_id == ""
    named = PartitionState(1, 3, (1, 2), 7, NEW)
    assert decode_state(encode_state(named)) == named
    assert named.of_other_topic(OLD) and not named.of_other_topic(NEW)
    assert not named.of_other_topic("") and not plain.of_other_topic(OLD)  # unknown: never "other"
    with pytest.raises(ValueError):
        PartitionState(1, 3, (1, 2), 7, 5)


def test_a_broker_ignores_states_of_another_topic_id_than_the_topic_it_holds(tmp_path):
    from hpbroker.broker.config import BrokerConfig
    from hpbroker.broker.topics import Topic
    from hpbroker.coord.cluster import ClusterSnapshot
    from hpbroker.workers.leadership import Leadership

    held = {"t": Topic("t", 1, {}, replicas={0: (1, 2)}, topic_id=OLD)}
    sent: list[dict] = []
    leadership = Leadership(BrokerConfig(data_dir=str(tmp_path), broker_id=1, workers=1), 1,
                            send_control=lambda slot, op, body: sent.append(body) or True,
                            assigned=lambda slot: {("t", 0)}, topic=held.get, is_serving=lambda slot: True,
                            cluster=ClusterSnapshot)
    old = PartitionState(1, 2, (1, 2), 1, OLD)
    leadership.on_state("t", 0, old)
    leadership.sync(0.0)
    assert leadership.state("t", 0) == old and sent[-1]["leader_epoch"] == 2

    # the topic was deleted and created again: the new one's state arrives first
    leadership.on_state("t", 0, PartitionState(2, 0, (2, 1), 1, NEW))
    leadership.sync(1.0)
    assert leadership.state("t", 0) == old and len(sent) == 1, "the old replica took the new topic's role"
    leadership.on_state("t", 0, PartitionState(1, 3, (1,), 1))  # no id: unknown, taken
    assert leadership.state("t", 0).leader_epoch == 3

    # the broker drops the old topic and takes the new one: its states are taken then
    leadership.forget_topic("t")
    held["t"] = Topic("t", 1, {}, replicas={0: (1, 2)}, topic_id=NEW)
    leadership.on_state("t", 0, PartitionState(2, 0, (2, 1), 1, NEW))
    leadership.sync(2.0)
    assert leadership.state("t", 0).topic_id == NEW and sent[-1]["role"] == "follower"


@pytest.fixture
def controllers(sessions):
    made = Controllers(sessions)
    yield made
    for controller, _ in made.made:
        controller.close()


@pytest.mark.zookeeper
def test_the_controller_writes_the_topic_id_and_a_failover_keeps_it(controllers, zk):
    brokers = FakeBrokers(zk)
    brokers.up(0, 1, 2)
    TopicRegistry(zk).publish(TopicRegistration("t", 1, {}, created_by=0, replicas={0: (1, 2, 0)},
                                                topic_id=NEW))
    active(controllers(auto_leader_rebalance=False))
    wait_until(lambda: leadership(zk, "t") == (1, 0, [1, 2, 0]), 20, what="the state created")
    assert read_state(zk, PATHS, "t", 0)[0].topic_id == NEW
    brokers.down(1)
    wait_until(lambda: leadership(zk, "t") == (2, 1, [2, 0]), 20, what="the failover")
    assert read_state(zk, PATHS, "t", 0)[0].topic_id == NEW


@pytest.mark.zookeeper
def test_an_isr_proposal_for_another_topic_id_is_dropped(zk, agent):
    brokers = FakeBrokers(zk)
    brokers.up(1, 2)
    TopicRegistry(zk).publish(TopicRegistration("t", 1, {}, created_by=0, replicas={0: (1, 2)}, topic_id=NEW))
    create_states(zk, PATHS, "t", {0: PartitionState(1, 0, (1,), 0, NEW)})
    replication = agent(1)
    replication.propose_isr("t", 0, 0, (1, 2), (1,), topic_id=OLD)  # the old topic's leader, same epoch
    replication.propose_isr("t", 0, 0, (1,), (1,), topic_id=NEW)  # a no-op: marks the end of the queue
    replication.propose_isr("u", 0, 0, (1,), (1,))
    wait_until(lambda: replication._jobs.empty(), 20, what="the proposals handled")
    assert leadership(zk, "t") == (1, 0, [1])
    replication.propose_isr("t", 0, 0, (1, 2), (1,), topic_id=NEW)
    wait_until(lambda: leadership(zk, "t") == (1, 0, [1, 2]), 20,
               what="the proposal of the topic's own leader")
    assert read_state(zk, PATHS, "t", 0)[0].topic_id == NEW
