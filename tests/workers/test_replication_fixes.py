"""Replication between real worker processes acting as brokers (``replication_harness``): a leader
takes a topic's new ``min_insync_replicas`` and ``replica_lag_time_max_ms`` from a role of the
same epoch; the replicated high watermark survives a restart in the partition's checkpoint; an
acks=-1 request answered after the ISR shrank below the minimum says its records were
appended; a graceful stop answers the acks=-1 requests still waiting with error 23; error 23
names the leader's front-end port.  And the arbiter's side of the last: the role it sends
carries that port."""

from __future__ import annotations

import os

import pytest
from replication_harness import TOPIC, ReplicaBroker, lead, segment_bytes, wait_until
from worker_harness import fetch_request, make_batch, produce_request, values_of

from hpbroker import protocol
from hpbroker.broker.config import BrokerConfig
from hpbroker.broker.topics import Topic
from hpbroker.coord.cluster import ClusterSnapshot
from hpbroker.coord.partition_state import PartitionState
from hpbroker.coord.registry import BrokerRegistration
from hpbroker.errors import NotEnoughReplicasError, NotLeaderOrFollowerError
from hpbroker.protocol import ApiKey
from hpbroker.workers.leadership import Leadership
from hpbroker.workers.replication import ReplicaRole

HIGH_WATERMARK_CHECKPOINT = "high-watermark-checkpoint"  # docs/FORMAT.md


def checkpointed(broker: ReplicaBroker) -> bytes | None:
    """The content of the broker's high-watermark checkpoint of orders-0 (None: no file)."""
    path = os.path.join(broker.worker.directory(TOPIC, 0), HIGH_WATERMARK_CHECKPOINT)
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def latest(broker: ReplicaBroker) -> int:
    header, response = broker.call(protocol.ListOffsetsRequest(TOPIC, 0, protocol.LATEST_TIMESTAMP))
    assert header.error_code == 0, header
    return response.offset


# --- min_insync_replicas and replica_lag_time_max_ms of a sitting leader ---------------------------

def test_a_role_of_the_same_epoch_changes_the_sitting_leaders_min_insync_replicas_at_once(brokers):
    (leader,) = brokers(1)
    role = {"epoch": 1, "leader": 0, "leader_address": leader.address, "replicas": [0, 1], "isr": [0]}
    assert leader.role(TOPIC, 0, "leader", **role)["error"] is None
    header, response = leader.call(produce_request(TOPIC, 0, make_batch("a"), acks=-1))
    assert (header.error_code, response.base_offset) == (0, 0)  # alone in the ISR, min_insync_replicas 1

    assert leader.role(TOPIC, 0, "leader", **role, min_insync_replicas=2)["error"] is None  # topic altered
    header, _response = leader.call(produce_request(TOPIC, 0, make_batch("b"), acks=-1))
    assert header.error_code == NotEnoughReplicasError.code, header
    assert "1 in-sync replicas [0], min_insync_replicas is 2" in header.error_message

    assert leader.role(TOPIC, 0, "leader", **role, min_insync_replicas=1)["error"] is None
    header, response = leader.call(produce_request(TOPIC, 0, make_batch("c"), acks=-1))
    assert (header.error_code, response.base_offset) == (0, 3)  # the refused one appended nothing


def test_a_role_of_the_same_epoch_changes_the_sitting_leaders_replica_lag_time_max_ms(brokers):
    (leader,) = brokers(1)  # broker 1, its follower, never fetches
    role = {"epoch": 1, "leader": 0, "leader_address": leader.address, "replicas": [0, 1], "isr": [0, 1]}
    assert leader.role(TOPIC, 0, "leader", **role, lag_time_max_ms=600_000)["error"] is None
    assert leader.role(TOPIC, 0, "leader", **role, lag_time_max_ms=500)["error"] is None
    proposal = leader.arbiter.expect_isr_change([0], timeout_s=15)  # not after 600 s
    assert proposal == {"topic": TOPIC, "partition": 0, "leader_epoch": 1, "isr": [0], "from_isr": [0, 1]}


