"""TopicAdmin when a replicated topic's replicas move (a reassignment), without processes: the
replicas newly naming this broker open, and one moved away is removed only once the partition's
state has let this broker go (neither leader nor in the ISR)."""

from __future__ import annotations

from hpbroker.broker.topics import TopicStore
from hpbroker.workers.admin import RETRY_INTERVAL_S, TopicAdmin
from hpbroker.workers.ownership import owner_slot

SLOTS = 2
BROKER = 1


def test_a_replica_moved_away_is_removed_only_once_the_state_lets_the_broker_go(tmp_path):
    store = TopicStore(tmp_path)
    sent: list[tuple[int, str, dict]] = []
    held = {"still": True}

    def send(slot, op, body):
        sent.append((slot, op, body))
        return True

    admin = TopicAdmin(store, SLOTS, send_control=send,
                       reply=lambda waiter, error: None, is_serving=lambda slot: True, timeout_s=10,
                       broker_id=BROKER, released=lambda topic, partition: not held["still"])
    for slot in range(SLOTS):
        admin.assign(slot)
        admin.slot_ready(slot)
    admin.create(None, "moving", 1, {}, now=0, replicas={0: (1, 2)})
    slot = owner_slot("moving", 0, SLOTS)
    assert [(s, op) for s, op, _ in sent] == [(slot, "open")]
    assert sent[0][2]["partitions"][0]["replicated"] is True
    sent.clear()

    admin.move_replicas("moving", {0: (2, 3)})  # broker 1 is no longer a replica
    assert sent == []  # the state still names broker 1 (leader or in-sync): its records stay
    admin.expire(RETRY_INTERVAL_S + 1)
    assert sent == []
    held["still"] = False  # the controller moved on
    admin.expire(2 * RETRY_INTERVAL_S + 2)
    removes = [(s, op, body["topic"], body["partitions"]) for s, op, body in sent]
    assert removes == [(slot, "remove", "moving", [0])]
    assert ("moving", 0) not in admin.assigned(slot)

    sent.clear()
    admin.move_replicas("moving", {0: (1, 2)})  # and back: opened again
    assert [(s, op) for s, op, _ in sent] == [(slot, "open")]


def test_a_dropped_leader_kept_on_by_the_controller_leads_with_the_new_replicas_as_followers(tmp_path):
    """Replicas moved from [1, 2] to [3]; 3 is not in sync yet, so the controller keeps 1 leading
    with ISR [1, 2]: broker 1's role must let it lead (and 2 follow) and count 3 as a follower."""
    from hpbroker.broker.config import BrokerConfig
    from hpbroker.broker.topics import Topic
    from hpbroker.coord.cluster import ClusterSnapshot
    from hpbroker.coord.partition_state import PartitionState
    from hpbroker.workers.leadership import Leadership

    topic = Topic("moving", 1, {}, replicas={0: (3,)})
    cluster = ClusterSnapshot()
    leadership = Leadership(BrokerConfig(data_dir=str(tmp_path), broker_id=1, workers=1), 1,
                            send_control=lambda slot, op, body: True, assigned=lambda slot: set(),
                            topic=lambda name: topic, is_serving=lambda slot: True, cluster=lambda: cluster)
    leadership.on_state("moving", 0, PartitionState(leader=1, leader_epoch=4, isr=(1, 2), controller_epoch=1))
    role = leadership.role(topic, 0)
    assert (role.role, role.replicas, role.isr) == ("leader", (3, 1, 2), (1, 2))
    assert not leadership.released("moving", 0)


def test_a_topic_taken_again_after_its_deletion_gets_its_roles_again_even_when_they_look_the_same(tmp_path):
    """Deleted and created again with the same name: the new partitions start awaiting their role;
    one equal to the role the old partitions were sent must still be sent."""
    from hpbroker.broker.config import BrokerConfig
    from hpbroker.broker.topics import Topic
    from hpbroker.coord.cluster import ClusterSnapshot
    from hpbroker.coord.partition_state import PartitionState
    from hpbroker.workers.leadership import Leadership

    sent: list[dict] = []
    topic = Topic("reborn", 1, {}, replicas={0: (1, 2)})
    cluster = ClusterSnapshot()

    def send(slot, op, body):
        sent.append(body)
        return True

    config = BrokerConfig(data_dir=str(tmp_path), broker_id=1, workers=1)
    leadership = Leadership(config, 1, send_control=send, assigned=lambda slot: {("reborn", 0)},
                            topic=lambda name: topic,
                            is_serving=lambda slot: True, cluster=lambda: cluster)
    state = PartitionState(leader=1, leader_epoch=0, isr=(1, 2), controller_epoch=1)
    leadership.on_state("reborn", 0, state)
    leadership.sync(0.0)
    assert len(sent) == 1
    leadership.forget_topic("reborn")  # deleted; then created again: epoch 0, the same leader and ISR
    leadership.on_state("reborn", 0, state)
    leadership.sync(1.0)
    assert len(sent) == 2 and sent[1]["role"] == "leader"
