"""A replicated topic deleted and created again under the same name while one of its replicas'
brokers is away is another topic (topic ids, KIP-516): when that broker returns, it deletes the
old topic's replicas it still stores and takes the new topic's, which it fetches from the new
leaders from offset 0.  Its partitions end byte-identical to the leaders', and the old records are
never served, not even with it leading every partition.

The broker is killed (kill -9) with a long ZooKeeper session, so that its registration outlives it
and the new topic's replicas include it again, as they would once an operator moves replicas back
to it."""

from __future__ import annotations

import pytest
from harness import wait_until

from hpbroker import protocol, records
from hpbroker.client import Consumer, TopicPartition
from hpbroker.errors import NotEnoughReplicasError, NotLeaderOrFollowerError, PartitionNotAvailableError

pytestmark = pytest.mark.zookeeper

TOPIC = "reborn"
PARTITIONS = 3
X = 2  # the broker that is away while the topic is deleted and created again
_RETRIABLE = {NotLeaderOrFollowerError.code, NotEnoughReplicasError.code, PartitionNotAvailableError.code}


def produce(cluster, partition: int, tag: str, *, acks: int, timeout_s: float = 40.0) -> int:
    """Produce one batch of three records to the partition's leader (following it while it
    moves); the batch's base offset."""
    def attempt():
        leader = cluster.metadata(0 if X != 0 else 1, TOPIC).partitions[partition].leader
        if leader < 0 or leader not in cluster.processes:
            return None
        batch = records.build_batch([f"{tag}/{partition}/{i}".encode() for i in range(3)], producer="tests")
        request = protocol.ProduceRequest(TOPIC, partition, acks=acks, timeout_ms=10_000, payload=batch)
        header, response = cluster.client(leader).request(request, timeout_s=20)
        if header.error_code in _RETRIABLE:
            return None
        assert header.error_code == 0, header
        return response.base_offset + 1  # wait_until wants a true value
    what = f"{tag!r} acknowledged on partition {partition}"
    return wait_until(attempt, timeout_s, interval_s=0.1, what=what) - 1


def test_a_broker_back_after_its_topic_was_deleted_and_created_again_drops_the_old_records(cluster):
    cluster.start(0)
    wait_until(lambda: cluster.controller() == 0, 30, what="broker 0 to be the controller")
    cluster.start(1)
    long_session = dict(cluster.settings, zookeeper_session_timeout_ms=120_000)
    cluster.settings, short = long_session, cluster.settings
    cluster.start(X)
    cluster.settings = short

    cluster.create_topic(TOPIC, PARTITIONS, 3, via=0)
    cluster.wait_for_leaders(TOPIC, PARTITIONS, via=0, isr_size=3)
    for partition in range(PARTITIONS):
        for k in range(4):
            produce(cluster, partition, f"old{k}", acks=-1)
    for partition in range(PARTITIONS):
        wait_until(lambda p=partition: b"old3/" in cluster.segment_bytes(X, TOPIC, p), 30, interval_s=0.1,
                   what=f"broker {X} to hold the old records of partition {partition}")

    # Gone without a word; its ZooKeeper registration stays (a long session): still a live broker
    # to the cluster, so the topic created again has replicas on it.
    cluster.kill(X)
    header, _ = cluster.client(0).request(protocol.DeleteTopicRequest(TOPIC), timeout_s=30)
    assert header.error_code == 0, header.error_message
    for broker_id in (0, 1):  # (metadata still names the topic: X's registration lists it)
        data = cluster.tmp_path / f"data-{broker_id}"
        wait_until(lambda d=data: not any(p.name.startswith(f"{TOPIC}-") for p in d.iterdir()), 20,
                   what=f"broker {broker_id} to delete the old topic's partitions")
    cluster.create_topic(TOPIC, PARTITIONS, 3, via=0)
    assigned = cluster.metadata(0, TOPIC).partitions
    assert all(sorted(p.replicas) == [0, 1, 2] for p in assigned), assigned
    led_elsewhere = [p.partition for p in assigned if p.leader != X]
    assert led_elsewhere, assigned
    for partition in led_elsewhere:
        produce(cluster, partition, "new0", acks=1)

    cluster.settings = long_session
    cluster.start(X)
    cluster.settings = short
    for partition in range(PARTITIONS):
        produce(cluster, partition, "new1", acks=-1)  # the partition X leads, if any, serves again too
    cluster.wait_for_leaders(TOPIC, PARTITIONS, via=0, timeout_s=60, isr_size=3)

    def caught_up(partition: int) -> bool:
        leader = cluster.metadata(0, TOPIC).partitions[partition].leader
        mine = cluster.segment_bytes(X, TOPIC, partition)
        return b"new1/" in mine and mine == cluster.segment_bytes(leader, TOPIC, partition)
    for partition in range(PARTITIONS):
        wait_until(lambda p=partition: caught_up(p), 40, interval_s=0.1,
                   what=f"broker {X}'s partition {partition} byte-identical to its leader's")
        assert b"old" not in cluster.segment_bytes(X, TOPIC, partition)

    assert cluster.processes[X].wait_for_log(rf"topic {TOPIC} stored here .* is not the cluster's topic")
    # X alone: it leads every partition, and serves from offset 0 only the new topic's records.
    cluster.stop(0)
    cluster.stop(1)
    wait_until(lambda: all(p.leader == X and p.error_code == 0
                           for p in cluster.metadata(X, TOPIC).partitions), 60, interval_s=0.1,
               what=f"broker {X} leading every partition")
    expected = {p: (6 if p in led_elsewhere else 3) for p in range(PARTITIONS)}
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    with Consumer(cluster.bootstrap(X), reconnect_timeout_ms=30_000) as consumer:
        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)

        def read_all():
            for tp, batch in consumer.poll(200).items():
                got[tp.partition].extend(r.value for r in batch)
            return all(len(got[p]) >= expected[p] for p in range(PARTITIONS))
        wait_until(read_all, 40, interval_s=0, what="every partition read from offset 0 on broker "
                   f"{X}: {({p: len(v) for p, v in got.items()})}")
    for partition in range(PARTITIONS):
        tags = [value.split(b"/")[0] for value in got[partition]]
        assert b"old0" not in tags and all(t.startswith(b"new") for t in tags), (partition, got[partition])
        assert len(got[partition]) == expected[partition], (partition, got[partition])