# --- the high watermark checkpoint -------------------------------------------------------------

def test_a_restarted_leader_starts_from_its_checkpointed_high_watermark(brokers):
    leader, follower = brokers(2)
    lead(leader, [follower])
    for tag in ("a", "b"):
        assert leader.call(produce_request(TOPIC, 0, make_batch(tag), acks=-1))[0].error_code == 0
    wait_until(lambda: checkpointed(leader) == b"0\n6\n", timeout_s=20, what="the leader's checkpoint at 6")

    follower.pause()  # it fetches nothing from the restarted leader: only the checkpoint can tell
    leader.kill()
    leader.start()  # a worker respawned: the same epoch again
    ack = leader.role(TOPIC, 0, "leader", epoch=1, leader=0, leader_address=leader.address, replicas=[0, 1],
                      isr=[0, 1])
    assert ack["error"] is None
    assert latest(leader) == 6
    header, response = leader.call(fetch_request(TOPIC, 0, 0))
    assert (header.error_code, response.high_watermark) == (0, 6)
    assert values_of(response.payload) == values_of(make_batch("a")) + values_of(make_batch("b"))
    follower.resume()


def test_a_follower_keeps_the_leaders_high_watermark_and_leads_from_it_after_a_restart(brokers):
    leader, follower = brokers(2)
    lead(leader, [follower])
    for tag in ("a", "b"):
        assert leader.call(produce_request(TOPIC, 0, make_batch(tag), acks=-1))[0].error_code == 0
    wait_until(lambda: checkpointed(follower) == b"0\n6\n", timeout_s=20,
               what="the follower's checkpoint of the leader's high watermark")

    leader.kill()  # gone for good; the controller elects the follower, restarted meanwhile
    follower.kill()
    follower.start()
    ack = follower.role(TOPIC, 0, "leader", epoch=2, leader=1, leader_address=follower.address,
                        replicas=[0, 1], isr=[1, 0])
    assert ack["error"] is None
    assert latest(follower) == 6
    header, response = follower.call(fetch_request(TOPIC, 0, 3))
    assert header.error_code == 0 and values_of(response.payload) == values_of(make_batch("b"))


# --- error 24 after the append -------------------------------------------------------------------

def test_acks_all_answered_after_the_isr_shrank_below_the_minimum_says_the_records_were_appended(brokers):
    leader, follower = brokers(2)
    lead(leader, [follower], min_insync_replicas=2)
    assert leader.call(produce_request(TOPIC, 0, make_batch("a"), acks=-1))[0].error_code == 0
    follower.pause()
    waiting = leader.arbiter.relay(0, produce_request(TOPIC, 0, make_batch("b"), acks=-1, timeout_ms=60_000))
    assert leader.arbiter.nothing_within(0.5)
    ack = leader.role(TOPIC, 0, "leader", epoch=1, leader=0, leader_address=leader.address, replicas=[0, 1],
                      isr=[0], min_insync_replicas=2)  # the controller shrank the ISR
    assert ack["error"] is None
    header, _response = leader.arbiter.response(ApiKey.PRODUCE)
    assert (header.correlation_id, header.error_code) == (waiting, NotEnoughReplicasError.code)
    assert NotEnoughReplicasError.code == 24
    assert header.error_message == (
        f"{TOPIC}-0: the records were appended but the ISR shrank below min_insync_replicas 2 before every "
        f"replica had them (now 1 in-sync replicas [0]); they may be committed later; retry (an idempotent "
        f"producer's retry is not stored twice)")
    header, response = leader.call(produce_request(TOPIC, 0, make_batch("c"), acks=1))
    assert (header.error_code, response.base_offset) == (0, 6)  # b is stored
    follower.resume()


# --- a graceful stop -----------------------------------------------------------------------------

