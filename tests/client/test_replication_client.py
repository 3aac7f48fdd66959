"""The client side of replication: acks=all, following a partition's leader when it moves (error
23), retrying while the ISR is too small (error 24), Metadata version 1 (replicas, ISR, leader
epoch) with a version 0 broker still served, CreateTopic version 1.

Real ZeroMQ and TCP sockets on loopback; the brokers are stand-ins (``standins``) whose answers
the test decides, since what is tested is the client's logic: a real leader moving is the
cluster tests' business."""

from __future__ import annotations

import threading
import time

import pytest
from standins import StandInDataPort, StandInFrontEnd

from hpbroker import protocol
from hpbroker.client.admin import Admin
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.client.consumer import Consumer, TopicPartition
from hpbroker.client.metadata import ClusterMetadata, MetadataRefreshes
from hpbroker.client.producer import Producer, ProducerConfig
from hpbroker.errors import (
    InvalidReplicationFactorError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    UnsupportedVersionError,
)
from hpbroker.records import build_batch

TOPIC = "t"


# --- settings ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("given", ["all", "ALL", -1, "-1"])
def test_acks_all_is_minus_one_and_idempotent_by_default(given):
    config = ProducerConfig(acks=given)
    assert config.acks == -1 and config.idempotent
    assert ProducerConfig(acks="all", enable_idempotence=True).idempotent
    assert not ProducerConfig(acks="all", enable_idempotence=False).idempotent


def test_the_default_acks_stay_1_and_bad_acks_are_refused():
    assert ProducerConfig().acks == 1 and ProducerConfig(acks="1").acks == 1
    assert ProducerConfig(acks=0).acks == 0 and not ProducerConfig(acks=0).idempotent
    for bad in (2, -2, True, "none", None, 1.0):
        with pytest.raises(ValueError, match="acks must be 0, 1, -1 or 'all'"):
            ProducerConfig(acks=bad)


# --- metadata -----------------------------------------------------------------------------------------


def cluster_metadata(leader: int, *, ports: dict[int, int], fetch_port: int = 0,
                     leader_epoch: int = 0) -> protocol.MetadataResponse:
    """Topic ``t``, one partition on brokers 1 and 2 (both in the ISR), led by ``leader``."""
    return protocol.MetadataResponse(
        [protocol.BrokerInfo(b, "127.0.0.1", port, fetch_port) for b, port in ports.items()],
        [protocol.TopicMetadata(TOPIC, 0, [protocol.PartitionMetadata(
            0, 0, leader, fetch_port, 0, 0, leader_epoch=leader_epoch, replicas=[2, 1], isr=[2, 1])])])


def test_metadata_keeps_replicas_isr_and_leader_epoch():
    metadata = ClusterMetadata(BrokerConnection.__new__(BrokerConnection))
    metadata.connection.address = BrokerAddress("127.0.0.1", 1)
    metadata.update(cluster_metadata(2, ports={1: 1, 2: 2}, leader_epoch=4))
    (info,) = metadata.partitions(TOPIC)
    assert (info.leader, info.replicas, info.isr, info.leader_epoch) == (2, (2, 1), (2, 1), 4)


def test_an_unreplicated_partition_is_its_leader_alone():
    metadata = ClusterMetadata(BrokerConnection.__new__(BrokerConnection))
    metadata.connection.address = BrokerAddress("127.0.0.1", 1)
    metadata.update(protocol.MetadataResponse([], [protocol.TopicMetadata(TOPIC, 0, [
        protocol.PartitionMetadata(0, 0, 0, 9093), protocol.PartitionMetadata(1, 15, -1, 0)])]))
    served, down = metadata.partitions(TOPIC)
    assert (served.replicas, served.isr, served.leader_epoch) == ((0,), (0,), -1)
    assert (down.replicas, down.isr) == ((), ())


