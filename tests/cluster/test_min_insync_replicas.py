"""min_insync_replicas on a real cluster: two brokers, a partition on both, the topic's
min_insync_replicas 2.  With the follower's broker gone the controller shrinks the ISR to the
leader alone; the leader then refuses acks=all writes at once with error 24 (nothing appended),
and still takes acks=1 writes.  Once the follower is back and in the ISR again, acks=all is
answered, and the follower holds the very bytes of the leader, the acks=1 records included."""

from __future__ import annotations

import time

import pytest
from harness import wait_until

from hpbroker import protocol, records
from hpbroker.errors import NotEnoughReplicasError, NotLeaderOrFollowerError

pytestmark = pytest.mark.zookeeper

TOPIC = "guarded"


def make_batch(tag: str, count: int = 3) -> bytes:
    """A batch of ``count`` records whose values name the batch and the record."""
    return records.build_batch([f"{tag}/{i}/".encode() for i in range(count)], producer="cluster-tests")


def _produce(cluster, broker_id: int, tag: str, acks: int):
    request = protocol.ProduceRequest(TOPIC, 0, acks=acks, timeout_ms=20_000, payload=make_batch(tag))
    return cluster.client(broker_id).request(request, timeout_s=30)


def test_acks_all_is_refused_below_min_insync_replicas_and_answered_again_once_the_follower_is_back(cluster):
    cluster.start(0)
    cluster.start(1)
    cluster.create_topic(TOPIC, 1, 2, via=0, configs={"min_insync_replicas": "2"})
    partition = cluster.wait_for_leaders(TOPIC, 1, via=0, isr_size=2).partitions[0]
    leader = partition.leader
    follower = next(b for b in (0, 1) if b != leader)

    header, response = _produce(cluster, leader, "before", acks=-1)
    assert (header.error_code, response.base_offset) == (0, 0), header.error_message

    cluster.kill(follower)  # a machine gone: its session expires, the controller shrinks the ISR
    wait_until(lambda: cluster.metadata(leader, TOPIC).partitions[0].isr == [leader], 30, interval_s=0.1,
               what=f"the ISR to shrink to [{leader}]")

    # ... and the leader's worker holds that ISR (its role), so nothing below can be in flight across it.
    cluster.processes[leader].wait_for_log(rf"\[{TOPIC}-0 worker=\d+\] ISR \[[0-9, ]+\] -> \[{leader}\]", 20)

    header, _response = _produce(cluster, leader, "refused", acks=-1)
    assert header.error_code == NotEnoughReplicasError.code == 24, header
    assert header.error_message == (f"{TOPIC}-0: 1 in-sync replicas [{leader}], min_insync_replicas is 2"), \
        header.error_message

    header, response = _produce(cluster, leader, "one", acks=1)
    assert header.error_code == 0, header.error_message
    assert response.base_offset == 3, "a refused acks=all request appended records"  # "before" is 0..2
    header, response = _produce(cluster, leader, "refused-again", acks=-1)
    assert header.error_code == NotEnoughReplicasError.code
    header, response = _produce(cluster, leader, "two", acks=1)
    assert (header.error_code, response.base_offset) == (0, 6)

    cluster.start(follower)
    wait_until(lambda: sorted(cluster.metadata(leader, TOPIC).partitions[0].isr) == [0, 1], 60,
               interval_s=0.1, what="the follower back in the ISR")

    def accepted():
        header, response = _produce(cluster, leader, "after", acks=-1)
        if header.error_code in (NotEnoughReplicasError.code, NotLeaderOrFollowerError.code):
            return None  # the worker has not got the new ISR (or a moved leader's role) yet
        assert header.error_code == 0, header
        return response
    started = time.monotonic()
    response = wait_until(accepted, 20, interval_s=0.1, what="acks=all answered once the ISR is whole")
    assert response.base_offset == 9, "records were lost or a refused request was appended"
    assert time.monotonic() - started < 20

    # The follower holds the leader's bytes: the acks=1 records too, nothing of the refused ones.
    wait_until(lambda: cluster.segment_bytes(follower, TOPIC, 0) == cluster.segment_bytes(leader, TOPIC, 0),
               30, interval_s=0.1, what="the follower's segments equal to the leader's")
    stored = cluster.segment_bytes(leader, TOPIC, 0)
    for tag in ("before", "one", "two", "after"):
        assert f"{tag}/0/".encode() in stored
    assert b"refused" not in stored