def test_a_graceful_stop_answers_the_waiting_acks_all_requests_with_not_leader(brokers):
    leader, follower = brokers(2)
    lead(leader, [follower])
    assert leader.call(produce_request(TOPIC, 0, make_batch("a"), acks=-1))[0].error_code == 0
    follower.pause()
    waiting = leader.arbiter.relay(0, produce_request(TOPIC, 0, make_batch("b"), acks=-1, timeout_ms=60_000))
    assert leader.arbiter.nothing_within(0.5)
    assert leader.stop() == 0
    header, _response = leader.arbiter.response(ApiKey.PRODUCE)
    assert (header.correlation_id, header.error_code) == (waiting, NotLeaderOrFollowerError.code)
    assert "the broker is stopping; the records may or may not be committed" in header.error_message
    assert checkpointed(leader) == b"0\n3\n"  # the high watermark at the stop, b not below it
    follower.resume()


def test_a_graceful_stop_answers_acks_all_once_flushed_when_the_leader_is_alone_in_the_isr(brokers):
    (leader,) = brokers(1, log={"flush_ms": 60_000, "flush_messages": 1_000_000})
    assert leader.role(TOPIC, 0, "leader", epoch=1, leader=0, leader_address=leader.address, replicas=[0, 1],
                       isr=[0])["error"] is None
    waiting = leader.arbiter.relay(0, produce_request(TOPIC, 0, make_batch("a"), acks=-1, timeout_ms=60_000))
    assert leader.arbiter.nothing_within(0.3), "answered before its flush"
    assert leader.stop() == 0
    header, response = leader.arbiter.response(ApiKey.PRODUCE)
    assert (header.correlation_id, header.error_code, response.base_offset) == (waiting, 0, 0)
    assert checkpointed(leader) == b"0\n3\n"


# --- error 23 names the front-end port -----------------------------------------------------------

def test_a_follower_names_the_leaders_front_end_port(brokers):
    leader, follower = brokers(2)
    lead(leader, [follower], epoch=4, leader_port=9092)
    for request in (produce_request(TOPIC, 0, make_batch("a")), fetch_request(TOPIC, 0, 0),
                    protocol.ListOffsetsRequest(TOPIC, 0, protocol.LATEST_TIMESTAMP)):
        header, _response = follower.call(request)
        assert header.error_code == NotLeaderOrFollowerError.code, header
        assert "the leader is broker 0 at 127.0.0.1:9092 (leader epoch 4)" in header.error_message
        assert str(leader.worker.port) not in header.error_message  # never the data port


def test_a_role_without_the_front_end_port_names_the_leader_without_an_address():
    role = ReplicaRole.from_json({"topic": TOPIC, "partition": 0, "role": "follower", "leader_epoch": 4,
                                  "leader": 2, "leader_address": ["10.0.0.2", 9300], "replicas": [1, 2],
                                  "isr": [2]})
    assert role.leader_text() == "the leader is broker 2 (leader epoch 4)"
    with pytest.raises(ValueError, match="leader_port"):
        ReplicaRole.from_json({"topic": TOPIC, "partition": 0, "role": "follower", "leader_epoch": 4,
                               "leader": 2, "leader_address": ["10.0.0.2", 9300], "replicas": [1, 2],
                               "isr": [2], "leader_port": "9092"})