def old_broker(header, request):
    """A broker that serves Metadata version 0 only, as one from before replication answers."""
    if isinstance(request, protocol.MetadataRequest):
        if header.api_version > 0:
            refusal = "MetadataRequest version 1 is not served; versions 0..0 are"
            return protocol.MetadataResponse(), UnsupportedVersionError.code, refusal, 0
        return protocol.MetadataResponse(
            [protocol.BrokerInfo(0, "127.0.0.1", 1, 9093)],
            [protocol.TopicMetadata(TOPIC, 0, [protocol.PartitionMetadata(0, 0, 0, 9093, 0, 5)])]), 0, "", 0
    raise AssertionError(f"unexpected {request}")


def test_a_version_0_broker_is_asked_again_in_version_0_and_from_then_on(stand_ins):
    front = stand_ins(StandInFrontEnd, old_broker)
    connection = BrokerConnection(BrokerAddress("127.0.0.1", front.port))
    try:
        metadata = ClusterMetadata(connection, timeout_s=5)
        (info,) = metadata.partitions(TOPIC)
        assert (info.leader, info.replicas, info.isr, info.high_watermark) == (0, (0,), (0,), 5)
        ClusterMetadata(connection, timeout_s=5).partitions(TOPIC, refresh=True)  # another user of it
        refreshes = MetadataRefreshes(ClusterMetadata(connection, timeout_s=5), timeout_s=5)  # the consumer's
        refreshes.want(TOPIC, time.monotonic())
        settled = {}
        deadline = time.monotonic() + 10
        while TOPIC not in settled and time.monotonic() < deadline:
            settled.update(refreshes.take(time.monotonic()))
            time.sleep(0.01)
        assert settled == {TOPIC: None}
    finally:
        connection.close()
    assert [h.api_version for h, _ in front.of_type(protocol.MetadataRequest)] == [1, 0, 0, 0]


def test_the_consumer_reads_from_a_version_0_broker(stand_ins):
    """MetadataRefreshes (the consumer's fetch loop) falls back too, on a fresh connection."""
    data = stand_ins(StandInDataPort, lambda header, request: (protocol.FetchResponse(
        1, 0, payload=build_batch([b"x"], base_offset=0)), 0, ""))

    def front_end(header, request):
        body, code, text, version = old_broker(header, request)
        for topic in body.topics:
            topic.partitions[0].fetch_port = data.port
            topic.partitions[0].high_watermark = 1
        return body, code, text, version

    front = stand_ins(StandInFrontEnd, front_end)
    with Consumer(f"127.0.0.1:{front.port}", reconnect_timeout_ms=10_000) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        consumer.seek(TopicPartition(TOPIC, 0), 0)
        records = poll_records(consumer, 1)
    assert [(r.offset, r.value) for r in records] == [(0, b"x")]
    assert [h.api_version for h, _ in front.of_type(protocol.MetadataRequest)][:2] == [1, 0]


# --- the producer follows the leader ------------------------------------------------------------------


class MovingLeader:
    """Brokers 1 (the bootstrap) and 2: broker 1 leads partition t-0 until it answers a produce
    with error 23; from then on the metadata names broker 2."""

    def __init__(self, stand_ins) -> None:
        self.leader = 1
        self.moved = threading.Event()
        self.second = stand_ins(StandInFrontEnd, self.broker_2)
        self.first = stand_ins(StandInFrontEnd, self.broker_1)

    def ports(self) -> dict[int, int]:
        return {1: self.first.port, 2: self.second.port}

    def broker_1(self, header, request):
        if isinstance(request, protocol.MetadataRequest):
            return cluster_metadata(self.leader, ports=self.ports(), leader_epoch=self.leader), 0, ""
        if isinstance(request, protocol.InitProducerIdRequest):
            return protocol.InitProducerIdResponse(1000, 0), 0, ""
        if isinstance(request, protocol.ProduceRequest):
            self.leader = 2
            self.moved.set()
            return protocol.ProduceResponse(), NotLeaderOrFollowerError.code, \
                f"this broker does not lead {TOPIC}-0; the leader is broker 2 at 127.0.0.1:{self.second.port}"
        raise AssertionError(f"unexpected {request}")

    def broker_2(self, header, request):
        if isinstance(request, protocol.ProduceRequest):
            return protocol.ProduceResponse(base_offset=42, log_start_offset=0), 0, ""
        if isinstance(request, protocol.ListOffsetsRequest):  # the look for an uncertain attempt
            return protocol.ListOffsetsResponse(-1), 0, ""
        raise AssertionError(f"unexpected {request}")


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_produce_refused_as_not_leader_goes_to_the_new_leader(stand_ins, idempotent):
    cluster = MovingLeader(stand_ins)
    with Producer(f"127.0.0.1:{cluster.first.port}", acks="all", enable_idempotence=idempotent,
                  audit_topic=None, linger_ms=0, retry_backoff_ms=10, delivery_timeout_ms=20_000) as producer:
        metadata = producer.send_future(TOPIC, b"value", partition=0).result(20)
    assert (metadata.partition, metadata.offset) == (0, 42)
    (_, refused), = cluster.first.of_type(protocol.ProduceRequest)
    (header, stored), = cluster.second.of_type(protocol.ProduceRequest)
    assert refused.acks == stored.acks == -1
    assert stored.payload == refused.payload  # the same bytes (an idempotent batch: the same sequence)
    assert header.api_version == (1 if idempotent else 0)
    assert len(cluster.first.of_type(protocol.MetadataRequest)) >= 2  # asked again after error 23


