"""Replicated topics on three real brokers: creation spreads each partition's replicas (and its
leaders) over the live brokers, every broker answers metadata with leader, replicas and ISR, and
a broker asked about a partition it holds no replica of names the leader."""

from __future__ import annotations

import pytest
from harness import start_broker, wait_until

from hpbroker import protocol
from hpbroker.errors import InvalidReplicationFactorError, NotLeaderOrFollowerError

pytestmark = pytest.mark.zookeeper


def _create(client, name, partitions, replication_factor, configs=()):
    request = protocol.CreateTopicRequest(name, partitions, list(configs),
                                          replication_factor=replication_factor)
    header, _ = client.request(request, timeout_s=40)
    return header


def test_a_topic_with_three_replicas_gets_every_partition_on_every_broker_and_leaders_spread(cluster):
    for broker_id in (0, 1, 2):
        cluster.start(broker_id)
    header = _create(cluster.client(1), "orders", 6, 3)
    assert header.error_code == 0, header.error_message
    metadata = cluster.wait_for_leaders("orders", 6, via=1, isr_size=3)
    assert all(sorted(p.replicas) == [0, 1, 2] for p in metadata.partitions)
    assert all(p.leader == p.replicas[0] and p.leader_epoch == 0 for p in metadata.partitions)
    leaders = [p.leader for p in metadata.partitions]
    assert sorted(leaders.count(b) for b in (0, 1, 2)) == [2, 2, 2]
    # every broker tells the same story, with the leader's data port
    for via in (0, 2):
        other = cluster.wait_for_leaders("orders", 6, via=via, isr_size=3)
        assert [(p.leader, p.replicas, p.fetch_port) for p in other.partitions] == \
            [(p.leader, p.replicas, p.fetch_port) for p in metadata.partitions]
    data_ports = {cluster.ports[b] + s for b in (0, 1, 2) for s in (1, 2)}
    assert {p.fetch_port for p in metadata.partitions} <= data_ports
    # each broker stores exactly its replicas
    for broker_id in (0, 1, 2):
        data = cluster.tmp_path / f"data-{broker_id}"
        assert sorted(d.name for d in data.iterdir() if d.name.startswith("orders-")) == \
            [f"orders-{p}" for p in range(6)]


def test_a_replication_factor_above_the_live_brokers_is_refused_with_error_26(cluster):
    cluster.start(0)
    cluster.start(1)
    header = _create(cluster.client(0), "too-many", 2, 3)
    assert header.error_code == InvalidReplicationFactorError.code
    assert "3" in header.error_message and "[0, 1]" in header.error_message, header.error_message
    assert cluster.metadata(0, "too-many").error_code == 6


def test_a_standalone_broker_refuses_a_replication_factor_above_one(tmp_path):
    process, port = start_broker(tmp_path / "data", tmp_path / "broker.log")
    from harness import Client

    client = Client(port)
    try:
        header = _create(client, "alone", 1, 2)
        assert header.error_code == InvalidReplicationFactorError.code
        assert "standalone" in header.error_message
        assert _create(client, "fine", 1, 1).error_code == 0
    finally:
        client.close()
        assert process.stop() == 0


def test_a_broker_without_a_replica_names_the_leader(cluster):
    for broker_id in (0, 1, 2):
        cluster.start(broker_id)
    assert _create(cluster.client(0), "single", 1, 1).error_code == 0
    metadata = cluster.wait_for_leaders("single", 1, via=0)
    leader = metadata.partitions[0].leader
    elsewhere = next(b for b in (0, 1, 2) if b != leader)
    header, _ = cluster.client(elsewhere).request(protocol.ProduceRequest("single", 0, 1, payload=b""))
    assert header.error_code == NotLeaderOrFollowerError.code
    assert f"the leader is broker {leader} at 127.0.0.1:{cluster.ports[leader]}" in header.error_message


def test_a_replicated_topic_deleted_through_one_broker_goes_from_every_broker(cluster):
    for broker_id in (0, 1):
        cluster.start(broker_id)
    assert _create(cluster.client(0), "short-lived", 2, 2).error_code == 0
    cluster.wait_for_leaders("short-lived", 2, via=1, isr_size=2)
    header, _ = cluster.client(1).request(protocol.DeleteTopicRequest("short-lived"), timeout_s=30)
    assert header.error_code == 0, header.error_message
    for broker_id in (0, 1):
        wait_until(lambda b=broker_id: cluster.metadata(b, "short-lived").error_code == 6, 20,
                   what=f"broker {broker_id} to forget the topic")
        data = cluster.tmp_path / f"data-{broker_id}"
        wait_until(lambda d=data: not any(p.name.startswith("short-lived-") for p in d.iterdir()), 20,
                   what="the partition directories to go")