def test_the_arbiter_sends_followers_the_leaders_front_end_port_and_a_changed_min_insync_replicas(tmp_path):
    sent: list[dict] = []
    topic = Topic(TOPIC, 1, {"min_insync_replicas": 1}, replicas={0: (2, 1)})
    cluster = ClusterSnapshot(brokers={2: BrokerRegistration(2, "10.0.0.2", 9092, (9300,))})
    config = BrokerConfig(data_dir=str(tmp_path), broker_id=1, workers=1)

    def send_control(_slot: int, op: str, body: dict) -> bool:
        sent.append({"op": op, **body})
        return True

    leadership = Leadership(config, 1, send_control=send_control,
                            assigned=lambda slot: {(TOPIC, 0)}, topic=lambda name: topic,
                            is_serving=lambda slot: True, cluster=lambda: cluster)
    leadership.on_state(TOPIC, 0, PartitionState(leader=2, leader_epoch=3, isr=(2, 1), controller_epoch=1))
    leadership.sync(0.0)
    (body,) = sent
    assert (body["role"], body["leader_address"], body["leader_port"]) == ("follower", ["10.0.0.2", 9300],
                                                                            9092)
    role = ReplicaRole.from_json(body)
    assert role.leader_text() == "the leader is broker 2 at 10.0.0.2:9092 (leader epoch 3)"

    topic.config["min_insync_replicas"] = 2  # the topic altered: the same epoch, a new role
    leadership.mark_dirty()
    leadership.sync(0.0)
    assert [b["min_insync_replicas"] for b in sent] == [1, 2]


def test_the_arbiter_sends_a_refused_role_again_after_a_second(tmp_path):
    sent: list[dict] = []
    topic = Topic(TOPIC, 1, {}, replicas={0: (1, 2)})
    config = BrokerConfig(data_dir=str(tmp_path), broker_id=1, workers=1)
    cluster = ClusterSnapshot()
    leadership = Leadership(config, 1, send_control=lambda _slot, op, body: sent.append(body) or True,
                            assigned=lambda slot: {(TOPIC, 0)}, topic=lambda name: topic,
                            is_serving=lambda slot: True, cluster=lambda: cluster)
    leadership.on_state(TOPIC, 0, PartitionState(leader=1, leader_epoch=0, isr=(1, 2), controller_epoch=1))
    leadership.sync(10.0)
    assert len(sent) == 1
    leadership.acked(0, sent[0]["id"], "ValueError: the partition is not open yet", 10.0)
    leadership.sync(10.5)
    assert len(sent) == 1  # not at once: a worker refusing again must not be flooded
    leadership.sync(11.0)
    assert len(sent) == 2 and sent[1]["role"] == "leader" and sent[1]["id"] != sent[0]["id"]
    leadership.acked(0, sent[1]["id"], None, 11.0)
    leadership.sync(20.0)
    assert len(sent) == 2  # taken: nothing more


def test_a_follower_whose_leader_epochs_are_lost_keeps_only_what_is_committed_and_catches_up(brokers):
    """Its leader-epoch file gone, a follower cannot find a divergence by epoch: it cuts its log
    back to the high watermark it knows, then fetches, and ends byte-identical to the leader."""
    from hpbroker.io import LogConfig, PartitionLog
    from hpbroker.io.leader_epochs import LEADER_EPOCH_FILE_NAME

    leader, follower = brokers(2)
    lead(leader, [follower])
    for i in range(3):
        assert leader.call(produce_request(TOPIC, 0, make_batch(f"c{i}"), acks=-1))[0].error_code == 0
    wait_until(lambda: (follower.partition_entry(TOPIC, 0) or {}).get("high_watermark") == 9,
               what="the follower to hear the high watermark 9")
    assert follower.stop() == 0
    assert leader.call(produce_request(TOPIC, 0, make_batch("after"), acks=1))[0].error_code == 0
    directory = follower.worker.directory(TOPIC, 0)
    with PartitionLog(directory, LogConfig()) as log:  # records the leader never had, at 9..11
        log.append(make_batch("stray"), leader_epoch=1)
    os.remove(os.path.join(directory, LEADER_EPOCH_FILE_NAME))
    follower.start()
    ack = follower.role(TOPIC, 0, "follower", epoch=1, leader=0, leader_address=leader.address,
                        replicas=[0, 1], isr=[0, 1])
    assert ack["error"] is None, ack
    wait_until(lambda: segment_bytes(follower.worker.directory(TOPIC, 0))
               == segment_bytes(leader.worker.directory(TOPIC, 0)), what="the follower byte-identical")