def test_acks_all_refused_for_too_few_replicas_is_retried_until_it_goes(stand_ins):
    refusals = []

    def leader(header, request):
        if isinstance(request, protocol.MetadataRequest):
            return cluster_metadata(0, ports={0: 1}), 0, ""
        if isinstance(request, protocol.InitProducerIdRequest):
            return protocol.InitProducerIdResponse(1000, 0), 0, ""
        if len(refusals) < 3:
            refusals.append(request.acks)
            return protocol.ProduceResponse(), NotEnoughReplicasError.code, \
                f"{TOPIC}-0: 1 in-sync replicas [0], min_insync_replicas is 2"
        return protocol.ProduceResponse(base_offset=7, log_start_offset=0), 0, ""

    front = stand_ins(StandInFrontEnd, leader)
    with Producer(f"127.0.0.1:{front.port}", acks="all", audit_topic=None, linger_ms=0,
                  retry_backoff_ms=10, retry_backoff_max_ms=20) as producer:
        assert producer.send_future(TOPIC, b"v", partition=0).result(20).offset == 7
        assert producer.metrics["retries"] == 3
    assert refusals == [-1, -1, -1]


def test_acks_all_fails_with_error_24_once_the_delivery_timeout_passes(stand_ins):
    def leader(header, request):
        if isinstance(request, protocol.MetadataRequest):
            return cluster_metadata(0, ports={0: 1}), 0, ""
        if isinstance(request, protocol.InitProducerIdRequest):
            return protocol.InitProducerIdResponse(1000, 0), 0, ""
        return protocol.ProduceResponse(), NotEnoughReplicasError.code, "t-0: 1 in-sync replicas [0], " \
                                                                       "min_insync_replicas is 2"

    front = stand_ins(StandInFrontEnd, leader)
    with Producer(f"127.0.0.1:{front.port}", acks="all", audit_topic=None, linger_ms=0, retry_backoff_ms=10,
                  retry_backoff_max_ms=50, delivery_timeout_ms=1000, request_timeout_ms=1000) as producer, \
            pytest.raises(NotEnoughReplicasError, match="min_insync_replicas is 2"):
        producer.send_future(TOPIC, b"v", partition=0).result(20)


# --- the consumer follows the leader ------------------------------------------------------------------


def poll_records(consumer: Consumer, count: int) -> list:
    records: list = []
    deadline = time.monotonic() + 20
    while len(records) < count and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=200).values():
            records.extend(batch)
    return records


def test_a_fetch_refused_as_not_leader_goes_on_from_the_same_offset_at_the_new_leader(stand_ins):
    new_leader = stand_ins(StandInDataPort, lambda header, request: (protocol.FetchResponse(
        8, 0, payload=build_batch([b"a", b"b", b"c"], base_offset=5)), 0, ""))
    old_leader = stand_ins(StandInDataPort, lambda header, request: (
        protocol.FetchResponse(), NotLeaderOrFollowerError.code, "this broker does not lead t-0"))
    fetch_ports = {1: old_leader.port, 2: new_leader.port}
    state = {"leader": 1}

    def front_end(header, request):
        leader = state["leader"]
        if old_leader.requests:  # it refused: the metadata names the new leader now
            state["leader"] = leader = 2
        return cluster_metadata(leader, ports={1: 1, 2: 2}, fetch_port=fetch_ports[leader]), 0, ""

    front = stand_ins(StandInFrontEnd, front_end)
    tp = TopicPartition(TOPIC, 0)
    with Consumer(f"127.0.0.1:{front.port}", retry_backoff_ms=10, reconnect_timeout_ms=10_000) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 6)
        records = poll_records(consumer, 2)
    assert [(r.offset, r.value) for r in records] == [(6, b"b"), (7, b"c")]
    assert [request.offset for _, request in old_leader.requests] == [6]
    assert new_leader.requests[0][1].offset == 6


# --- admin ---------------------------------------------------------------------------------------------


def test_create_topic_sends_version_1_with_a_replication_factor_and_version_0_without(stand_ins):
    front = stand_ins(StandInFrontEnd, lambda header, request: (protocol.CreateTopicResponse(), 0, ""))
    with Admin(f"127.0.0.1:{front.port}") as admin:
        admin.create_topic("r3", 2, {"min_insync_replicas": 2}, replication_factor=3)
        admin.create_topic("plain", 1)
        for bad in (0, -1, True, 1 << 15):
            with pytest.raises(InvalidReplicationFactorError, match="must be an integer from 1"):
                admin.create_topic("bad", 1, replication_factor=bad)
    (first_header, first), (second_header, second) = front.of_type(protocol.CreateTopicRequest)
    assert (first_header.api_version, first.name, first.replication_factor) == (1, "r3", 3)
    assert [(c.key, c.value) for c in first.configs] == [("min_insync_replicas", "2")]
    assert (second_header.api_version, second.replication_factor) == (0, -1)


def test_describe_shows_the_leader_replicas_and_isr(stand_ins):
    front = stand_ins(StandInFrontEnd, lambda header, request: (
        cluster_metadata(2, ports={1: 1, 2: 2}, leader_epoch=3), 0, ""))
    with Admin(f"127.0.0.1:{front.port}") as admin:
        (described,) = admin.describe_topics()
        assert described == admin.describe_topic(TOPIC)
    assert described.replication_factor == 2
    (partition,) = described.partitions
    assert (partition.leader, partition.replicas, partition.isr) == (2, (2, 1), (2, 1))
    assert partition.leader_epoch == 3


def test_the_producer_follows_the_leader_when_its_bootstrap_broker_is_gone(stand_ins):
    """Broker 1, the bootstrap broker and the leader, goes away after a first record: the
    metadata is asked of broker 2, which the first answer named, and which leads now."""
    second = stand_ins(StandInFrontEnd, lambda header, request: (
        (cluster_metadata(2, ports=ports, leader_epoch=2), 0, "")
        if isinstance(request, protocol.MetadataRequest)
        else (protocol.ProduceResponse(base_offset=9, log_start_offset=0), 0, "")))

    def broker_1(header, request):
        if isinstance(request, protocol.InitProducerIdRequest):
            return protocol.InitProducerIdResponse(1000, 0), 0, ""
        if isinstance(request, protocol.ProduceRequest):
            return protocol.ProduceResponse(base_offset=8, log_start_offset=0), 0, ""
        return cluster_metadata(1, ports=ports, leader_epoch=1), 0, ""

    first = stand_ins(StandInFrontEnd, broker_1)
    ports = {1: first.port, 2: second.port}
    with Producer(f"127.0.0.1:{first.port}", acks="all", audit_topic=None, linger_ms=0, retry_backoff_ms=10,
                  delivery_timeout_ms=20_000) as producer:
        assert producer.send_future(TOPIC, b"first", partition=0).result(20).offset == 8
        first.close()  # the bootstrap broker is gone
        assert producer.send_future(TOPIC, b"second", partition=0).result(20).offset == 9
    assert len(second.of_type(protocol.ProduceRequest)) == 1
